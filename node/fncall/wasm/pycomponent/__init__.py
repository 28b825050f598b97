"""Corral's pre-initialised CPython for WebAssembly, built on this machine.

``componentize-py`` (a PyPI dependency, pinned) compiles the guest program
``corral_python.py`` against ``runner.wit`` into a WebAssembly component: it starts
CPython, imports the guest (and with it ``PRELOAD``) and snapshots the instance's memory,
so that every call instantiates an interpreter whose start-up has already run.

The build is not reproducible byte for byte (the snapshot holds the hash secret and other
start-up state), so its SHA-256 cannot be pinned in the source as the downloaded
interpreters' are. The build writes a manifest instead: the digest of what it was built
from (the guest's files and the componentize-py version) and the SHA-256 of what it
wrote. ``current`` trusts a component only when both still match; otherwise the runtime
builds it again (``build``, ~10 s, in a subprocess with a time limit).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from wire.functions import PYTHON_DRIVER

log = logging.getLogger(__name__)

COMPONENT_FILE = "python-component.wasm"
MANIFEST_FILE = "python-component.json"
WORLD = "runner"
APP = "corral_python"
GUEST_FILES = ("runner.wit", "corral_python.py")
#: The module the build writes beside the guest: the programs the snapshot keeps compiled.
PROGRAMS_MODULE = "corral_programs.py"
#: Programs every call of a kind runs, compiled once in the snapshot (the guest's
#: ``run`` takes their code objects instead of compiling them again).
PROGRAMS = (PYTHON_DRIVER,)
TOOL = "componentize-py"
#: A component's preamble: ``\0asm``, version 0x0d, layer 1 (a core module's layer is 0).
COMPONENT_PREAMBLE = b"\0asm\x0d\x00\x01\x00"


class BuildError(RuntimeError):
    """The component could not be built."""


@dataclass(frozen=True)
class Built:
    path: Path
    sha256: str


def is_component(data: bytes) -> bool:
    return data[:8] == COMPONENT_PREAMBLE


def tool_version() -> str | None:
    try:
        return importlib.metadata.version(TOOL)
    except importlib.metadata.PackageNotFoundError:
        return None


def _guest_dir() -> Path:
    return Path(str(importlib.resources.files(__name__)))


def source_digest() -> str:
    """What a build depends on: the guest's files, its programs and the tool's version."""
    digest = hashlib.sha256(f"{TOOL}=={tool_version()}\n".encode())
    for name in GUEST_FILES:
        digest.update(name.encode() + b"\0" + (_guest_dir() / name).read_bytes() + b"\0")
    digest.update(PROGRAMS_MODULE.encode() + b"\0" + programs_module().encode() + b"\0")
    return digest.hexdigest()


def programs_module() -> str:
    """The source of ``PROGRAMS_MODULE``: ``PROGRAMS`` as literals."""
    return f"PROGRAMS = {PROGRAMS!r}\n"


def current(directory: Path) -> Built | None:
    """The component in ``directory`` if it was built from today's sources."""
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text())
        path = directory / COMPONENT_FILE
        if manifest.get("source") != source_digest() or not path.is_file():
            return None
        return Built(path, str(manifest["sha256"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build(directory: Path, *, timeout_s: float = 300.0) -> Built:
    """Build the component into ``directory`` (atomically: the file and then its
    manifest are renamed into place), and return it."""
    if tool_version() is None:
        raise BuildError(f"{TOOL} is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    source = source_digest()
    with tempfile.TemporaryDirectory(prefix="pycomponent-", dir=directory) as tmp:
        work = Path(tmp)
        for name in GUEST_FILES:
            (work / name).write_bytes((_guest_dir() / name).read_bytes())
        (work / PROGRAMS_MODULE).write_text(programs_module())
        out = work / COMPONENT_FILE
        argv = [
            sys.executable,
            "-c",
            "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py';"
            " sys.exit(script())",
            "-d",
            str(work / "runner.wit"),
            "-w",
            WORLD,
            "componentize",
            "-p",
            str(work),
            APP,
            "-o",
            str(out),
        ]
        try:
            done = subprocess.run(
                argv, cwd=work, capture_output=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"{TOOL} took longer than {timeout_s:g}s") from exc
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr or done.stdout).decode("utf-8", "replace")[-1500:]
            raise BuildError(f"{TOOL} failed (status {done.returncode}): {tail}")
        data = out.read_bytes()
        if not is_component(data):
            raise BuildError(f"{TOOL} wrote something that is not a component")
        sha256 = hashlib.sha256(data).hexdigest()
        manifest = {
            "source": source,
            "sha256": sha256,
            "tool": f"{TOOL}=={tool_version()}",
        }
        os.replace(out, directory / COMPONENT_FILE)
        staged = work / MANIFEST_FILE
        staged.write_text(json.dumps(manifest, indent=1))
        os.replace(staged, directory / MANIFEST_FILE)
    log.info("wasm: built %s (%s, sha256 %s)", COMPONENT_FILE, manifest["tool"], sha256[:12])
    return Built(directory / COMPONENT_FILE, sha256)


#: The CPython the pinned componentize-py release embeds (a test runs ``sys.version``).
PYTHON_VERSION = "3.14.0"
