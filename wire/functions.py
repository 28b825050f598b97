"""How a Python tool function is called: the program that runs it, and its stdin.

The gateway turns an invocation of a Python function into a ``RunSpec`` whose code is
``PYTHON_DRIVER`` and whose stdin is ``python_call(source, entry, input)``; any runtime
that runs Python runs it as it runs any program. The program reads the call from stdin,
sends what the function prints to stderr (the invocation's logs), calls the entry point
with the input and writes its JSON result, alone, to stdout; an exception ends it with
exit code 1 and the traceback on stderr.

The program's text is the same for every function (the function travels on stdin), so
a runtime may keep it compiled: the wasm runtime's pre-initialised CPython compiles it
once, when its snapshot is built (``node.fncall.wasm.pycomponent``), which spares every call
the 0.6 ms of compiling it again (docs/benchmarks-history.md, "Python on wasm: the driver
compiled into the snapshot").
"""

from __future__ import annotations

import json

PYTHON_DRIVER = """\
import json as _json
import linecache as _linecache
import sys as _sys

_FILE = "<function>"


def _corral_main():
    out = _sys.stdout
    _sys.stdout = _sys.stderr  # the user's prints are logs
    call = _json.loads(_sys.stdin.read())
    source, entry_name, data = call["source"], call["entry"], call["input"]
    _linecache.cache[_FILE] = (len(source), None, source.splitlines(True), _FILE)
    namespace = {"__name__": "function", "__builtins__": __builtins__}
    exec(compile(source, _FILE, "exec"), namespace)
    entry = namespace.get(entry_name)
    if not callable(entry):
        _sys.stderr.write(f"corral: entry point {entry_name!r} is not a function\\n")
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


def python_call(source: str, entry: str, value: object) -> str:
    """The stdin of ``PYTHON_DRIVER`` calling ``entry`` of ``source`` with ``value``."""
    return json.dumps({"source": source, "entry": entry, "input": value}, separators=(",", ":"))
