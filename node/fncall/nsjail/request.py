"""Checking a RunSpec on the host and building the zygote's ``run`` request from it.

The zygote checks paths again (it is the last line before the file system), but rejecting
here means a bad request never costs a jail.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from node.fncall.nsjail.config import MIB, NsjailConfig
from node.fncall.nsjail.languages import LanguageSpec, StagePlan
from node.workfiles import InvalidSpec, check_relpath
from wire.execution import RunSpec


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidSpec(f"{what} is not valid Unicode text: {exc.reason}") from None


def check(spec: RunSpec, lang: LanguageSpec, config: NsjailConfig) -> None:
    total = _utf8_size(spec.code, "code") + _utf8_size(spec.stdin, "stdin")
    for path, encoded in spec.files.items():
        check_relpath(path, "file")
        if path == lang.source_file:
            raise InvalidSpec(f"file {path!r} would overwrite the program's source file")
        try:
            total += len(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise InvalidSpec(f"file {path!r} is not valid base64: {exc}") from None
        if total > config.max_input_bytes:
            break
    if total > config.max_input_bytes:
        raise InvalidSpec(
            f"code, stdin and files add up to more than {config.max_input_bytes} bytes"
        )
    for path in spec.fetch_files:
        check_relpath(path, "fetch_files entry")


def output_cap(spec: RunSpec, config: NsjailConfig) -> int:
    """Bytes kept per stream: the spec's cap, bounded by the node's."""
    return min(spec.limits.max_output_bytes, config.max_output_bytes)


def zygote_memory_mb(spec: RunSpec, config: NsjailConfig) -> int:
    """cgroup memory the zygote itself needs in a call on top of the code's: its own
    interpreter and the captured output, fetched files and their JSON encoding."""
    buffers = 4 * output_cap(spec, config)  # two streams, bytes plus their JSON text
    if spec.fetch_files:
        buffers += 3 * config.max_fetch_bytes  # bytes, base64, JSON
    return config.jail_overhead_mb + -(-buffers // MIB)


def build(
    spec: RunSpec, lang: LanguageSpec, stages: list[StagePlan], config: NsjailConfig, *, id: str
) -> dict[str, Any]:
    return {
        "op": "run",
        "id": id,
        "sources": {lang.source_file: spec.code},
        "files": spec.files,
        "stdin": spec.stdin,
        "stages": [stage.to_wire() for stage in stages],
        "fetch": list(spec.fetch_files),
        "max_output": output_cap(spec, config),
        "max_fetch": config.max_fetch_bytes,
    }
