"""smolagents on Corral, unchanged: its E2B executor (what its CodeAgent runs
model-written code with) driven without a model, and a stock ``CodeAgent`` with
``executor_type="e2b"`` run over several steps by a scripted model (no LLM), its tools
sent into the sandbox (their code imports numpy and PIL: the ``data`` image, E2B's
``code-interpreter-v1`` template, has them)."""

from __future__ import annotations

from typing import Any

import pytest
from smolagents import CodeAgent, Tool
from smolagents.models import ChatMessage, MessageRole, Model
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


class Scripted(Model):
    """A model that answers each step with the next of its replies."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)

    def generate(self, messages: list[ChatMessage], **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


class Square(Tool):
    name = "square"
    description = "The square of a number."
    inputs = {"x": {"type": "number", "description": "the number"}}
    output_type = "number"

    def forward(self, x: float) -> float:
        return x * x


def test_a_stock_code_agent_runs_a_multi_step_tool_session(corral: Corral) -> None:
    model = Scripted(
        [
            "Thought: the data first.\n<code>\nimport numpy as np\nfrom PIL import Image\n"
            "total = int(np.arange(5).sum())\nprint('total', total)\n</code>",
            "Thought: a tool on it.\n<code>\nsq = square(x=total)\nprint(sq)\n</code>",
            "Thought: done.\n<code>\nfinal_answer(sq + 1)\n</code>",
        ]
    )
    agent = CodeAgent(
        tools=[Square()],
        model=model,
        executor_type="e2b",
        executor_kwargs={"timeout": 120},
        verbosity_level=LogLevel.OFF,
    )
    try:
        answer = agent.run("Add up 0..4, square it, add one.", max_steps=5)
        assert answer == 101
        assert model.replies == []  # three steps, each run in the sandbox
        observations = [getattr(s, "observations", None) or "" for s in agent.memory.steps]
        assert any("total 10" in o for o in observations)
        assert any("100" in o for o in observations)
    finally:
        agent.cleanup()
