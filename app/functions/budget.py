"""How much work checking one request's input against a function's schema may take.

Every keyword check the input validator makes (``app.functions.validator``) is charged to
the request's ``Budget`` before it runs, and every error it reports as it is reported, so
a validation overspends by at most one step. A unit is one keyword check's own work (one to a few
microseconds, measured by ``bench/schema_validation.py``), priced as:

* each keyword check: one unit, plus one per ``UNIT_BYTES`` of a string it reads, plus one
  per element or property of the input it loops over (only for the keywords that loop:
  ``ITERATING``), plus one per ``UNIT_BYTES`` of the keyword's value (``enum`` and
  ``const`` compare against it; a schema's sizes are measured once, when its validator is
  built);
* each error a check reports, at each level it is reported through: one unit plus one
  per ``UNIT_BYTES`` of its message (jsonschema's messages hold the repr of the failing
  value, so making one costs its length);
* what a keyword loops over beyond that (each ``patternProperties`` pattern against every
  key; ``uniqueItems``' canonical texts), charged by the validator as it goes.

A batch shares one budget. When it runs out, ``InputTooComplex`` (422) ends the
validation: no schema and no input make the gateway work for more than ``MAX_UNITS``
units per request (``bench/schema_validation.py`` measures the worst cases).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from app.errors import InputTooComplex

#: Bytes of a string, message or schema value that one unit pays for.
UNIT_BYTES = 256
#: Units one request may spend on input validation (a batch: all its inputs together).
MAX_UNITS = 500_000
#: Keywords whose check loops over the input's elements or properties.
ITERATING = frozenset(
    {
        "items",
        "prefixItems",
        "contains",
        "uniqueItems",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
    }
)

_current: ContextVar[Budget | None] = ContextVar("corral_validation_budget", default=None)


class Budget:
    """Units left for one request's validation."""

    def __init__(
        self, units: int | None = None, *, schema_sizes: dict[int, int] | None = None
    ) -> None:
        self.units = MAX_UNITS if units is None else units
        self.remaining = self.units
        self._schema_sizes = schema_sizes or {}

    def charge(self, units: int) -> None:
        self.remaining -= units
        if self.remaining < 0:
            raise InputTooComplex(
                "validating the input against the function's schema needs more than "
                f"{self.units} steps; send a smaller input or register a simpler schema",
                details={"max_steps": self.units},
            )

    def charge_check(self, keyword: str, value: Any, instance: Any) -> None:
        """Before keyword ``keyword`` (whose value is ``value``) checks ``instance``."""
        units = 1
        if isinstance(instance, str):
            units += len(instance) // UNIT_BYTES
        elif keyword in ITERATING and isinstance(instance, dict | list):
            units += len(instance)
        if isinstance(value, dict | list):
            units += self._schema_sizes.get(id(value), 0) // UNIT_BYTES
        self.charge(units)

    def charge_error(self, message: str) -> None:
        """As an error with ``message`` is reported through one more level."""
        self.charge(1 + len(message) // UNIT_BYTES)

    @contextlib.contextmanager
    def active(self) -> Iterator[Budget]:
        """Charge validation in this context (thread or task) to this budget."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)


def current() -> Budget | None:
    """The budget validation in this context is charged to (None: not counted)."""
    return _current.get()


def sizes(value: Any) -> dict[int, int]:
    """The JSON size of every array and object of at least ``UNIT_BYTES`` in ``value`` (a
    schema), by ``id``: one pass, no recursion. Smaller ones are left out (they cost
    nothing extra)."""
    found: dict[int, int] = {}
    totals: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, children_done = stack.pop()
        if not isinstance(node, dict | list):
            continue
        children = list(node.values()) if isinstance(node, dict) else node
        if not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if isinstance(c, dict | list))
            continue
        total = 2 + sum(
            totals.pop(id(c), 0) if isinstance(c, dict | list) else _leaf(c) for c in children
        )
        if isinstance(node, dict):
            total += sum(len(key) + 4 for key in node)
        totals[id(node)] = total
        if total >= UNIT_BYTES:
            found[id(node)] = total
    return found


def _leaf(value: Any) -> int:
    if isinstance(value, str):
        return len(value) + 3
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3 + 2
    return 8
