"""What an invocation's row keeps and what goes to blobs, and how the parts come back."""

from __future__ import annotations

import json

from app.db import outputs
from app.db.outputs import INLINE_BYTES, PREVIEW_CHARS, REFS
from wire.execution import RunResult, StageResult, StageStatus


def result(stdout: str = "", stderr: str = "", **extra: object) -> RunResult:
    run = StageResult(status=StageStatus.FINISHED, exit_code=0, stdout=stdout, stderr=stderr)
    return RunResult(run=run, **extra)  # type: ignore[arg-type]


def test_small_parts_stay_in_the_row_and_the_run_output_in_its_columns() -> None:
    split = outputs.split_result(result("out", "err", files={"a.txt": "YQ=="}))

    assert split.blobs == []
    assert (split.stdout, split.stderr) == ("out", "err")
    assert split.result["run"]["stdout"] == "" and REFS not in split.result
    back, missing = outputs.join_result(split.result, split.stdout, split.stderr, {})
    assert missing == []
    assert back == result("out", "err", files={"a.txt": "YQ=="})


def test_a_large_part_goes_to_a_blob_and_the_row_keeps_its_preview() -> None:
    big = "x" * (INLINE_BYTES + 1)
    split = outputs.split_result(result(big, "fine"))

    (blob,) = split.blobs
    assert blob.name == "run.stdout" and blob.data == big.encode()
    assert split.stdout == big[:PREVIEW_CHARS]
    assert split.stderr == "fine"
    assert split.result[REFS] == {"run.stdout": {"id": blob.id, "size": len(big)}}
    assert outputs.blob_ids(split.result) == [blob.id]
    assert outputs.blob_bytes(split.result) == len(big)
    assert len(json.dumps(split.result)) < 2 * PREVIEW_CHARS  # the row stays small

    whole, missing = outputs.join_result(
        split.result, split.stdout, split.stderr, {blob.id: blob.data}
    )
    assert missing == [] and whole.run is not None
    assert whole.run.stdout == big and not whole.run.stdout_truncated


def test_a_part_without_its_blob_answers_as_its_preview_marked_truncated() -> None:
    big_out, big_file = "é" * INLINE_BYTES, "Zm9v" * INLINE_BYTES
    split = outputs.split_result(result(big_out, files={"big.bin": big_file, "s": "cw=="}))
    assert {b.name for b in split.blobs} == {"run.stdout", "files/big.bin"}

    back, missing = outputs.join_result(split.result, split.stdout, split.stderr, {})
    assert sorted(missing) == ["files/big.bin", "run.stdout"]
    assert back.run is not None
    assert back.run.stdout == big_out[:PREVIEW_CHARS] and back.run.stdout_truncated
    assert back.files == {"s": "cw=="}  # a file has no preview: it is left out


def test_a_nul_is_kept_in_the_json_whatever_the_size() -> None:
    small, large = "a\x00b", "\x00" * (INLINE_BYTES + 5)
    for text in (small, large):
        split = outputs.split_result(result(text))
        assert "\x00" not in split.stdout  # a PostgreSQL text column cannot hold it
        contents = {b.id: b.data for b in split.blobs}
        back, missing = outputs.join_result(split.result, split.stdout, split.stderr, contents)
        assert missing == [] and back.run is not None and back.run.stdout == text


def test_compile_output_and_stderr_are_split_too() -> None:
    big = "e" * (INLINE_BYTES * 2)
    compile_stage = StageResult(status=StageStatus.FINISHED, exit_code=1, stderr=big)
    split = outputs.split_result(RunResult(compile=compile_stage))
    assert [b.name for b in split.blobs] == ["compile.stderr"]
    assert split.result["compile"]["stderr"] == big[:PREVIEW_CHARS]
    back, _ = outputs.join_result(split.result, "", "", {split.blobs[0].id: big.encode()})
    assert back.compile is not None and back.compile.stderr == big


def test_a_request_keeps_large_code_and_stdin_in_blobs() -> None:
    request = {"language": "python", "code": "c" * (INLINE_BYTES + 1), "stdin": "small"}
    kept, blobs = outputs.split_request(request)
    assert [b.name for b in blobs] == ["request.code"]
    assert kept["code"] == "c" * PREVIEW_CHARS and kept["stdin"] == "small"
    assert kept[REFS]["request.code"]["size"] == INLINE_BYTES + 1
    assert request["code"] == "c" * (INLINE_BYTES + 1)  # the caller's dict is not changed
