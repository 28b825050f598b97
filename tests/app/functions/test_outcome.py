"""A function's answer from its stored invocation, when a large output is left out."""

from __future__ import annotations

from app.db.models import Invocation
from app.functions import outcome
from app.invocations.projection import ELIDED, Projection
from wire.execution import RunResult, StageResult, StageStatus


def row(status: str = "succeeded") -> Invocation:
    return Invocation(id="inv_1", tenant_id="ten_1", kind="function", status=status)


def finished(stdout: str, *, truncated: bool = False) -> RunResult:
    stage = StageResult(
        status=StageStatus.FINISHED, exit_code=0, stdout=stdout, stdout_truncated=truncated
    )
    return RunResult(run=stage)


def test_a_whole_output_is_parsed() -> None:
    answer = outcome.invoke_response(
        row(), Projection(finished('{"a": 1}')), function="f", version=1
    )
    assert (answer.status, answer.output, answer.omitted_outputs) == ("succeeded", {"a": 1}, {})


def test_an_output_left_out_of_the_answer_is_named_not_judged_bad() -> None:
    preview = finished('{"a": "xxxx', truncated=True)  # a preview cannot be parsed
    answer = outcome.invoke_response(
        row(), Projection(preview, {"run.stdout": ELIDED}), function="f", version=1
    )
    assert answer.status == "succeeded" and answer.error is None
    assert answer.output is None
    assert answer.omitted_outputs == {"output": "batch_response_cap"}


def test_an_output_over_the_limit_is_still_a_bad_output() -> None:
    answer = outcome.invoke_response(
        row(), Projection(finished("{", truncated=True)), function="f", version=1
    )
    assert answer.status == "failed" and answer.error is not None
    assert answer.error.code == "bad_function_output"
