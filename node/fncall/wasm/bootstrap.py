"""The programs a warm interpreter instance starts with, and their stdin framing.

A warm instance has run its interpreter's start-up and the bootstrap, which writes
``READY_MARKER`` to stderr and blocks reading its stdin pipe. A call sends one frame:

    b"<length of the code in bytes>\\n" + code + the call's stdin

The bootstrap reads exactly the code, runs it as the main program, and leaves the rest of
stdin to it. When the pipe closes before a frame arrives (the pool is draining) the
bootstrap exits quietly. The instance is discarded after its one call.

A warm-up is CPU that every call pays for (one instance per call). Python does not
start this way: it is a pre-initialised component whose ``run`` export gets the code
(``node.fncall.wasm.pycomponent``).
"""

from __future__ import annotations

#: Written once to stderr when the bootstrap waits for its frame. Output before this
#: marker is discarded; the host looks for it only until the call is armed.
READY_MARKER = b"\x1e<corral-wasm-ready>\x1e"


def frame(code: str, stdin: str) -> bytes:
    source = code.encode("utf-8", "replace")
    return b"%d\n" % len(source) + source + stdin.encode("utf-8", "replace")


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
