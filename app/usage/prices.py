"""What usage costs: one price per quantity, set by the operator (``CORRAL_PRICES``).

The defaults are illustrative figures of the order of public clouds' on-demand prices,
in US dollars; an operator sets its own. A price applies to what the usage events
measure: CPU-seconds, GB-seconds of memory (a call's peak for its run; a sandbox's or
an idle warm worker's reservation for its life), instance-hours by backend (a sandbox
alive, paused included; the jail or wasm instance a call held from its setup to its
teardown, so a call that had to start its own jail pays for the start; a warm worker
held idle), bytes transferred (into a call and out of it) and GB-months stored (a
tenant's large outputs, function artifacts and snapshots, sampled by
``app.usage.storage``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

GB = 1_000_000_000
#: the month a stored GB is priced by
MONTH_S = 30 * 86_400
#: what a cost is split into
COST_PARTS = ("cpu", "memory", "instances", "transfer", "storage")


class Prices(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: str = Field("USD", min_length=1, max_length=8)
    cpu_second: float = Field(0.0000125, ge=0, description="per CPU-second")
    gb_second: float = Field(0.0000015, ge=0, description="per GB-second of memory")
    instance_hour: dict[str, float] = Field(
        default_factory=lambda: {"crun": 0.005, "qemu": 0.01, "nsjail": 0.002, "wasm": 0.0005},
        description="per hour of an instance held, by backend: a sandbox alive, a jail or "
        "wasm instance from a call's setup to its teardown, an idle warm worker",
    )
    default_instance_hour: float = Field(0.0, ge=0, description="for a backend not listed")
    gb_transferred: float = Field(0.02, ge=0, description="per GB into or out of a call")
    gb_month_stored: float = Field(
        0.023, ge=0, description="per GB kept stored for a month (30 days)"
    )

    def of(
        self,
        runtime: str,
        *,
        cpu_ms: float,
        memory_mb_seconds: float,
        instance_seconds: float,
        stored_gb_seconds: float = 0.0,
        bytes_moved: int,
    ) -> dict[str, float]:
        """The cost of one group's use, by quantity."""
        hourly = self.instance_hour.get(runtime, self.default_instance_hour)
        return {
            "cpu": cpu_ms / 1000.0 * self.cpu_second,
            "memory": memory_mb_seconds / 1024.0 * self.gb_second,
            "instances": instance_seconds / 3600.0 * hourly,
            "transfer": bytes_moved / GB * self.gb_transferred,
            "storage": stored_gb_seconds / MONTH_S * self.gb_month_stored,
        }
