"""PID 1's start-up helpers, run in this process."""

from __future__ import annotations

from node.fncall.nsjail.zygote.startup import _vm_bytes


def test_the_zygotes_mapped_size_is_vmsize() -> None:
    """``_vm_bytes`` (read raw from ``/proc/self/statm``) is what ``/proc/self/status``
    calls ``VmSize``: the base the code's ``RLIMIT_AS`` is added to."""

    def vm_size() -> int:
        with open("/proc/self/status") as status:
            line = next(x for x in status if x.startswith("VmSize:"))
        return int(line.split()[1]) * 1024

    for _ in range(10):  # until no other thread of this process mapped or unmapped meanwhile
        before, status, after = _vm_bytes(), vm_size(), _vm_bytes()
        if before == after:
            break
    assert before > 0 and before == status == after
