"""JSON Schema (Draft 2020-12) for a function's input: checked at registration, applied
before every invocation, so bad input never reaches a node.

Registration (``check_schema``) refuses what cannot be validated within bounds
(``app.functions.bounds``). Validation (``validate_inputs``) uses ``InputValidator``
(``app.functions.validator``: RE2 patterns, every check charged to one ``Budget`` per
request) in a worker thread, off the event loop; its work is bounded by the budget, and a
recursion past the interpreter's limit ends it like a spent budget. Validations run on
``Validators``' own ``WORKERS`` threads, so however many requests validate at once, the
event loop keeps its share of the interpreter.

Validators are built once per function version (versions are immutable), after the
schema is checked against today's bounds again (a version registered before them is
refused at every invocation instead of validated unsafely), and kept in a small LRU
(``Validators``, one per process, owned by the app's services). Remote ``$ref`` is never
fetched: registration refuses any ``$ref`` that does not resolve inside the schema.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

from jsonschema.protocols import Validator

from app.errors import CorralError, InputTooComplex, InputValidationFailed, InvalidInputSchema
from app.functions import bounds
from app.functions.budget import Budget, sizes
from app.functions.validator import InputValidator

log = logging.getLogger(__name__)

#: How many validators (one per function version) are kept.
CACHE_SIZE = 1024
#: How many failures are listed in an error's details, and how many are looked for.
MAX_REPORTED = 20
MAX_COLLECTED = 100
#: How much of one failure's message is reported.
MAX_MESSAGE_CHARS = 500
#: Threads that validate inputs (per process).
WORKERS = 2


def check_schema(schema: dict[str, Any]) -> None:
    """Raise ``InvalidInputSchema`` unless ``schema`` may be registered
    (``app.functions.bounds.check``)."""
    bounds.check(schema)


@dataclass(frozen=True, slots=True)
class Compiled:
    """A version's validator and the sizes of its schema's large parts (for the budget), or
    why its schema cannot be checked safely (a version registered before today's bounds:
    every input is answered with that ``InvalidInputSchema``)."""

    validator: Validator | None
    sizes: dict[int, int]
    refused: InvalidInputSchema | None = None


class Validators:
    """Compiled validators by function version id (safe to use from several threads), and
    the threads that run them; ``close`` stops the threads."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._cache: OrderedDict[str, Compiled] = OrderedDict()
        self._lock = threading.Lock()
        self.executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="corral-validate")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def get(self, version_id: str, schema: dict[str, Any]) -> Compiled:
        with self._lock:
            compiled = self._cache.get(version_id)
            if compiled is not None:
                self._cache.move_to_end(version_id)
                return compiled
            compiled = _compile(schema)
            self._cache[version_id] = compiled
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
            return compiled


def _compile(schema: dict[str, Any]) -> Compiled:
    try:
        bounds.check(schema)
    except InvalidInputSchema as exc:
        return Compiled(
            None,
            {},
            InvalidInputSchema(
                f"this version's {exc.message} (it was registered before that was "
                "refused); register a new version",
                details=exc.details,
            ),
        )
    return Compiled(InputValidator(schema), sizes(schema))


async def validate_inputs(
    validators: Validators, version_id: str, schema: dict[str, Any], values: list[Any]
) -> list[CorralError | None]:
    """For each value, in order, ``None`` if it matches ``schema`` or the error to answer
    it with: ``InputValidationFailed`` naming each failing field, or ``InputTooComplex``
    once the request's budget is spent. Runs on ``validators``' threads."""
    if not schema:
        return [None] * len(values)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        validators.executor, _validate_all, validators, version_id, schema, values
    )


def _validate_all(
    validators: Validators, version_id: str, schema: dict[str, Any], values: list[Any]
) -> list[CorralError | None]:
    compiled = validators.get(version_id, schema)
    if compiled.validator is None:
        return [compiled.refused] * len(values)
    budget = Budget(schema_sizes=compiled.sizes)
    outcomes: list[CorralError | None] = []
    with budget.active():
        for value in values:
            try:
                _validate(compiled.validator, value)
                outcomes.append(None)
            except InputValidationFailed as exc:
                outcomes.append(exc)
            except RecursionError:
                log.warning("function version %s: input validation recursed too deep", version_id)
                outcomes.append(
                    InputTooComplex(
                        "validating the input against the function's schema recurses too "
                        "deeply; send a less deeply nested input"
                    )
                )
    return outcomes


def _validate(validator: Validator, value: Any) -> None:
    """Raise ``InputValidationFailed`` naming each failing field (a JSON path)."""
    found = list(islice(validator.iter_errors(value), MAX_COLLECTED + 1))
    if not found:
        return
    errors = sorted(found[:MAX_COLLECTED], key=lambda e: list(map(str, e.path)))
    details = [
        {
            "path": list(err.absolute_path),
            "json_path": err.json_path,
            "message": _capped(err.message),
            "validator": str(err.validator),
        }
        for err in errors[:MAX_REPORTED]
    ]
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if len(found) > MAX_COLLECTED:
        more = f" (and at least {MAX_COLLECTED} more)"
    raise InputValidationFailed(
        f"input failed validation at {first.json_path}: {_capped(first.message)}{more}",
        details=details,
    )


def _capped(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters)"
