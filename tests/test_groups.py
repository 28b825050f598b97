"""tests/groups.py under pytest-xdist: a group's tests run on one worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CONFTEST = """
import pytest

from tests.groups import assign_group, name_for_xdist


def pytest_itemcollected(item):
    assign_group(item)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "loadgroup", False):
        for item in items:
            name_for_xdist(item)
"""

TESTS = """
import pytest


@pytest.mark.crun
@pytest.mark.parametrize("n", range(4))
def test_container(n):
    pass


@pytest.mark.nsjail
def test_jail():
    pass


@pytest.mark.parametrize("n", range(4))
def test_anything(n):
    pass
"""


def test_a_groups_tests_run_on_one_worker_and_say_their_group(tmp_path: Path) -> None:
    """Four parametrized tests of the ``crun`` group, on two workers: all on one (xdist
    3.8 on pytest 9.2 spread them, its group names set where pytest no longer reads them),
    and each id ends with its group, after its parameters, in the report as well."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_grouped.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v"),
            *("-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", str(tmp_path)),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", done.stdout, re.MULTILINE)
    assert len(ran) == 9, done.stdout
    containers = {worker for worker, test in ran if "test_container" in test}
    assert len(containers) == 1, ran
    assert sorted(test.split("::")[1] for _, test in ran if "test_container" in test) == [
        f"test_container[{n}]@crun" for n in range(4)
    ]
    assert [test.split("::")[1] for _, test in ran if "test_jail" in test] == ["test_jail@nsjail"]
