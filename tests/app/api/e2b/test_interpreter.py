"""The ``e2b-code-interpreter`` SDK, unchanged, against Corral on crun."""

from __future__ import annotations

import base64
import time

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

from tests.app.api.e2b.conftest import Corral

pytestmark = [pytest.mark.crun, pytest.mark.slow]


def test_run_code_keeps_state_streams_and_reports_errors(corral: Corral) -> None:
    sbx = Sandbox.create(timeout=120)  # the SDK's default template, code-interpreter-v1
    try:
        first = sbx.run_code("x = 40\nimport os\nprint('set', os.getcwd())")
        assert first.error is None and first.logs.stdout == ["set /home/user\n"]
        assert first.results == []
        second = sbx.run_code("x + 2")
        assert second.text == "42" and second.results[0].is_main_result

        seen: list[str] = []
        streamed = sbx.run_code(
            "import sys, subprocess\n"
            "for i in range(3):\n"
            "    print(i, flush=True)\n"
            "print('err', file=sys.stderr)\n"
            "subprocess.run(['echo', 'from a child'])\n"
            "{'k': [1, 2]}",
            on_stdout=lambda m: seen.append(m.line),
        )
        assert "".join(streamed.logs.stdout) == "0\n1\n2\nfrom a child\n"
        assert "".join(seen) == "0\n1\n2\nfrom a child\n"
        assert streamed.logs.stderr == ["err\n"]
        assert streamed.text == "{'k': [1, 2]}"

        failed = sbx.run_code("def f():\n    return 1 / 0\nf()")
        assert failed.error is not None
        assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
        assert "return 1 / 0" in failed.error.traceback
        assert sbx.run_code("x").text == "40"  # an error keeps the state

        envs = sbx.run_code("import os; os.environ.get('CELL')", envs={"CELL": "c"})
        assert envs.text == "'c'"
        assert sbx.run_code("'CELL' in os.environ").text == "False"
    finally:
        sbx.kill()


def test_contexts_are_separate_states(corral: Corral) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.run_code("who = 'default'")
        ctx = sbx.create_code_context(cwd="/tmp")
        assert ctx.cwd == "/tmp" and ctx.language == "python"
        sbx.run_code("who = 'other'", context=ctx)
        assert sbx.run_code("who").text == "'default'"
        assert sbx.run_code("who", context=ctx).text == "'other'"
        assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
        assert {c.id for c in sbx.list_code_contexts()} == {"default", ctx.id}
        assert sbx.commands.list() == []  # the workers are Corral's, not the user's
        sbx.remove_code_context(ctx)
        assert [c.id for c in sbx.list_code_contexts()] == ["default"]
    finally:
        sbx.kill()


def test_a_cell_past_its_timeout_is_interrupted_and_the_state_kept(corral: Corral) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.run_code("kept = 'yes'")
        began = time.monotonic()
        with pytest.raises(TimeoutException):
            sbx.run_code("import time\nwhile True: time.sleep(0.05)", timeout=1)
        assert time.monotonic() - began < 10
        assert sbx.run_code("kept").text == "'yes'"

        with pytest.raises(TimeoutException):
            sbx.run_code(
                "import signal, time\n"
                "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True: time.sleep(0.05)",
                timeout=1,
            )
        time.sleep(4)  # the grace for SIGINT, then the worker is killed
        assert sbx.run_code("'kept' in globals()").text == "False"  # started again, empty
    finally:
        sbx.kill()


PNG = b"\x89PNG\r\n\x1a\n"


def test_charts_come_back_as_png_and_tables_as_html(corral: Corral) -> None:
    """As E2B's interpreter: ``plt.show()`` and the figures a cell leaves open give
    ``png`` results, a Figure as the last expression too; a DataFrame gives its HTML and
    text; the stock data-science packages import (the ``data`` image)."""
    sbx = Sandbox.create(timeout=120)
    try:
        shown = sbx.run_code(
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [2, 4, 1])\n"
            "plt.title('shown')\n"
            "plt.show()\n"
            "print('after')"
        )
        assert shown.error is None, shown.error
        assert shown.logs.stdout == ["after\n"] and shown.logs.stderr == []
        [chart] = shown.results
        assert base64.b64decode(chart.png).startswith(PNG) and not chart.is_main_result

        left_open = sbx.run_code("plt.bar(['a', 'b'], [3, 5])\nNone")
        assert [base64.b64decode(r.png)[:8] for r in left_open.results] == [PNG]
        assert sbx.run_code("plt.get_fignums()").text == "[]"  # shown once, then closed

        figure = sbx.run_code("fig, ax = plt.subplots()\nax.plot([0, 1])\nfig")
        [main] = figure.results
        assert main.is_main_result and base64.b64decode(main.png).startswith(PNG)
        assert main.text.startswith("<Figure size")

        table = sbx.run_code(
            "import numpy as np, pandas as pd\npd.DataFrame({'a': np.arange(3), 'b': list('xyz')})"
        )
        assert table.error is None, table.error
        assert "<table" in table.results[0].html and "a  b" in table.text

        stock = sbx.run_code(
            "import PIL, scipy, sklearn, seaborn, requests, bs4, openpyxl, sympy\n"
            "import subprocess\n"
            "subprocess.run(['pip', 'install', '--dry-run', '--no-index', 'nothing'],"
            " capture_output=True, text=True).stderr"
        )
        assert stock.error is None, stock.error
        assert "externally-managed-environment" not in stock.text  # pip is not walled off
    finally:
        sbx.kill()
