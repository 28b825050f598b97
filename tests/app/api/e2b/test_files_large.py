"""A large file through the ``e2b`` SDK's ``files``, unchanged, on crun: written streamed
(octet-stream, and multipart/form-data as ``use_octet_stream=False`` sends it) and read
streamed, byte for byte, with the server's memory flat (gateway and node run in this
process: a body held whole, or spooled, would show in its resident memory)."""

from __future__ import annotations

import pytest
from e2b import Sandbox

from tests.app.api.e2b.conftest import Corral
from tests.app.sandboxes.large import PeakMemory, Sink, Source

pytestmark = [pytest.mark.crun, pytest.mark.slow]

#: the file's size (issue 31: 1 GiB round trips in the suite)
SIZE = 1 << 30
#: the most the server's resident memory may grow while it travels
FLAT = 64 << 20


@pytest.fixture
def big_corral(live_server: object, monkeypatch: pytest.MonkeyPatch) -> Corral:
    """A Corral whose E2B sandboxes hold a file of ``SIZE`` (their files count against
    their memory)."""
    from tests.app.api.e2b.conftest import _pointed_at
    from tests.app.api.v1.test_sandboxes_crun import python_images_dir

    size_mb = (SIZE >> 20) + 512
    url = live_server(  # type: ignore[operator]
        sandbox_backends=["crun"],
        images_dir=python_images_dir(),
        e2b_sandbox_memory_mb=size_mb,
        e2b_sandbox_disk_mb=size_mb,
    )
    return _pointed_at(url, monkeypatch)


@pytest.mark.parametrize("octet_stream", [True, False], ids=["octet-stream", "multipart"])
def test_a_large_file_round_trips_with_memory_flat(big_corral: Corral, octet_stream: bool) -> None:
    sbx = Sandbox.create(template="python", timeout=300)
    try:
        source = Source(SIZE)
        with PeakMemory() as up:
            info = sbx.files.write("/home/user/big.bin", source, use_octet_stream=octet_stream)
        assert info.path == "/home/user/big.bin"
        assert sbx.files.get_info("/home/user/big.bin").size == SIZE
        sink = Sink()
        with PeakMemory() as down:
            for chunk in sbx.files.read("/home/user/big.bin", format="stream"):
                sink.write(chunk)
        assert (sink.size, sink.digest()) == (SIZE, source.digest())
        assert up.growth < FLAT, up.growth >> 20  # a memory bound, not a timing
        assert down.growth < FLAT, down.growth >> 20
    finally:
        sbx.kill()
