"""Raw WASI command modules (language ``wasm``): C compiled by clang, and hand-written WAT."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from wasmtime import wat2wasm

from node.fncall.wasm import WasmBackend
from wire.execution import StageStatus

RunModule = Callable[..., Any]

pytestmark = pytest.mark.asyncio(loop_scope="module")

C_HELLO = r"""
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    char in[256];
    size_t n = fread(in, 1, sizeof in - 1, stdin);
    in[n] = 0;
    char data[64] = "none";
    FILE *f = fopen("data.txt", "r");
    if (f) { fgets(data, sizeof data, f); fclose(f); }
    printf("argc=%d argv0=%s stdin=%s data=%s\n", argc, argv[0], in, data);
    fprintf(stderr, "to stderr\n");
    return 0;
}
"""

C_MALLOC_FOREVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
char *volatile sink;  /* keeps clang from eliding the allocations */
int main(void) {
    size_t total = 0;
    for (;;) {
        char *p = malloc(1 << 20);
        if (!p) { fprintf(stderr, "malloc failed after %zu MiB\n", total >> 20); return 2; }
        memset(p, 1, 1 << 20);
        sink = p;
        total += 1 << 20;
    }
}
"""

C_SPIN = r"""
int main(void) { volatile unsigned long i = 0; for (;;) i++; }
"""

C_LEAVE_SOMETHING = r"""
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static void try(const char *what, int ok) { printf("%s=%s ", what, ok ? "ok" : strerror(errno)); }
int main(void) {
    int entries = 0;
    DIR *d = opendir(".");
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) entries++;
    printf("entries=%d ", entries);
    try("create", open("left.txt", O_CREAT | O_WRONLY, 0644) >= 0);
    try("create_abs", open("/work/left.txt", O_CREAT | O_WRONLY, 0644) >= 0);
    try("mkdir", mkdir("left", 0755) == 0);
    try("symlink", symlink("/", "root") == 0);
    char in[64] = {0};
    ssize_t n = read(0, in, sizeof in - 1);
    printf("stdin=%zd:%s\n", n, in);
    return 0;
}
"""

C_WRITE_MUCH = r"""
#include <stdio.h>
#include <string.h>
int main(void) {
    static char line[1000];
    memset(line, 'o', sizeof line - 1);
    for (int i = 0; i < 300; i++) { fputs(line, stdout); fputc('\n', stdout); fflush(stdout); }
    memset(line, 'e', sizeof line - 1);
    for (int i = 0; i < 100; i++) { fputs(line, stderr); fputc('\n', stderr); }
    return 0;
}
"""

C_FLOOD = r"""
#include <stdio.h>
int main(void) { for (;;) { fputs("flood flood flood flood\n", stdout); fflush(stdout); } }
"""

WASI_EXIT = '(import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))'


def wat(body: str) -> bytes:
    return bytes(wat2wasm(f"(module {body})"))


async def test_c_hello(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    module = compile_c(C_HELLO)
    result = await run_module(runtime, module, stdin="ping", files={"data.txt": b"pong"})
    assert result.error is None
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "argc=1 argv0=module.wasm stdin=ping data=pong\n"
    assert result.run.stderr == "to stderr\n"
    assert result.setup_ms > 0 and result.exec_ms > 0


async def test_a_call_without_files_cannot_leave_anything_for_the_next(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    """Calls that write and fetch no files share one read-only empty work dir
    (``HostDir.shared_empty``): every attempt to put something there is refused, so each
    call finds it as empty as the first did, and the call's stdin still arrives."""
    module = compile_c(C_LEAVE_SOMETHING)
    refused = (
        "create=Operation not permitted create_abs=Operation not permitted "
        "mkdir=Operation not permitted symlink=Operation not permitted"
    )
    for stdin, read in (("first", "5:first"), ("", "0:"), ("third", "5:third")):
        result = await run_module(runtime, module, stdin=stdin)
        assert result.run is not None and result.run.ok, result
        assert result.run.stdout == f"entries=0 {refused} stdin={read}\n"


async def test_output_larger_than_a_pipe_holds_arrives_whole(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    """300 kB of stdout in 300 flushed writes and 100 kB of stderr: more than a pipe's
    buffer each, so the worker drains them while the guest runs (``PipeCapture``)."""
    result = await run_module(runtime, compile_c(C_WRITE_MUCH), max_output_bytes=1_000_000)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == ("o" * 999 + "\n") * 300
    assert result.run.stderr == ("e" * 999 + "\n") * 100
    assert not result.run.stdout_truncated and not result.run.stderr_truncated


async def test_an_output_flood_is_cut_at_the_limit_and_ended_by_the_deadline(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    result = await run_module(
        runtime, compile_c(C_FLOOD), run_timeout_s=1.0, max_output_bytes=10_000
    )
    assert result.run is not None and result.run.status is StageStatus.TIME_LIMIT, result.run
    assert len(result.run.stdout) == 10_000 and result.run.stdout_truncated
    assert result.run.stdout.startswith("flood flood")
    assert result.run.wall_ms <= 3 * 1000
    after = await run_module(runtime, compile_c(C_WRITE_MUCH), max_output_bytes=1_000_000)
    assert after.run is not None and after.run.ok and len(after.run.stdout) == 300_000


C_ECHO = r"""
#include <stdio.h>
int main(void) {
    char in[256];
    size_t n = fread(in, 1, sizeof in - 1, stdin);
    in[n] = 0;
    for (int i = 0; i < 3; i++) { printf("out %s %d\n", in, i); fflush(stdout); }
    fprintf(stderr, "err %s\n", in);
    return 0;
}
"""


async def test_calls_on_lent_output_pipes_each_read_only_their_own_output(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    """Output FIFOs are lent to one instance after another (``OutputPipes``): 160 calls,
    32 at a time, and a flood cut by its deadline among them, each read exactly what its
    own guest wrote."""
    echo = compile_c(C_ECHO)
    flood = compile_c(C_FLOOD)

    async def one(i: int) -> None:
        result = await run_module(runtime, echo, stdin=f"call-{i}")
        assert result.run is not None and result.run.ok, result.run
        assert result.run.stdout == "".join(f"out call-{i} {k}\n" for k in range(3))
        assert result.run.stderr == f"err call-{i}\n"

    for start in range(0, 160, 32):
        flooded = asyncio.create_task(
            run_module(runtime, flood, run_timeout_s=0.3, max_output_bytes=2400)
        )
        await asyncio.gather(*(one(i) for i in range(start, start + 32)))
        cut = await flooded
        assert cut.run is not None and cut.run.status is StageStatus.TIME_LIMIT, cut.run
        assert cut.run.stdout == "flood flood flood flood\n" * 100


async def test_module_is_cached_in_memory_and_reused(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    module = compile_c(C_HELLO)
    first = await run_module(runtime, module, stdin="a")
    second = await run_module(runtime, module, stdin="b")
    assert first.run is not None and second.run is not None
    assert second.run.stdout.startswith("argc=1 argv0=module.wasm stdin=b ")


async def test_proc_exit_code(runtime: WasmBackend, run_module: RunModule) -> None:
    module = wat(
        f'{WASI_EXIT} (memory (export "memory") 1)'
        '(func (export "_start") (call $exit (i32.const 5)))'
    )
    result = await run_module(runtime, module)
    assert result.run is not None
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 5


async def test_return_from_start_is_exit_0(runtime: WasmBackend, run_module: RunModule) -> None:
    result = await run_module(runtime, wat('(func (export "_start"))'))
    assert result.run is not None and result.run.ok, result.run


async def test_invalid_wasm_is_an_error_stage(runtime: WasmBackend, run_module: RunModule) -> None:
    for data in (b"\0asm\x01\0\0\0garbage", b"definitely not wasm"):
        result = await run_module(runtime, data)
        assert result.error is None  # the caller's fault, not the platform's
        assert result.run is not None and result.run.status is StageStatus.ERROR
        assert result.run.message and "not a" in result.run.message, result.run.message


async def test_missing_module_file_is_an_error_stage(runtime: WasmBackend, run: Any) -> None:
    result = await run(runtime, "", language="wasm")
    assert result.run is not None and result.run.status is StageStatus.ERROR
    assert result.run.message and "module.wasm" in result.run.message


async def test_unoffered_import_is_an_error_stage(
    runtime: WasmBackend, run_module: RunModule
) -> None:
    module = wat('(import "env" "foo" (func $foo)) (func (export "_start") (call $foo))')
    result = await run_module(runtime, module)
    assert result.error is None
    assert result.run is not None and result.run.status is StageStatus.ERROR
    assert result.run.message and "env::foo" in result.run.message


async def test_reactor_without_start_is_an_error_stage(
    runtime: WasmBackend, run_module: RunModule
) -> None:
    module = wat(
        '(func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 i32.add)'
    )
    result = await run_module(runtime, module)
    assert result.run is not None and result.run.status is StageStatus.ERROR
    assert result.run.message and "_start" in result.run.message


async def test_unreachable_is_killed_with_the_trap(
    runtime: WasmBackend, run_module: RunModule
) -> None:
    result = await run_module(runtime, wat('(func (export "_start") unreachable)'))
    assert result.run is not None and result.run.status is StageStatus.KILLED
    assert result.run.message and "unreachable" in result.run.message


async def test_out_of_bounds_is_killed(runtime: WasmBackend, run_module: RunModule) -> None:
    module = wat('(memory 1) (func (export "_start") (drop (i32.load (i32.const 0x7ffffff0))))')
    result = await run_module(runtime, module)
    assert result.run is not None and result.run.status is StageStatus.KILLED
    assert result.run.message and "out of bounds" in result.run.message


async def test_loop_forever_hits_time_limit(runtime: WasmBackend, run_module: RunModule) -> None:
    spin = wat('(func (export "_start") (loop (br 0)))')
    result = await run_module(runtime, spin, run_timeout_s=1.0)
    assert result.run is not None and result.run.status is StageStatus.TIME_LIMIT, result.run
    assert 0.9 * 1000 <= result.run.wall_ms <= 3 * 1000


async def test_c_spin_hits_time_limit(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    result = await run_module(runtime, compile_c(C_SPIN), run_timeout_s=0.5)
    assert result.run is not None and result.run.status is StageStatus.TIME_LIMIT, result.run
    assert 0.4 * 1000 <= result.run.wall_ms <= 3 * 1000


async def test_memory_growth_stops_at_the_limit(
    runtime: WasmBackend, run_module: RunModule, compile_c: Callable[[str], bytes]
) -> None:
    result = await run_module(runtime, compile_c(C_MALLOC_FOREVER), memory_mb=32)
    assert result.run is not None
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert "malloc failed" in result.run.stderr
    assert result.run.peak_memory_kb is not None and result.run.peak_memory_kb <= 32 * 1024


async def test_memory_grow_ignoring_failure_traps_as_memory_limit(
    runtime: WasmBackend, run_module: RunModule
) -> None:
    module = wat(
        '(memory (export "memory") 1)'
        '(func (export "_start")'
        "  (loop (br_if 0 (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))"
        "  unreachable)"
    )
    result = await run_module(runtime, module, memory_mb=16)
    assert result.run is not None
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert result.run.peak_memory_kb is not None and result.run.peak_memory_kb <= 16 * 1024


async def test_declared_memory_over_the_limit(runtime: WasmBackend, run_module: RunModule) -> None:
    module = wat('(memory (export "memory") 4000) (func (export "_start"))')  # 250 MiB
    result = await run_module(runtime, module, memory_mb=64)
    assert result.error is None
    assert result.run is not None and result.run.status is StageStatus.MEMORY_LIMIT, result.run
