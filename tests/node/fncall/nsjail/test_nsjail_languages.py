"""Every language end to end in real jails: hello world, stdin, files, compile stages."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from node.fncall.nsjail import NsjailBackend
from tests.requirements import missing
from wire.execution import StageStatus

RunFn = Callable[..., Any]

pytestmark = [pytest.mark.nsjail, pytest.mark.asyncio(loop_scope="module")]

HELLO = {
    "python": "import sys\nprint('hello', sys.stdin.read().strip())",
    "cpp": (
        "#include <iostream>\n#include <string>\n"
        'int main() { std::string s; std::cin >> s; std::cout << "hello " << s << std::endl; }'
    ),
    "rust": (
        "use std::io::Read;\nfn main() { let mut s = String::new();\n"
        'std::io::stdin().read_to_string(&mut s).unwrap();\nprintln!("hello {}", s.trim()); }'
    ),
    "java": (
        "public class Main { public static void main(String[] a) throws Exception {\n"
        'System.out.println("hello " + new String(System.in.readAllBytes()).trim()); } }'
    ),
    "nodejs": "const fs = require('fs');\nconsole.log('hello', fs.readFileSync(0, 'utf8').trim());",
    "bash": "read x\necho hello $x",
    "perl": 'my $x = <STDIN>; chomp $x; print "hello $x\\n";',
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def all_languages(new_runtime: Callable[..., NsjailBackend]) -> AsyncIterator[NsjailBackend]:
    rt = new_runtime()
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()


async def test_languages_are_detected(run: RunFn, all_languages: NsjailBackend) -> None:
    infos = {info.name: info for info in all_languages.languages()}
    assert {"python", "bash"} <= set(infos)
    assert all(info.runtime == "nsjail" for info in infos.values())
    assert infos["python"].version and infos["python"].version.startswith("3.")
    assert infos["python"].compiled is False
    if "cpp" in infos:
        assert infos["cpp"].compiled is True


@pytest.mark.parametrize("language", sorted(HELLO))
async def test_hello_world_with_stdin(
    run: RunFn, all_languages: NsjailBackend, language: str
) -> None:
    if language not in {info.name for info in all_languages.languages()}:
        missing(f"the {language} toolchain is not installed (scripts/setup-nsjail.sh)")
    result = await run(all_languages, HELLO[language], language=language, stdin="world\n")
    assert result.error is None, result.error
    if language in ("cpp", "rust", "java"):
        assert result.compile is not None and result.compile.ok, result.compile
    else:
        assert result.compile is None
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "hello world\n"
    assert result.run.cpu_ms is not None and result.run.peak_memory_kb
    assert result.exec_ms > 0 and result.setup_ms >= 0


async def test_python_is_a_normal_main_module(run: RunFn, all_languages: NsjailBackend) -> None:
    code = (
        "import sys, os\n"
        "if __name__ == '__main__':\n"
        "    print(sys.argv, os.getcwd(), os.getuid(), os.getgid())\n"
        "    print(sorted(os.environ.items()))\n"
        "    sys.exit(3)\n"
    )
    result = await run(all_languages, code)
    assert result.run is not None
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 3
    first, env = result.run.stdout.splitlines()
    assert first == "['main.py'] /box/work 65534 65534"
    assert env == str(
        sorted(
            {
                "PATH": "/usr/bin:/bin",
                "HOME": "/tmp",
                "LANG": "C.UTF-8",
                "TMPDIR": "/tmp",
            }.items()
        )
    )


async def test_a_program_the_python_code_starts_inherits_the_same_environment(
    run: RunFn, all_languages: NsjailBackend
) -> None:
    """The environment is set once, in PID 1 before the template is forked, not by each
    call's process: what the code's children inherit (the C-level environment) is the
    same as ``os.environ``, on every call."""
    code = (
        "import os, subprocess\n"
        "out = subprocess.run(['/usr/bin/env'], capture_output=True, text=True).stdout\n"
        "print(sorted(out.splitlines()) == sorted(f'{k}={v}' for k, v in os.environ.items()))\n"
        "print(sorted(out.splitlines()))\n"
    )
    for _ in range(2):
        result = await run(all_languages, code)
        assert result.run is not None and result.run.ok, result.run
        same, env = result.run.stdout.splitlines()
        assert same == "True"
        assert env == str(["HOME=/tmp", "LANG=C.UTF-8", "PATH=/usr/bin:/bin", "TMPDIR=/tmp"])


async def test_python_traceback_and_syntax_error(run: RunFn, all_languages: NsjailBackend) -> None:
    result = await run(all_languages, "x = 1\nraise ValueError('boom')\n")
    assert result.run is not None and result.run.exit_code == 1
    assert 'File "/box/work/main.py", line 2' in result.run.stderr
    assert "ValueError: boom" in result.run.stderr
    assert "zygote" not in result.run.stderr and "<string>" not in result.run.stderr
    result = await run(all_languages, "print(\n")
    assert result.run is not None and result.run.exit_code == 1
    assert "SyntaxError" in result.run.stderr


async def test_files_in_and_fetch_files_out(run: RunFn, all_languages: NsjailBackend) -> None:
    code = (
        "import os\n"
        "data = open('in/data.bin', 'rb').read()\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/result.bin', 'wb').write(data[::-1])\n"
        "open('notes.txt', 'w').write('ok')\n"
        "os.symlink('/etc/hosts', 'link')\n"
    )
    payload = bytes(range(256))
    result = await run(
        all_languages,
        code,
        files={"in/data.bin": base64.b64encode(payload).decode()},
        fetch=["out/result.bin", "notes.txt", "missing.txt", "link"],
    )
    assert result.run is not None and result.run.ok, result.run
    assert base64.b64decode(result.files["out/result.bin"]) == payload[::-1]
    assert base64.b64decode(result.files["notes.txt"]) == b"ok"
    assert "missing.txt" not in result.files and "link" not in result.files
    assert result.run.message is not None and "missing.txt" in result.run.message


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/evil", "a/../../b", "./x", "a//b"])
async def test_path_traversal_is_rejected(
    run: RunFn, all_languages: NsjailBackend, path: str
) -> None:
    result = await run(all_languages, "print(1)", files={path: base64.b64encode(b"x").decode()})
    assert result.error is None
    assert result.run is not None and result.run.status is StageStatus.ERROR
    assert result.run.message and path in result.run.message
    result = await run(all_languages, "print(1)", fetch=[path])
    assert result.run is not None and result.run.status is StageStatus.ERROR


async def test_bad_base64_is_rejected(run: RunFn, all_languages: NsjailBackend) -> None:
    result = await run(all_languages, "print(1)", files={"a.txt": "***"})
    assert result.run is not None and result.run.status is StageStatus.ERROR
    assert "base64" in (result.run.message or "")


async def test_unknown_language_is_a_clear_error(run: RunFn, all_languages: NsjailBackend) -> None:
    result = await run(all_languages, "print(1)", language="cobol")
    assert result.error is not None and "cobol" in result.error


async def test_cpp_compile_error_vs_runtime_error(run: RunFn, all_languages: NsjailBackend) -> None:
    if "cpp" not in {info.name for info in all_languages.languages()}:
        missing("g++ is not installed (scripts/setup-nsjail.sh)")
    broken = await run(all_languages, "int main() { return undefined_name; }", language="cpp")
    assert broken.error is None
    assert broken.compile is not None
    assert broken.compile.status is StageStatus.FINISHED and broken.compile.exit_code != 0
    assert "undefined_name" in broken.compile.stderr
    assert broken.run is None
    assert not broken.succeeded

    crashing = (
        "#include <cstdio>\n"
        'int main() { std::puts("before"); std::fflush(stdout);'
        " volatile int *p = nullptr; *p = 1; return 0; }"
    )
    crashed = await run(all_languages, crashing, language="cpp")
    assert crashed.compile is not None and crashed.compile.ok
    assert crashed.run is not None and crashed.run.status is StageStatus.KILLED
    assert crashed.run.signal == 11 and "SIGSEGV" in (crashed.run.message or "")
    assert crashed.run.stdout == "before\n"

    exit_code = await run(all_languages, "int main() { return 7; }", language="cpp")
    assert exit_code.run is not None and exit_code.run.status is StageStatus.FINISHED
    assert exit_code.run.exit_code == 7


async def test_unwritable_input_files_are_a_stage_error(
    run: RunFn, all_languages: NsjailBackend
) -> None:
    x = base64.b64encode(b"x").decode()
    result = await run(all_languages, "print(1)", files={"a": x, "a/b": x})
    assert result.error is None
    assert result.run is not None and result.run.status is StageStatus.ERROR
    assert "cannot write the input files" in (result.run.message or "")
    again = await run(all_languages, "print(1)")
    assert again.run is not None and again.run.ok


async def test_a_program_that_cannot_be_executed_is_the_codes_failure(
    run: RunFn, all_languages: NsjailBackend
) -> None:
    # the compile stage builds a library, not a program: the run stage cannot execute
    # ./main; that is the code's doing, not a platform error
    if "rust" not in {info.name for info in all_languages.languages()}:
        missing("rustc is not installed (scripts/setup-nsjail.sh)")
    result = await run(all_languages, '#![crate_type = "lib"]\npub fn f() {}\n', language="rust")
    assert result.error is None
    assert result.compile is not None and result.compile.ok, result.compile
    assert result.run is not None and result.run.status is StageStatus.FINISHED, result.run
    assert result.run.exit_code == 127
    assert "cannot execute ./main" in (result.run.message or "")


COUNT_CPUS = {
    "python": "import os, multiprocessing\nprint(os.cpu_count(), multiprocessing.cpu_count())",
    "nodejs": "const os = require('os');\nconsole.log(os.cpus().length, os.availableParallelism())",
    "java": (
        "public class Main { public static void main(String[] a) {\n"
        'int n = Runtime.getRuntime().availableProcessors(); System.out.println(n + " " + n); } }'
    ),
}


@pytest.mark.parametrize("language", sorted(COUNT_CPUS))
async def test_runtimes_still_count_the_cpus_behind_the_masked_proc(
    run: RunFn, all_languages: NsjailBackend, language: str
) -> None:
    # /proc/stat is covered by a copy whose counters are zero but whose CPU lines remain
    if language not in {info.name for info in all_languages.languages()}:
        missing(f"the {language} toolchain is not installed (scripts/setup-nsjail.sh)")
    result = await run(all_languages, COUNT_CPUS[language], language=language)
    assert result.run is not None and result.run.ok, result
    assert result.run.stdout.split() == [str(len(os.sched_getaffinity(0)))] * 2
