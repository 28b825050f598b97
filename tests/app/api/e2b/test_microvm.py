"""The unchanged ``e2b`` SDK and ``/v1/sandboxes`` on a microVM sandboxes: the same
session as on a container, chosen by ``metadata={"backend": "microvm"}`` (a real Corral
whose node offers crun and microvm; QEMU under TCG here, KVM where it works)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from tests.app.api.e2b.conftest import Corral, _pointed_at
from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.node.sandboxes.microvm.conftest import require_microvm

pytestmark = [pytest.mark.microvm, pytest.mark.slow]


@pytest.fixture
def vm_corral(live_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Corral]:
    require_microvm()
    # QEMU runs unprivileged: its directory must be reachable (pytest's are 0700)
    root = Path(tempfile.mkdtemp(prefix="corral-e2b-microvm-"))
    root.chmod(0o755)
    try:
        url = live_server(
            sandbox_backends=["crun", "microvm"],
            images_dir=python_images_dir(),
            sandbox_microvm_dir=root,
            # KVM where it works (the probe's answer is the process's: the backend tests
            # on this worker probed already)
            sandbox_microvm_accelerator="auto",
        )
        yield _pointed_at(url, monkeypatch)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_e2b_session_runs_on_a_microvm(vm_corral: Corral) -> None:
    sbx = Sandbox.create(template="python", timeout=300, metadata={"backend": "microvm"})
    try:
        record = httpx.get(
            f"{vm_corral.url}/v1/sandboxes/{sbx.sandbox_id}",
            headers={"Authorization": f"Bearer {vm_corral.key}"},
        ).json()
        assert record["backend"] == "microvm" and record["accelerator"] in ("kvm", "tcg")

        # a kernel of its own, the image's Python, the default user
        done = sbx.commands.run("uname -r; python3 -c 'print(6*7)'; id -un")
        kernel, answer, user = done.stdout.split()
        assert kernel.endswith("cloud-amd64") and answer == "42" and user == "user"

        sbx.files.write("/home/user/notes/a.txt", "from the sdk\n")
        assert sbx.files.read("/home/user/notes/a.txt") == "from the sdk\n"
        assert [e.name for e in sbx.files.list("/home/user/notes")] == ["a.txt"]
        assert sbx.commands.run("cat notes/a.txt", cwd="/home/user").stdout == "from the sdk\n"

        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("exit 3")
        assert failed.value.exit_code == 3
        assert sbx.commands.run("id -u", user="root").stdout.strip() == "0"
    finally:
        assert sbx.kill() is True
