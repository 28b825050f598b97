/* corral-init: PID 1 of every container sandbox, and the wrapper of each command run in it.
 *
 *   corral-init            PID 1: ignores every signal it can (so nothing inside the
 *                          sandbox can stop it: the kernel drops SIGKILL and SIGSTOP sent
 *                          to a namespace's init from inside), reaps every orphan, never
 *                          exits on its own.
 *   corral-init exec CMD   a command: starts a session of its own (so that the whole tree
 *                          of the command can be signalled by session), then execs CMD.
 *
 * Static, no libc beyond what `gcc -static` links, so it runs in any image.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static _Noreturn void init_main(void) {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL); /* SIGCHLD too: collected with sigwaitinfo */
    for (;;) {
        siginfo_t info;
        if (sigwaitinfo(&all, &info) < 0 && errno != EINTR)
            continue;
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "exec") == 0) {
        setsid();
        execvp(argv[2], &argv[2]);
        fprintf(stderr, "corral-init: cannot run %s: %s\n", argv[2], strerror(errno));
        return errno == ENOENT ? 127 : 126;
    }
    if (argc == 1)
        init_main();
    fprintf(stderr, "usage: corral-init | corral-init exec CMD [ARG...]\n");
    return 2;
}
