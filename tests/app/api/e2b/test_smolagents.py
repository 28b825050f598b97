"""smolagents' E2B executor (what its CodeAgent runs model-written code with), driven
without a model: variables sent, code run, its output and errors read back.

Its stock ``final_answer`` tool is not sent: the tool's code imports numpy and PIL,
which the ``python`` image lacks, and a sandbox has no network for the executor's
``!pip install`` (an image with python3-numpy and python3-pil serves it)."""

from __future__ import annotations

import pytest
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import E2BExecutor
from smolagents.utils import AgentError

from tests.app.api.e2b.conftest import Corral

pytestmark = [pytest.mark.crun, pytest.mark.slow]


def test_the_smolagents_e2b_executor_runs_code_with_state(corral: Corral) -> None:
    executor = E2BExecutor(
        additional_imports=[], logger=AgentLogger(level=LogLevel.OFF), timeout=120
    )
    try:
        executor.send_variables({"n": 6})
        step = executor("m = n * 7\nprint('computing')\nm")
        assert (step.output, step.logs.strip(), step.is_final_answer) == ("42", "computing", False)
        assert executor("m + 1").output == "43"
        with pytest.raises(AgentError, match="NameError"):
            executor("undefined_name")
    finally:
        executor.cleanup()
