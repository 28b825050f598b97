"""The code interpreter's worker: one per context, running inside a sandbox.

The gateway writes this file into the sandbox (it is not part of any image) and starts
it as a background process with stdin open (``app.api.e2b.interpreter``). Protocol, JSON
lines both ways:

    stdin   {"id": "...", "code": "...", "env_vars": {...}}      one cell
    stdout  {"id": "...", "type": "stdout"|"stderr", "text", "timestamp"}
            {"id": "...", "type": "result", "text", "html"?, ..., "is_main_result"}
            {"id": "...", "type": "error", "name", "value", "traceback"}
            {"id": "...", "type": "number_of_executions", "execution_count"}
            {"id": "...", "type": "end"}                          the cell is over

Cells run one at a time in one namespace (the context's state). The value of a cell's
last expression is its result (``repr`` as ``text``, and the ``_repr_*_`` forms an object
offers); ``display(obj)`` adds one more. What the cell prints (also what its
subprocesses write to fds 1 and 2) is forwarded as ``stdout``/``stderr``: the protocol
has a file descriptor of its own. A line ``!command`` runs ``command`` in a shell, as in
IPython (its failure is not the cell's error). SIGINT interrupts the running cell (its error is a
``KeyboardInterrupt``) and keeps the namespace.

Charts, as in a Jupyter kernel with matplotlib's inline backend: the worker is
matplotlib's backend (``MPLBACKEND=module://corral_inline``, a module this file provides
on import), so ``plt.show()`` sends every open figure as a ``png`` result and closes
them, the figures a cell leaves open are sent the same way when it ends, and a
``Figure`` as a cell's last expression (or given to ``display``) is its ``png``. pandas'
tables come as ``html`` and ``text`` through their ``_repr_*_`` methods.

Runs on the image's python3 (3.9 or later); standard library only (matplotlib when the
code imports it).
"""

from __future__ import annotations

import ast
import base64
import builtins
import codecs
import contextlib
import importlib.abc
import importlib.util
import io
import json
import linecache
import os
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

_FORMATS = {
    "html": "_repr_html_",
    "markdown": "_repr_markdown_",
    "svg": "_repr_svg_",
    "png": "_repr_png_",
    "jpeg": "_repr_jpeg_",
    "pdf": "_repr_pdf_",
    "latex": "_repr_latex_",
    "json": "_repr_json_",
    "javascript": "_repr_javascript_",
}
_MARK = "\x1ecorral-sync\x1e"
#: the matplotlib backend the worker provides (``module://`` + this name)
BACKEND = "corral_inline"
_BACKEND_SOURCE = """
from matplotlib.backend_bases import FigureManagerBase as FigureManager
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas


def show(*args, **kwargs):
    _show()
"""


class _Backend(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and makes the ``corral_inline`` module when matplotlib asks for it."""

    def __init__(self, show: Any) -> None:
        self._show = show

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name == BACKEND else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        module._show = self._show
        exec(compile(_BACKEND_SOURCE, f"<{BACKEND}>", "exec"), module.__dict__)


def _is_figure(value: object) -> bool:
    kind = type(value)
    return kind.__name__ == "Figure" and kind.__module__ == "matplotlib.figure"


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def shell_escapes(code: str) -> str:
    """IPython's ``!command`` lines, as calls of ``__corral_shell__``."""
    lines = []
    for line in code.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("!"):
            indent = line[: len(line) - len(stripped)]
            line = f"{indent}__corral_shell__({stripped[1:]!r})"
        lines.append(line)
    return "\n".join(lines)


def _shell(command: str) -> None:
    subprocess.run(command, shell=True, check=False)


class Worker:
    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
        self._in = os.fdopen(os.dup(0), "r", encoding="utf-8")
        nothing = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nothing, 0)  # the cell's stdin is empty: requests are not its input
        os.close(nothing)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        self._lock = threading.Lock()
        self.current = ""
        self.count = 0
        self.namespace: dict[str, Any] = {
            "__name__": "__main__",
            "__builtins__": builtins,
            "display": self.display,
            "__corral_shell__": _shell,
        }
        self._shown: set[int] = set()  #: figures sent in this cell
        os.environ.setdefault("MPLBACKEND", f"module://{BACKEND}")
        sys.meta_path.append(_Backend(self.show_figures))
        self._synced = {1: threading.Event(), 2: threading.Event()}
        for fd, kind in ((1, "stdout"), (2, "stderr")):
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            threading.Thread(target=self._pump, args=(read, fd, kind), daemon=True).start()
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)  # noqa: SIM115

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps({"id": self.current, **message}) + "\n")
            self._out.flush()

    def _pump(self, fd_read: int, fd: int, kind: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        held = ""
        while True:
            chunk = os.read(fd_read, 65536)
            if not chunk:
                return
            held += decoder.decode(chunk)
            while _MARK in held:
                before, held = held.split(_MARK, 1)
                if before:
                    self.send({"type": kind, "text": before, "timestamp": time.time_ns()})
                self._synced[fd].set()
            cut = held.rfind("\x1e")
            keep = held[cut:] if cut >= 0 and _MARK.startswith(held[cut:]) else ""
            text = held[: len(held) - len(keep)]
            held = keep
            if text:
                self.send({"type": kind, "text": text, "timestamp": time.time_ns()})

    def sync(self) -> None:
        """Wait until what the cell wrote to fds 1 and 2 has been forwarded."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd, event in self._synced.items():
            event.clear()
            os.write(fd, _MARK.encode())
            event.wait(5)

    def show_figures(self) -> None:
        """Send every open figure not sent in this cell, and close them all (what
        ``plt.show()`` does here, and the end of a cell)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            if id(figure) not in self._shown:
                self.sync()
                self.display(figure)
        pyplot.close("all")

    def display(self, value: object, *, main: bool = False) -> None:
        result: dict[str, Any] = {"type": "result", "text": repr(value), "is_main_result": main}
        if _is_figure(value):
            self._shown.add(id(value))
            try:
                result["png"] = _png(value)
            except Exception as exc:  # a figure that cannot be drawn: its text, and why
                result["text"] = f"{value!r} (not drawn: {type(exc).__name__}: {exc})"
        for name, method in _FORMATS.items():
            formatter = getattr(value, method, None)
            if formatter is None:
                continue
            try:
                shown = formatter()
            except Exception:  # a broken _repr_ is not the cell's error
                continue
            if isinstance(shown, bytes):
                shown = base64.b64encode(shown).decode()
            if shown is not None:
                result[name] = shown
        self.send(result)

    def run(self, code: str, env: dict[str, str]) -> None:
        self.count += 1
        self.send({"type": "number_of_executions", "execution_count": self.count})
        filename = f"<cell-{self.count}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self._shown.clear()
        try:
            tree = ast.parse(shell_escapes(code), filename, "exec")
            last = tree.body[-1] if tree.body else None
            if isinstance(last, ast.Expr):
                tree.body.pop()
            else:
                last = None
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is not None:
                expression = ast.Expression(last.value)
                value = eval(compile(expression, filename, "eval"), self.namespace)
                if value is not None:
                    self.namespace["_"] = value
                    self.sync()
                    self.display(value, main=True)
        except BaseException as exc:  # the cell's error, whatever it is, is reported
            self.sync()
            frames = traceback.extract_tb(exc.__traceback__)
            inside = [f for f in frames if f.filename != __file__] or frames
            lines = traceback.format_list(inside) + traceback.format_exception_only(type(exc), exc)
            self.send(
                {
                    "type": "error",
                    "name": type(exc).__name__,
                    "value": str(exc),
                    "traceback": "Traceback (most recent call last):\n" + "".join(lines),
                }
            )
        finally:
            with contextlib.suppress(Exception):
                self.show_figures()  # what the cell drew and did not show
            for key, old in saved.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
            self.sync()
            self.send({"type": "end"})

    def serve(self) -> None:
        while True:
            try:
                line = self._in.readline()
                if not line:
                    return
                request = json.loads(line)
                self.current = str(request.get("id", ""))
                env = request.get("env_vars") or {}
                self.run(str(request.get("code", "")), {str(k): str(v) for k, v in env.items()})
            except KeyboardInterrupt:
                continue  # an interrupt that came between cells
            except ValueError as exc:
                self.send(
                    {"type": "error", "name": "ProtocolError", "value": str(exc), "traceback": ""}
                )
                self.send({"type": "end"})


if __name__ == "__main__":
    Worker().serve()
