"""Usage and cost: a tenant sees its own, the operator everyone's and the platform's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from starlette.responses import Response

from app.auth.principal import Admin
from app.errors import AdminRequired
from app.http.endpoint import Call, endpoint
from app.schemas.usage import UsageQuery, UsageReport, UsageRow
from app.usage import report
from app.usage.report import Line, as_row

TAGS = ["usage"]


@endpoint(
    "GET",
    "/v1/usage",
    summary="Use and cost over a time range, grouped (JSON or CSV)",
    tags=TAGS,
    auth="tenant_or_admin",
    query=UsageQuery,
    response=UsageReport,
    stream=("text/csv", "one row per group, then a total row"),
)
async def get_usage(call: Call) -> UsageReport | Response:
    q: UsageQuery = call.query
    end = q.end or datetime.now(UTC)
    start = q.start or end - timedelta(hours=24)
    if isinstance(call.principal, Admin):
        tenant_id = q.tenant
    else:
        tenant_id = call.tenant.tenant_id
        if q.tenant is not None and q.tenant != tenant_id:
            raise AdminRequired("only the operator reads another tenant's usage")
    prices = call.services.settings.prices
    async with call.services.sessions() as session:
        lines = await report.report(
            session,
            start=start,
            end=end,
            group_by=q.groups,
            prices=prices,
            tenant_id=tenant_id,
        )
    first, last = report.whole_hours(start, end)
    if q.format == "csv":
        return Response(report.as_csv(q.groups, lines), media_type="text/csv")
    total = report.total_of(q.groups, lines)
    return UsageReport(
        start=first,
        end=last,
        group_by=list(q.groups),
        currency=prices.currency,
        rows=[_row(line) for line in lines],
        total=_row(total),
    )


def _row(line: Line) -> UsageRow:
    flat = as_row(line)
    return UsageRow(group=line.key, **{k: v for k, v in flat.items() if k not in line.key})


endpoints = [get_usage]
