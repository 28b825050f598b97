"""Wrap a function's code into a program that speaks Corral's calling convention.

The program reads the input (JSON) from stdin, sends anything the user's code prints to
stderr (the invocation's logs), calls the entry point with the parsed input and writes
the JSON result, alone, to stdout. An exception ends it with exit code 1 and the
traceback on stderr. The user's source travels inside the generated program as a string
literal, so one ``RunSpec.code`` carries everything and no file is needed.

A raw ``wasm`` module follows the convention itself: it gets the input on stdin and must
write its JSON result to stdout.
"""

from __future__ import annotations

import json

from app.functions.languages import Driver
from wire.execution import RunLimits, RunSpec

_PYTHON = """\
import json as _json
import linecache as _linecache
import sys as _sys

_SOURCE = {source}
_ENTRY = {entry}
_FILE = "<function>"


def _corral_main():
    out = _sys.stdout
    _sys.stdout = _sys.stderr  # the user's prints are logs
    data = _json.loads(_sys.stdin.read() or "null")
    _linecache.cache[_FILE] = (len(_SOURCE), None, _SOURCE.splitlines(True), _FILE)
    namespace = {{"__name__": "function", "__builtins__": __builtins__}}
    exec(compile(_SOURCE, _FILE, "exec"), namespace)
    entry = namespace.get(_ENTRY)
    if not callable(entry):
        _sys.stderr.write(f"corral: entry point {{_ENTRY!r}} is not a function\\n")
        raise SystemExit(1)
    result = entry(data)
    if hasattr(result, "__await__"):
        import asyncio

        async def _wait():
            return await result

        result = asyncio.run(_wait())
    text = _json.dumps(result, allow_nan=False)
    _sys.stderr.flush()
    out.write(text)
    out.flush()


_corral_main()
"""

_NODE_IO = """\
const __corral_io = {
  read: () => require("fs").readFileSync(0, "utf8"),
  write: (text) => process.stdout.write(text),
  log: (...args) => process.stderr.write(require("util").format(...args) + "\\n"),
  fail: (err) => {
    process.stderr.write(String((err && err.stack) || err) + "\\n");
    process.exitCode = 1;
  },
};
globalThis.require = require;
"""

_QUICKJS_IO = """\
const __corral_io = {
  read: () => std.in.readAsString(),
  write: (text) => { std.out.puts(text); std.out.flush(); },
  log: (...args) => {
    const text = args.map((a) => (typeof a === "string" ? a : JSON.stringify(a)));
    std.err.puts(text.join(" ") + "\\n");
    std.err.flush();
  },
  fail: (err) => {
    std.err.puts(String(err) + "\\n" + ((err && err.stack) || "") + "\\n");
    std.err.flush();
    std.exit(1);
  },
};
"""

_JS_MAIN = """\
console.log = console.info = console.debug = console.warn = console.error = __corral_io.log;
(function () {{
  let entry, input;
  try {{
    input = JSON.parse(__corral_io.read() || "null");
    entry = (0, eval)({source} + "\\n;(typeof {entry} === 'undefined' ? undefined : {entry})");
  }} catch (err) {{
    __corral_io.fail(err);
    return;
  }}
  if (typeof entry !== "function") {{
    __corral_io.fail(new Error("corral: entry point {entry} is not a function"));
    return;
  }}
  Promise.resolve()
    .then(() => entry(input))
    .then((out) => __corral_io.write(JSON.stringify(out === undefined ? null : out)))
    .catch(__corral_io.fail);
}})();
"""


def driver_source(driver: Driver, source: str, entry_point: str) -> str:
    """The program to run for ``source`` (the user's code) with this ``driver``."""
    if driver is Driver.PYTHON:
        return _PYTHON.format(source=repr(source), entry=repr(entry_point))
    if driver in (Driver.NODE, Driver.QUICKJS):
        io = _NODE_IO if driver is Driver.NODE else _QUICKJS_IO
        return io + _JS_MAIN.format(source=json.dumps(source), entry=entry_point)
    raise ValueError(f"driver {driver} takes no source")


def build_spec(
    *,
    language: str,
    driver: Driver,
    entry_point: str,
    artifact: bytes,
    artifact_digest: str,
    input_value: object,
    limits: RunLimits,
) -> RunSpec:
    """The ``RunSpec`` of one invocation: the driver program, the input on stdin. A module
    goes by its digest (``RunSpec.artifact``): the node has it, or fetches it once."""
    stdin = json.dumps(input_value, separators=(",", ":"))
    if driver is Driver.MODULE:
        return RunSpec(
            language=language, code="", stdin=stdin, artifact=artifact_digest, limits=limits
        )
    code = driver_source(driver, artifact.decode("utf-8"), entry_point)
    return RunSpec(language=language, code=code, stdin=stdin, limits=limits)
