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
def vm_root() -> Iterator[Path]:
    """The microVM directory of the server (QEMU runs unprivileged: it must be reachable,
    and pytest's are 0700)."""
    require_microvm()
    root = Path(tempfile.mkdtemp(prefix="corral-e2b-microvm-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def vm_corral(
    live_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch, vm_root: Path
) -> Corral:
    url = live_server(
        sandbox_backends=["crun", "microvm"],
        images_dir=python_images_dir(),
        sandbox_microvm_dir=vm_root,
        # KVM where it works (the probe's answer is the process's: the backend tests on
        # this worker probed already)
        sandbox_microvm_accelerator="auto",
        # a warm clone of the image kept paused: the SDK's create (the default size)
        # claims it
        sandbox_warm={"python": 1},
    )
    return _pointed_at(url, monkeypatch)


def test_an_e2b_session_runs_on_a_microvm(vm_corral: Corral, vm_root: Path) -> None:
    sbx = Sandbox.create(template="python", timeout=300, metadata={"backend": "microvm"})
    try:
        # the node's warm clone became this sandbox (its run directory answers to its id)
        assert (vm_root / "vms" / sbx.sandbox_id).is_symlink()
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
