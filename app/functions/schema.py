"""JSON Schema (Draft 2020-12) for a function's input: checked at registration, applied
before every invocation, so bad input never reaches a node.

Registration (``check_schema``) refuses what cannot be validated within bounds
(``app.functions.bounds``). Validation (``validate_inputs``) uses ``InputValidator``
(``app.functions.validator``: RE2 patterns, every check charged to one ``Budget`` per
request); its work is bounded by the budget, and a recursion past the interpreter's limit
ends it like a spent budget. A validation starts on the event loop with a small budget
(``INLINE_UNITS``, a millisecond or so at most) when the version's validator is built
already: most inputs need a few units, and handing them to a thread and back cost more
than the check (two thread wake-ups per call, each far longer than validating a small
input on this machine). One that spends that budget or recurses deeply is validated
again from the start on ``Validators``' own ``WORKERS`` threads, with the request's whole
budget, so however many requests validate at once the event loop keeps its share of the
interpreter; so is the first one of a version (building its validator).

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
#: The budget of a validation's first attempt, on the event loop.
INLINE_UNITS = 100


class _OffTheLoop(Exception):
    """The attempt on the event loop gave up: validate in a thread instead."""


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

    def built(self, version_id: str) -> Compiled | None:
        """The version's validator if it is built already (never builds it)."""
        with self._lock:
            compiled = self._cache.get(version_id)
            if compiled is not None:
                self._cache.move_to_end(version_id)
            return compiled

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
    compiled = validators.built(version_id)
    if compiled is not None:
        try:
            return _validate_with(compiled, version_id, values, inline=True)
        except _OffTheLoop:
            pass
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        validators.executor, _validate_all, validators, version_id, schema, values
    )


def _validate_all(
    validators: Validators, version_id: str, schema: dict[str, Any], values: list[Any]
) -> list[CorralError | None]:
    return _validate_with(validators.get(version_id, schema), version_id, values)


def _validate_with(
    compiled: Compiled, version_id: str, values: list[Any], *, inline: bool = False
) -> list[CorralError | None]:
    """``inline``: with ``INLINE_UNITS`` only, and ``_OffTheLoop`` rather than an answer
    when they run out or the validation recurses deeply (the event loop's task already
    holds more frames than a validator thread does, so where the interpreter's limit
    falls could differ: the thread's answer is the one given)."""
    if compiled.validator is None:
        return [compiled.refused] * len(values)
    budget = Budget(INLINE_UNITS if inline else None, schema_sizes=compiled.sizes)
    outcomes: list[CorralError | None] = []
    with budget.active():
        for value in values:
            try:
                _validate(compiled.validator, value)
                outcomes.append(None)
            except InputTooComplex as exc:  # the budget is spent (an InputValidationFailed)
                if inline:
                    raise _OffTheLoop from None
                outcomes.append(exc)
            except InputValidationFailed as exc:
                outcomes.append(exc)
            except RecursionError:
                if inline:
                    raise _OffTheLoop from None
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
