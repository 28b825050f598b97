"""The programs a warm interpreter instance starts with, and their stdin framing.

A warm instance has run its interpreter's start-up and the bootstrap, which writes
``READY_MARKER`` to stderr and blocks reading its stdin pipe. A call sends one frame:

    b"<length of the code in bytes>\\n" + code + the call's stdin

The bootstrap reads exactly the code, runs it as the main program, and leaves the rest of
stdin to it. When the pipe closes before a frame arrives (the pool is draining) the
bootstrap exits quietly. The instance is discarded after its one call.

A warm-up is CPU that every call pays for (one instance per call), ~50 ms for CPython, so
the bootstrap imports as little as it can: ``traceback`` only when the program fails, and
the host writes the source to ``/work/main.py`` so tracebacks show source lines without
``linecache`` being set up in advance.
"""

from __future__ import annotations

#: Written once to stderr when the bootstrap waits for its frame. Output before this
#: marker is discarded; the host looks for it only until the call is armed.
READY_MARKER = b"\x1e<corral-wasm-ready>\x1e"


def frame(code: str, stdin: str) -> bytes:
    source = code.encode("utf-8", "replace")
    return b"%d\n" % len(source) + source + stdin.encode("utf-8", "replace")


_PYTHON = r"""
def _corral_boot():
    import atexit, os, sys
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    compile(b"pass\n", "main.py", "exec")  # the first compile of bytes costs ~10 ms
    os.write(2, MARKER)
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(header) > 20:
            os._exit(0)
        header += byte
    left, parts = int(header), []
    while left > 0:
        chunk = os.read(0, min(left, 1 << 20))
        if not chunk:
            os._exit(0)
        parts.append(chunk)
        left -= len(chunk)
    source = b"".join(parts)
    try:
        os.chdir("/work")
    except OSError:
        pass
    main = sys.modules["__main__"].__dict__
    for key in [k for k in main if not k.startswith("__")]:
        del main[key]
    main["__file__"] = "main.py"
    sys.argv[:] = ["main.py"]
    status = 0
    try:
        exec(compile(source, "main.py", "exec"), main)
    except SystemExit as exc:
        status = exc.code
    except BaseException as exc:
        try:
            import traceback
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        except BaseException:
            os.write(2, ("%s: %s\n" % (type(exc).__name__, exc)).encode("utf-8", "replace"))
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
    os._exit(status & 0xFF)
_corral_boot()
"""


def python_bootstrap(preload: tuple[str, ...]) -> str:
    """``python -c`` source of the warm Python instance."""
    for name in preload:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"not a module name: {name!r}")
    return (
        _PYTHON.replace("PRELOAD", repr(tuple(preload)))
        .replace("MARKER", repr(READY_MARKER))
        .strip()
    )


_JAVASCRIPT = r"""
(() => {
  std.err.puts(MARKER);
  std.err.flush();
  const header = std.in.getline();
  if (header === null) std.exit(0);
  const source = std.in.readAsString(Number(header));
  try { os.chdir("/work"); } catch (e) {}
  std.evalScript(source, { backtrace_barrier: true });
})();
"""


def javascript_bootstrap() -> str:
    """``qjs --std -e`` source of the warm QuickJS instance."""
    marker = "".join(f"\\x{b:02x}" for b in READY_MARKER)
    return _JAVASCRIPT.replace("MARKER", f'"{marker}"').strip()
