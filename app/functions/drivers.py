"""Wrap a function's code into a program that speaks Corral's calling convention.

The program reads the input (JSON) from stdin, sends anything the user's code prints to
stderr (the invocation's logs), calls the entry point with the parsed input and writes
the JSON result, alone, to stdout. An exception ends it with exit code 1 and the
traceback on stderr. No file is needed: a Python function runs as
``wire.functions.PYTHON_DRIVER``, the same program for every function, with the function
itself on stdin beside the input (so a runtime can keep that program compiled); a
JavaScript function's source travels inside its generated program as a string literal.

A raw ``wasm`` module follows the convention itself: it gets the input on stdin and must
write its JSON result to stdout.
"""

from __future__ import annotations

import json

from app.functions.languages import Driver
from wire.execution import RunLimits, RunSpec
from wire.functions import PYTHON_DRIVER, python_call

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
    """The program to run for ``source`` (the user's code) with this JavaScript
    ``driver``."""
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
    if driver is Driver.MODULE:
        stdin = json.dumps(input_value, separators=(",", ":"))
        return RunSpec(
            language=language, code="", stdin=stdin, artifact=artifact_digest, limits=limits
        )
    source = artifact.decode("utf-8")
    if driver is Driver.PYTHON:  # one program for every function, the function on stdin
        stdin = python_call(source, entry_point, input_value)
        return RunSpec(language=language, code=PYTHON_DRIVER, stdin=stdin, limits=limits)
    code = driver_source(driver, source, entry_point)
    stdin = json.dumps(input_value, separators=(",", ":"))
    return RunSpec(language=language, code=code, stdin=stdin, limits=limits)
