"""The guest program of Corral's pre-initialised CPython component (``runner.wit``).

componentize-py runs this module once at build time and snapshots the interpreter's
memory after it: start-up, the imports of ``PRELOAD`` and the hooks installed here are
paid once, and every call instantiates that snapshot afresh (one instance per call, then
discarded), so calls share nothing. A module not imported here cannot be imported by a
call: the snapshot carries no file system with the standard library.

What the snapshot would otherwise share between calls is renewed in ``run``: the random
generator's state (seeded once at build time) and ``__main__``'s namespace. The code
objects of ``corral_programs.PROGRAMS`` (written beside this module by the build) are
compiled here once and shared; code objects are immutable, and each call runs in an
instance of its own.

Sleeping goes through the host (``wit_world.sleep``), which caps a sleep at the call's
deadline and wakes it when the runtime closes; a sleep inside WASI's own clocks would
hold the instance's thread for as long as the guest asked. The interpreter's own
``time.sleep`` sleeps that way, so an audit hook (which a guest cannot remove) refuses
it: every path to it raises the ``time.sleep`` audit event. ``select.select`` with a
timeout still waits inside WASI (it raises no audit event and a guest can always load the
built-in module afresh): the host answers such a call at its deadline and counts its
thread as stuck (``node.fncall.wasm.executor``).
"""

import sys

PRELOAD = """
abc argparse array ast base64 binascii bisect calendar cmath codecs collections
collections.abc colorsys contextlib copy copyreg csv dataclasses datetime decimal difflib
dis enum errno fnmatch fractions functools gc getopt glob graphlib gzip hashlib heapq hmac
html html.parser inspect io ipaddress itertools json keyword linecache locale math
numbers operator os pathlib pickle platform pprint queue random re reprlib secrets shlex
shutil statistics string struct tempfile textwrap time tokenize traceback types typing
unicodedata urllib.parse uuid warnings weakref zipfile zlib xml.etree.ElementTree
""".split()

for _name in PRELOAD:
    __import__(_name)

import atexit  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import corral_programs  # noqa: E402
import wit_world  # noqa: E402


def _host_sleep(seconds: float) -> None:
    """``time.sleep`` served by the host: interrupted at the call's deadline."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    wit_world.sleep(int(seconds * 1e9))


def _audit(event: str, _args: tuple) -> None:
    if event == "time.sleep":
        raise PermissionError("this sandbox serves time.sleep from the host only")


class _Exit(BaseException):
    """``os._exit(n)`` inside a call: WASI 0.2 can only say "failed", not ``n``."""

    def __init__(self, code: int) -> None:
        self.code = code


def _exit(code: int) -> None:
    raise _Exit(code)


def _stream(fd: int, errors: str) -> io.TextIOWrapper:
    """A buffered text stream on ``fd``. The interpreter's own streams write to an
    unbuffered ``FileIO``, and ``TextIOWrapper`` does not retry the short writes WASI
    makes (8 KiB at most per write): the rest of a longer write was lost."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors=errors)


time.sleep = _host_sleep
os._exit = _exit
sys.stdout = sys.__stdout__ = _stream(1, "strict")
sys.stderr = sys.__stderr__ = _stream(2, "backslashreplace")
_PATH = list(sys.path)
# The calling conventions' programs (written here by the build: the Python tool-function
# driver), compiled once: a call that runs one takes its code object from the snapshot.
_COMPILED = {text: compile(text, "main.py", "exec") for text in corral_programs.PROGRAMS}
sys.addaudithook(_audit)


class WitWorld(wit_world.WitWorld):
    def run(self, source: str) -> int:
        random.seed()  # a generator seeded at build time would repeat in every call
        main = sys.modules["__main__"].__dict__
        for key in [k for k in main if not k.startswith("__")]:
            del main[key]
        main["__file__"] = "main.py"
        sys.argv[:] = ["main.py"]
        sys.path[:] = ["/work", *_PATH]  # the program's own modules, as ``python main.py``
        try:
            os.chdir("/work")
        except OSError:
            pass
        status: object = 0
        try:
            code = _COMPILED.get(source)
            exec(code if code is not None else compile(source, "main.py", "exec"), main)
        except SystemExit as exc:
            status = exc.code
        except _Exit as exc:
            return exc.code & 0xFF  # no exit handlers, no flush: as os._exit
        except BaseException as exc:
            try:
                traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
            except BaseException:
                os.write(2, f"{type(exc).__name__}: {exc}\n".encode("utf-8", "replace"))
            status = 1
        try:
            atexit._run_exitfuncs()
        except BaseException:
            pass
        if status is None:
            status = 0
        elif not isinstance(status, int):
            try:
                print(status, file=sys.stderr)
            except BaseException:
                pass
            status = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        return status & 0xFF
