"""The Connect envelope codec and the error mapping, without a server."""

from __future__ import annotations

import json
import struct

from app.api.e2b.connect import FLAG_END_STREAM, end_of_stream, envelope
from app.api.e2b.errors import CONNECT_STATUS, SandboxGone, as_corral, connect_code
from app.errors import Conflict, InvalidApiKey, NotFound, PathNotFound, SandboxNotRunning


def _frame(data: bytes) -> tuple[int, dict[str, object]]:
    flags, size = struct.unpack(">BI", data[:5])
    assert len(data) == 5 + size
    return flags, json.loads(data[5:])


def test_messages_and_the_end_of_a_stream_are_enveloped() -> None:
    assert _frame(envelope({"event": {"start": {"pid": 7}}})) == (
        0,
        {"event": {"start": {"pid": 7}}},
    )
    assert _frame(end_of_stream()) == (FLAG_END_STREAM, {})
    flags, body = _frame(end_of_stream(PathNotFound("no /x")))
    assert flags == FLAG_END_STREAM
    assert body == {"error": {"code": "not_found", "message": "no /x"}}


def test_errors_map_to_the_codes_the_sdk_branches_on() -> None:
    assert connect_code(Conflict("exists")) == "already_exists"  # make_dir -> False
    assert connect_code(NotFound("gone")) == "not_found"  # kill -> False, exists -> False
    assert connect_code(InvalidApiKey()) == "unauthenticated"
    gone = as_corral(SandboxNotRunning("stopped"))
    assert isinstance(gone, SandboxGone) and gone.status == 502
    assert "was not found" in gone.message  # the SDK: SandboxNotRunningException
    assert connect_code(gone) == "unavailable"
    assert CONNECT_STATUS[connect_code(as_corral(ValueError("bad")))] == 400
