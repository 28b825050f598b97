"""Register and invoke functions: the registry's rules on top of the database and the
invocation service. Route handlers call these; nothing here knows about HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.auth.principal import Principal
from app.db import functions as repo
from app.db.models import Function, FunctionVersion
from app.errors import CorralError, ValidationFailed
from app.functions import artifacts, drivers, outcome, schema
from app.functions.languages import LANGUAGES, MODULE_ENTRY_POINT, Driver
from app.invocations import projection
from app.invocations.limits import limits_for
from app.schemas.functions import (
    BatchInvokeItem,
    FunctionError,
    FunctionManifest,
    InvokeResponse,
)
from wire.execution import RunSpec

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger(__name__)


def driver_for(language: str) -> Driver:
    try:
        return LANGUAGES[language]
    except KeyError:
        offered = ", ".join(sorted(LANGUAGES))
        raise ValidationFailed(
            f"language {language!r} cannot be registered as a function (one of: {offered})"
        ) from None


def resolved_limits(manifest: FunctionManifest, principal: Principal) -> dict[str, Any]:
    """The version's limits, defaults filled in, checked against the tenant's quota."""
    limits = limits_for(
        principal.quota,
        memory_mb=manifest.limits.memory_mb,
        run_timeout_s=manifest.limits.timeout_s,
    )
    return {"timeout_s": limits.run_timeout_s, "memory_mb": limits.memory_mb}


async def register(
    services: Services,
    principal: Principal,
    *,
    name: str,
    manifest: FunctionManifest,
    content: bytes,
) -> tuple[Function, FunctionVersion, bool]:
    """Check everything, then store the artifact and a new version (see ``app.db.functions``)."""
    driver = driver_for(manifest.language)
    entry_point = MODULE_ENTRY_POINT if driver is Driver.MODULE else manifest.entry_point
    artifacts.check_entry_point(driver, entry_point)
    await asyncio.to_thread(schema.check_schema, manifest.input_schema)
    limits = resolved_limits(manifest, principal)
    await artifacts.check_artifact(driver, content, entry_point)
    new = repo.NewVersion(
        name=name,
        language=manifest.language,
        entry_point=entry_point,
        input_schema=manifest.input_schema,
        limits=limits,
        content=content,
        content_hash=artifacts.content_hash(content),
    )
    async with services.sessions.begin() as session:
        fn, version, created = await repo.register(session, tenant_id=principal.tenant_id, new=new)
    services.resolver.forget(principal.tenant_id, name)
    if created:
        log.info(
            "tenant %s: function %s version %s (%s, %s bytes, sha256 %s)",
            principal.tenant_id,
            name,
            version.version,
            version.language,
            len(content),
            version.content_hash[:12],
        )
    return fn, version, created


@dataclass(slots=True)
class Target:
    """One resolved function version, ready to be invoked."""

    name: str
    version: FunctionVersion
    driver: Driver
    artifact: bytes
    validators: schema.Validators

    async def validate(self, values: list[Any]) -> list[CorralError | None]:
        """Check each value against the input schema, all on one work budget
        (``app.functions.schema.validate_inputs``): ``None`` or the error to answer with."""
        return await schema.validate_inputs(
            self.validators, self.version.id, self.version.input_schema, values
        )

    async def valid_spec(self, value: Any, principal: Principal) -> RunSpec:
        """``spec`` of ``value`` once it has passed ``validate`` (else its error)."""
        (error,) = await self.validate([value])
        if error is not None:
            raise error
        return self.spec(value, principal)

    def spec(self, value: Any, principal: Principal) -> RunSpec:
        """The run of ``value``, which has passed ``validate`` (its limits checked against
        the tenant's quota as it is now)."""
        limits = self.version.limits
        return drivers.build_spec(
            language=self.version.language,
            driver=self.driver,
            entry_point=self.version.entry_point,
            artifact=self.artifact,
            artifact_digest=self.version.content_hash,
            input_value=value,
            limits=limits_for(
                principal.quota, memory_mb=limits["memory_mb"], run_timeout_s=limits["timeout_s"]
            ),
        )

    def record(self, value: Any) -> dict[str, Any]:
        """What the invocation row keeps of the request (not the code: it is versioned)."""
        return {"function": self.name, "version": self.version.version, "input": value}


async def target(services: Services, principal: Principal, *, name: str, ref: str | None) -> Target:
    """The version ``ref`` (number, alias, or latest) of live function ``name``; 404s."""
    tenant_id = principal.tenant_id
    fn, version = await services.resolver.resolve(tenant_id, name, ref)
    driver = driver_for(version.language)
    # a module goes to the node by digest: the gateway does not need its bytes
    data = (
        b""
        if driver is Driver.MODULE
        else await services.read_artifact(tenant_id, version.content_hash)
    )
    return Target(
        name=fn.name,
        version=version,
        driver=driver,
        artifact=data,
        validators=services.validators,
    )


async def invoke(
    services: Services, principal: Principal, target: Target, value: Any
) -> InvokeResponse:
    """Validate, run once and wait: the function's result (its failures are in the body,
    not raised)."""
    return await _run(services, principal, target, value, await target.valid_spec(value, principal))


async def _run(
    services: Services,
    principal: Principal,
    target: Target,
    value: Any,
    spec: RunSpec,
    budget: projection.ResponseBudget | None = None,
) -> InvokeResponse:
    row = await services.invocations.run(
        principal,
        spec,
        kind="function",
        function_version_id=target.version.id,
        record=target.record(value),
    )
    loaded = await projection.load(services.sessions, row, budget)
    return outcome.invoke_response(
        row, loaded, function=target.name, version=target.version.version
    )


async def submit(services: Services, principal: Principal, target: Target, value: Any) -> str:
    """Validate and start one invocation without waiting; its id."""
    row = await services.invocations.submit(
        principal,
        await target.valid_spec(value, principal),
        kind="function",
        function_version_id=target.version.id,
        record=target.record(value),
    )
    return str(row.id)


async def invoke_batch(
    services: Services, principal: Principal, target: Target, values: list[Any]
) -> list[BatchInvokeItem]:
    """Every input validated first (one work budget for the batch), then each valid one
    admitted and run on its own, concurrently; in input order. Large outputs are included
    while the answer stays under ``max_batch_response_bytes``."""
    budget = projection.ResponseBudget(services.settings.max_batch_response_bytes)

    async def one(value: Any, refused: CorralError | None) -> BatchInvokeItem:
        try:
            if refused is not None:
                raise refused
            spec = target.spec(value, principal)
            result = await _run(services, principal, target, value, spec, budget)
            return BatchInvokeItem(result=result)
        except CorralError as exc:
            details = exc.details if isinstance(exc.details, dict) else None
            if isinstance(exc.details, list):
                details = {"errors": exc.details}
            return BatchInvokeItem(
                error=FunctionError(code=exc.code, message=exc.message, details=details)
            )

    refusals = await target.validate(values)
    return list(await asyncio.gather(*(one(v, r) for v, r in zip(values, refusals, strict=True))))
