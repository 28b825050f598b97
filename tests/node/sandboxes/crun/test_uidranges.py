"""The host-wide registry of sandboxes' id ranges: allocation, release, crash reclaim."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from node.sandboxes.base import NodeFull
from node.sandboxes.crun.uidranges import SIZE, UidRanges


def ranges(tmp_path: Path, slots: int = 8) -> UidRanges:
    # far from the host registry's ranges: live sandboxes of other tests run as those
    return UidRanges(tmp_path / "registry", first=3 << 30, slots=slots)


def holder(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "sandboxes" / name
    path.mkdir(parents=True)
    return path


def test_each_holder_gets_a_range_no_other_holds_and_its_own_root_dir(tmp_path: Path) -> None:
    registry = ranges(tmp_path)
    got = [registry.allocate(holder(tmp_path, f"s{i}")) for i in range(3)]
    assert len({r.slot for r in got}) == 3
    firsts = sorted(r.first for r in got)
    assert all(b - a >= SIZE for a, b in itertools.pairwise(firsts))
    assert got[0].mapping() == f"0 {got[0].first} {SIZE}"
    for ids in got:
        directory = registry.rootfs(ids).parent
        info = directory.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (ids.first,) * 2 + (0o700,)
    assert stat.S_IMODE(registry.registry.stat().st_mode) == 0o711  # searchable, not listable
    assert registry.held(tmp_path / "sandboxes" / "s1") == got[1]


def test_two_nodes_on_one_host_never_hand_out_one_range(tmp_path: Path) -> None:
    first, second = ranges(tmp_path, slots=64), ranges(tmp_path, slots=64)
    holders = [holder(tmp_path, f"h{i}") for i in range(40)]
    with ThreadPoolExecutor(8) as pool:
        got = list(
            pool.map(
                lambda ih: (first if ih[0] % 2 else second).allocate(ih[1]), enumerate(holders)
            )
        )
    assert len({r.slot for r in got}) == 40


def test_a_released_range_is_handed_out_again_and_only_its_holder_releases_it(
    tmp_path: Path,
) -> None:
    registry = ranges(tmp_path, slots=1)
    a = holder(tmp_path, "a")
    ids = registry.allocate(a)
    with pytest.raises(NodeFull):
        registry.allocate(holder(tmp_path, "b"))
    registry.release(tmp_path / "sandboxes" / "b", ids.slot)  # not b's: kept
    assert registry.held(a) == ids
    registry.release(a, ids.slot)
    assert not registry.rootfs(ids).parent.exists()
    assert registry.allocate(tmp_path / "sandboxes" / "b") == ids


def test_a_crashed_nodes_ranges_are_reclaimed_once_their_sandboxes_are_gone(
    tmp_path: Path,
) -> None:
    registry = ranges(tmp_path, slots=2)
    gone, alive = holder(tmp_path, "gone"), holder(tmp_path, "alive")
    lost = registry.allocate(gone)
    kept = registry.allocate(alive)
    gone.rmdir()  # the node died and its data went with it
    assert registry.reclaim() == 1
    assert registry.held(alive) == kept
    assert registry.allocate(holder(tmp_path, "new")) == lost


def test_a_full_registry_reclaims_before_it_refuses(tmp_path: Path) -> None:
    registry = ranges(tmp_path, slots=1)
    gone = holder(tmp_path, "gone")
    ids = registry.allocate(gone)
    gone.rmdir()
    assert registry.allocate(holder(tmp_path, "next")) == ids


def test_a_range_some_process_still_runs_as_is_not_reclaimed(tmp_path: Path) -> None:
    registry = ranges(tmp_path, slots=1)
    orphan = holder(tmp_path, "orphan")
    ids = registry.allocate(orphan)
    orphan.rmdir()
    uid = ids.host(1000)
    sleeper = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "30"]
    )
    try:
        while os.stat(f"/proc/{sleeper.pid}").st_uid != uid:  # setpriv has switched
            time.sleep(0.005)
        assert registry.reclaim() == 0  # its sandbox outlived its directory: keep out
        assert (registry.registry / str(ids.slot)).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert registry.reclaim() == 1


def test_ranges_must_fit_in_32_bits() -> None:
    with pytest.raises(ValueError):
        UidRanges(Path("/nonexistent"), first=(1 << 32) - SIZE, slots=2)


def test_the_registry_files_are_root_only(tmp_path: Path) -> None:
    registry = ranges(tmp_path)
    ids = registry.allocate(holder(tmp_path, "x"))
    assert stat.S_IMODE(os.stat(registry.registry / str(ids.slot)).st_mode) == 0o600
