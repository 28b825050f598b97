"""PID 1's handles on the template and its spares, run in this process (no jail): the
template answers only while it lives, and forks each spare as its caller's child."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from node.fncall.nsjail.zygote.handles import Spare, Template, TemplateGone
from node.fncall.nsjail.zygote.siblingfork import SiblingFork

FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def frozen_group() -> Any:
    """A cgroup v1 freezer group of this test's (the machine's hybrid hierarchy)."""
    group = FREEZER / f"corral-test-template-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        group.rmdir()


def test_a_killed_template_not_yet_scheduled_fails_the_check(frozen_group: Path) -> None:
    """The code sends the template SIGKILL, and the template has not run since (frozen
    here; on a busy machine, not yet scheduled): it is not dead yet, so ``alive`` still
    says yes, and a jail cleaned on that word served its next call with no template
    (CI, 2026-12-02). ``check`` needs an answer, which only a living template gives."""
    template = Template()
    try:
        template.check(timeout=5)  # a living template answers
        (frozen_group / "cgroup.procs").write_text(str(template.pid))
        (frozen_group / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 5
        while (frozen_group / "freezer.state").read_text().strip() != "FROZEN":
            assert time.monotonic() < deadline, "the template did not freeze"
            time.sleep(0.01)
        os.kill(template.pid, signal.SIGKILL)
        assert template.alive()  # the signal is not delivered yet
        with pytest.raises(TemplateGone, match="did not answer"):
            template.check(timeout=0.5)
        (frozen_group / "freezer.state").write_text("THAWED")
        os.waitpid(template.pid, 0)  # it dies as soon as it runs
        assert not template.alive()
        with pytest.raises(TemplateGone):
            template.check(timeout=5)
    finally:
        template.sock.close()
        os.close(template.pidfd)


def test_the_template_forks_a_spare_as_its_callers_child() -> None:
    """The spare is the caller's child (in a jail, PID 1's), forked by the template
    directly (``SiblingFork``): here the caller is the test process, which can wait for it.
    Through a courier, the orphaned spare would go to the host's init instead."""
    assert SiblingFork().available()  # x86-64 with glibc: the direct fork is used
    template = Template()
    spare = None
    try:
        spare = Spare(template)
        assert os.waitpid(spare.pid, os.WNOHANG) == (0, 0)  # ours, waiting for its stage
        stat = Path(f"/proc/{spare.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) == os.getpid()  # its parent
    finally:
        if spare is not None:
            spare.discard()
        template.sock.close()  # the template exits at the end of its input
        os.waitpid(template.pid, 0)
        os.close(template.pidfd)
    with pytest.raises(ChildProcessError):
        os.waitpid(spare.pid, os.WNOHANG)  # reaped by discard()
