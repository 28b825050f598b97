"""The sandbox quotas' judgements, as pure functions (``app.sandboxes.admission``)."""

from __future__ import annotations

from app.errors import (
    ConcurrencyLimited,
    SandboxQuotaExhausted,
    SandboxTooLarge,
    SnapshotQuotaExhausted,
    StorageQuotaExhausted,
)
from app.quotas.spec import QuotaLimits
from app.sandboxes.admission import Ask, size_refusal, snapshot_refusal, totals_refusal

DEFAULTS = QuotaLimits()
MIB = 1 << 20


def test_the_defaults_allow_the_default_sandbox_and_refuse_the_reviews_ask() -> None:
    default = Ask.of({})  # a create that asks nothing: 1 CPU, 512 MiB, 1024 MiB of disk
    assert (default.cpu, default.memory_mb, default.disk_mb) == (1.0, 512, 1024)
    assert size_refusal(DEFAULTS, default) is None
    assert totals_refusal(DEFAULTS, [default] * 7, default) is None  # the 8th of 8
    refused = size_refusal(DEFAULTS, Ask(cpu=64, memory_mb=262_144, disk_mb=1_048_576))
    assert isinstance(refused, SandboxTooLarge) and refused.status == 422
    assert refused.code == "sandbox_too_large"
    assert refused.details["quota"] == "max_sandbox_memory_mb"


def test_each_size_names_the_field_it_passes() -> None:
    quota = DEFAULTS.model_copy(
        update={"max_sandbox_memory_mb": 1024, "max_sandbox_cpu": 2.0, "max_sandbox_disk_mb": 2048}
    )
    fits = Ask(cpu=2.0, memory_mb=1024, disk_mb=2048)
    assert size_refusal(quota, fits) is None
    for ask, field in (
        (Ask(cpu=2.0, memory_mb=1025, disk_mb=16), "max_sandbox_memory_mb"),
        (Ask(cpu=2.5, memory_mb=32, disk_mb=16), "max_sandbox_cpu"),
        (Ask(cpu=0.5, memory_mb=32, disk_mb=2049), "max_sandbox_disk_mb"),
    ):
        refused = size_refusal(quota, ask)
        assert refused is not None and refused.details["quota"] == field
        assert field in refused.message


def test_totals_count_the_live_sandboxes_and_the_new_one() -> None:
    quota = DEFAULTS.model_copy(
        update={
            "max_concurrent_sandboxes": 4,
            "max_sandboxes_memory_mb": 2048,
            "max_sandboxes_cpu": 3.0,
            "max_sandboxes_disk_mb": 4096,
        }
    )
    one = Ask(cpu=1.0, memory_mb=1024, disk_mb=1024)
    assert totals_refusal(quota, [one], one) is None  # exactly at the memory total
    memory = totals_refusal(quota, [one, Ask(cpu=0.5, memory_mb=1, disk_mb=16)], one)
    assert isinstance(memory, SandboxQuotaExhausted) and memory.status == 429
    assert memory.details == {
        "quota": "max_sandboxes_memory_mb",
        "limit": 2048,
        "held": 1025,
        "asked": 1024,
    }
    assert memory.headers()["Retry-After"] == "1"
    small = Ask(cpu=1.0, memory_mb=32, disk_mb=16)
    cpu = totals_refusal(quota, [small] * 3, small)
    assert cpu is not None and cpu.details["quota"] == "max_sandboxes_cpu"
    disk = totals_refusal(quota, [Ask(cpu=0.1, memory_mb=32, disk_mb=4000)], Ask(0.1, 32, 97))
    assert disk is not None and disk.details["quota"] == "max_sandboxes_disk_mb"
    count = totals_refusal(quota, [Ask(0.1, 32, 16)] * 4, Ask(0.1, 32, 16))
    assert isinstance(count, ConcurrencyLimited) and count.code == "concurrency_limited"


def test_snapshots_count_and_storage_are_judged_before_a_copy() -> None:
    quota = DEFAULTS.model_copy(update={"max_snapshots": 2, "max_storage_mb": 16})
    assert snapshot_refusal(quota, kept=1, stored_bytes=8 * MIB, adding_bytes=8 * MIB) is None
    kept = snapshot_refusal(quota, kept=2, stored_bytes=0, adding_bytes=0)
    assert isinstance(kept, SnapshotQuotaExhausted) and kept.details["quota"] == "max_snapshots"
    full = snapshot_refusal(quota, kept=0, stored_bytes=16 * MIB, adding_bytes=0)
    assert isinstance(full, StorageQuotaExhausted) and full.code == "storage_quota_exhausted"
    over = snapshot_refusal(quota, kept=0, stored_bytes=10 * MIB, adding_bytes=7 * MIB)
    assert over is not None and over.details["quota"] == "max_storage_mb"
    assert int(over.headers()["Retry-After"]) >= 60
