/* The n-th Fibonacci number, as a WASI command speaking Corral's convention:
 * reads {"n": N} on stdin, writes {"n": N, "fib": F} on stdout.
 * Build: clang --target=wasm32-wasi -O2 -o fib.wasm fib.c
 * The JSON "parsing" is minimal on purpose: the gateway has already checked the input
 * against the schema, so it only needs to find the number after "n". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    char buf[4096];
    size_t len = fread(buf, 1, sizeof buf - 1, stdin);
    buf[len] = '\0';
    const char *key = strstr(buf, "\"n\"");
    const char *colon = key ? strchr(key, ':') : NULL;
    if (!colon) {
        fprintf(stderr, "fib: no \"n\" in the input\n");
        return 2;
    }
    long n = strtol(colon + 1, NULL, 10);
    unsigned long long a = 0, b = 1;
    for (long i = 0; i < n; i++) {
        unsigned long long next = a + b;
        a = b;
        b = next;
    }
    fprintf(stderr, "fib(%ld) computed\n", n);
    printf("{\"n\": %ld, \"fib\": %llu}\n", n, a);
    return 0;
}
