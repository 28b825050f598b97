"""The SDK and ``corral sandbox exec`` on real containers (crun) with the ``python`` image."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from corral import Corral
from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.corral.server import new_tenant, until_stopped, wait_for_sandboxes
from tests.node.sandboxes.conftest import leftovers

pytestmark = [pytest.mark.crun, pytest.mark.slow]

STREAMED = "import time; print('first', flush=True); time.sleep(1.5); print('last')"


def test_python_through_the_sdk_and_the_cli(
    live_server: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)
    url = live_server(sandbox_backends=["crun"], images_dir=python_images_dir())
    wait_for_sandboxes(url, new_tenant(url, "warm-up"), "crun")
    key = new_tenant(url, "crun-sdk")
    with Corral(url, key) as client:
        with client.sandboxes.create("python", memory_mb=256) as sbx:
            ran = sbx.exec(["python3", "-c", "import sys; print(sys.version_info[:2])"])
            assert ran.ok and ran.stdout == "(3, 11)\n", ran

            arrivals: list[tuple[float, str]] = []
            result = sbx.exec(
                ["python3", "-c", STREAMED],
                on_stdout=lambda data: arrivals.append((time.monotonic(), data)),
            )
            returned = time.monotonic()
            assert result.ok and result.stdout == "first\nlast\n"
            assert "".join(data for _, data in arrivals) == "first\nlast\n"
            seen, first_line_at = "", returned
            for at, data in arrivals:  # the chunks are cut wherever the writes were
                seen += data
                if "first\n" in seen:
                    first_line_at = min(first_line_at, at)
            assert returned - first_line_at > 1.0  # the first line came while it still ran

            entry = sbx.files.write("/home/user/run.sh", "#!/bin/sh\necho ran $1\n", mode=0o755)
            assert entry.mode == 0o755 and entry.owner == "1000"
            assert sbx.exec("./run.sh x").stdout == "ran x\n"

            env = {"CORRAL_URL": url, "CORRAL_API_KEY": key}
            cli = CliRunner().invoke(
                main,
                [
                    "sandbox",
                    "exec",
                    sbx.id,
                    "--",
                    "python3",
                    "-c",
                    "import sys; print(6 * 7); sys.exit(4)",
                ],
                env=env,
            )
            assert (cli.exit_code, cli.stdout) == (4, "42\n"), cli.output
            sandbox_id = sbx.id
        assert until_stopped(sbx) == "stopped"  # killed at the block's end, torn down
    assert leftovers(tmp_path / "data", sandbox_id) == []
