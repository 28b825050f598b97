"""Throttling made visible: every time a quota delays or refuses a tenant's request.

Admission (``app.quotas.admission``, ``app.sandboxes.admission``) calls ``note`` when a
request waited for a token or a concurrency slot (``delayed``) or was refused with a 429
(``refused``). Each note is

* counted in ``corral_throttled_total{tenant,quota,outcome}`` on this gateway;
* counted per tenant and quota where every gateway sees it (``QuotaCounters``: Redis in
  a cluster, memory embedded), which the tenant's API answer (``throttled``) and the
  console's tenant page show;
* told to the caller: a refusal carries ``Retry-After`` and ``RateLimit-Limit``,
  ``RateLimit-Remaining`` and ``RateLimit-Reset`` (``app.errors.QuotaExceeded``); a
  request that was only delayed is answered with ``RateLimit-Limit``,
  ``RateLimit-Remaining: 0`` and ``Corral-Throttled: <quota>;waited=<seconds>``
  (``ThrottleHeaders``, through a context variable the request's handling shares).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from app.metrics import Metrics
    from app.quotas.counters import QuotaCounters

log = logging.getLogger(__name__)

Outcome = Literal["delayed", "refused"]


@dataclass(frozen=True, slots=True)
class Delay:
    """A quota that made this request wait."""

    quota: str
    limit: float
    waited_s: float


#: The delays of the request being handled (set by ``ThrottleHeaders``).
_DELAYS: ContextVar[list[Delay] | None] = ContextVar("corral_throttle_delays", default=None)


class Throttles:
    def __init__(self, metrics: Metrics, counters: QuotaCounters) -> None:
        self._metrics = metrics
        self._counters = counters

    async def note(
        self,
        tenant_id: str,
        quota: str,
        outcome: Outcome,
        *,
        limit: float,
        waited_s: float = 0.0,
    ) -> None:
        self._metrics.throttled.labels(tenant_id, quota, outcome).inc()
        if outcome == "delayed":
            delays = _DELAYS.get()
            if delays is not None:
                delays.append(Delay(quota, limit, waited_s))
        try:
            await self._counters.count_throttle(tenant_id, quota, outcome)
        except Exception as exc:  # shown a little short; the request is not failed for it
            log.warning("tenant %s: counting a throttle failed: %r", tenant_id, exc)


def _number(value: float) -> bytes:
    return (f"{value:g}" if value != int(value) else str(int(value))).encode()


class ThrottleHeaders:
    """Raw ASGI middleware: a response to a request a quota delayed says so."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        delays: list[Delay] = []
        token = _DELAYS.set(delays)

        async def tell(message: Message) -> None:
            if message["type"] == "http.response.start" and delays:
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"ratelimit-limit" for name, _ in headers):
                    first = delays[0]
                    headers += [
                        (b"ratelimit-limit", _number(first.limit)),
                        (b"ratelimit-remaining", b"0"),
                    ]
                waited = ", ".join(f"{d.quota};waited={d.waited_s:.3f}" for d in delays)
                headers.append((b"corral-throttled", waited.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, tell)
        finally:
            _DELAYS.reset(token)
