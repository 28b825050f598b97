"""The validator of functions' input schemas: Draft 2020-12, with every check bounded.

``InputValidator`` is jsonschema's ``Draft202012Validator`` with these keywords replaced:

* ``pattern``, ``patternProperties`` and ``additionalProperties`` (which consults the
  ``patternProperties`` beside it) match with RE2 (``app.functions.regex``), linear in
  the string, never Python's backtracking ``re``;
* ``uniqueItems`` compares canonical JSON texts in a set (linear) instead of every pair;
* every keyword check is charged to the request's ``Budget`` (``app.functions.budget``)
  before it runs, so a validation stops with ``InputTooComplex`` once it has done
  ``MAX_UNITS`` units of work, whatever the schema and the input.

``unevaluatedProperties``, ``unevaluatedItems`` and ``$dynamicRef`` are refused at
registration (``app.functions.bounds``): jsonschema checks the first two in time
quadratic in the input, with Python's ``re`` for patterns, and the third cannot be checked
for cycles before it runs. ``format`` is an annotation: no format checker is given at
invocation (``FORMAT_CHECKER``, with an RE2 ``regex`` format, checks schemas at
registration).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.protocols import Validator

from app.functions import budget, regex

Keyword = Callable[[Any, Any, Any, dict[str, Any]], Iterator[ValidationError]]


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not regex.search(pattern, instance):
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    spent = budget.current()
    for pattern, subschema in patterns.items():
        if spent is not None:
            spent.charge(_keys_cost(instance))
        for key, value in instance.items():
            if regex.search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = sorted(_extras(instance, schema))
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        listed = ", ".join(repr(extra) for extra in extras[:20])
        more = f" and {len(extras) - 20} more" if len(extras) > 20 else ""
        yield ValidationError(f"additional properties are not allowed ({listed}{more})")


def _extras(instance: dict[str, Any], schema: dict[str, Any]) -> Iterator[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    spent = budget.current()
    if spent is not None and patterns:
        spent.charge(len(patterns) * _keys_cost(instance))
    for key in instance:
        if key not in properties and not any(regex.search(p, key) for p in patterns):
            yield key


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[str] = set()
    spent = budget.current()
    for index, item in enumerate(instance):
        text = canonical(item)
        if spent is not None:
            spent.charge(len(text) // budget.UNIT_BYTES)
        if text in seen:
            yield ValidationError(f"has non-unique elements (item {index} repeats an earlier one)")
            return
        seen.add(text)


def _keys_cost(instance: dict[str, Any]) -> int:
    """Units for matching one pattern against every key of ``instance``."""
    return len(instance) + sum(map(len, instance)) // budget.UNIT_BYTES


def canonical(value: Any) -> str:
    """One text per JSON value under JSON Schema equality: keys sorted, and a float with
    an integral value written as the integer (``1.0`` equals ``1``; ``true`` stays apart)."""
    return json.dumps(_integral(value), sort_keys=True, separators=(",", ":"))


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value) if not isinstance(value, str) or len(value) <= limit else repr(value[:limit])
    return text if len(text) <= limit + 2 else text[:limit] + "..."


def _charged(name: str, keyword: Keyword) -> Keyword:
    """``keyword``, charged to the current budget before it runs and for each error it
    reports."""

    def check(
        validator: Any, value: Any, instance: Any, schema: dict[str, Any]
    ) -> Iterator[ValidationError]:
        spent = budget.current()
        if spent is None:
            return keyword(validator, value, instance, schema)
        spent.charge_check(name, value, instance)
        return _reported(keyword(validator, value, instance, schema), spent)

    return check


def _reported(errors: Iterator[ValidationError], spent: budget.Budget) -> Iterator[ValidationError]:
    for error in errors:
        spent.charge_error(error.message)
        yield error


_REPLACED: dict[str, Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}

InputValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={
        name: _charged(name, _REPLACED.get(name) or keyword)
        for name, keyword in Draft202012Validator.VALIDATORS.items()
        if keyword is not None
    },
)


def _re2_regex(instance: object) -> bool:
    if isinstance(instance, str):
        regex.compile_pattern(instance)
    return True


#: Checks schemas at registration: jsonschema's format checker with ``regex`` (the
#: format of every ``pattern`` and ``patternProperties`` key in the metaschema) compiled
#: by RE2, so a pattern RE2 refuses is an invalid schema.
FORMAT_CHECKER = FormatChecker(())
FORMAT_CHECKER.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
FORMAT_CHECKER.checks("regex", raises=regex.PatternRefused)(_re2_regex)
