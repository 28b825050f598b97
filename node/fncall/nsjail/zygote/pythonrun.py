"""The Python runner: a spare's own interpreter made the program's (``__main__``, argv,
standard streams), the user's code run in it, and its exit status as CPython's own."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, NoReturn

from node.fncall.nsjail.zygote.common import WORK


def _python_main(stage: dict[str, Any]) -> Any:
    """Make this interpreter the program's: a fresh ``__main__``, argv and standard
    streams (everything of the run that is ours, before the code runs; the environment,
    ``CHILD_ENV``, is the one ``_setup`` gave PID 1 before the template was forked)."""
    import builtins
    import types

    filename = stage["filename"]
    path = os.path.join(WORK, filename)
    module = types.ModuleType("__main__")
    module.__dict__.update({"__file__": path, "__builtins__": builtins, "__cached__": None})
    sys.modules["__main__"] = module
    sys.argv = [filename]
    sys.path.insert(0, WORK)
    streams = {
        "stdin": open(0, encoding="utf-8", closefd=False),  # noqa: SIM115
        "stdout": open(1, "w", encoding="utf-8", closefd=False),  # noqa: SIM115
        "stderr": open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False),  # noqa: SIM115
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    return module


def _run_python(stage: dict[str, Any], module: Any) -> NoReturn:
    """Run the user's code as ``__main__`` and exit with its status. A MemoryError is
    printed like any exception: whether the stage ran out of memory is judged by the
    host from what the kernel measured, never from what the code says."""
    import atexit
    import traceback

    code = 0
    try:
        compiled = compile(stage["python"], module.__file__, "exec", dont_inherit=True)
        exec(compiled, module.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt as exc:
        code = 130
        _print_exception(exc, traceback)
    except BaseException as exc:
        code = 1
        _print_exception(exc, traceback)
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # wait for non-daemon threads
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        _print_exception(exc, traceback)
        code = code or 1
    for out in (sys.stdout, sys.stderr):
        try:
            out.flush()
        except BaseException:
            code = code or 120
    os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(BaseException):
        sys.stderr.write(f"{exc.code}\n")
    return 1


def _print_exception(exc: BaseException, traceback: Any) -> None:
    try:
        tb = exc.__traceback__
        # hide the zygote's own frame(s) above the user's code
        while tb is not None and tb.tb_frame.f_code.co_filename != sys.modules[
            "__main__"
        ].__dict__.get("__file__"):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
    except BaseException:
        pass
