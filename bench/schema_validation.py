"""Input-schema validation: how long hostile and large cases take, and what they cost in
budget units (``app.functions.budget``), to size ``MAX_UNITS``.

Each case validates one input (or a batch) through ``app.functions.schema`` exactly as an
invocation does, with the whole request budget. Prints one JSON document: per case the
seconds, the units spent, the microseconds per unit, and the outcome.

    .venv/bin/python bench/schema_validation.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.functions import budget, schema


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


_BRANCH = {"type": "array", "items": {"$ref": "#/$defs/A"}}
CASES: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "redos pattern, 1 MB of a": (
        {"type": "string", "pattern": "^(a+)+$"},
        ["a" * 1_000_000 + "!"],
    ),
    "redos pattern, batch of 256 x 30 KB": (
        {"type": "string", "pattern": "^(a+)+$"},
        ["a" * 30_000 + "!"] * 256,
    ),
    "anyOf doubling per level, depth 40": (
        {
            "$defs": {"A": {"anyOf": [_BRANCH, _BRANCH, {"type": "integer"}]}},
            "$ref": "#/$defs/A",
        },
        [_nested(40, "x")],
    ),
    "100 failing checks on a 4 MB object": (
        {"anyOf": [{"type": "string", "minLength": i} for i in range(100)]},
        [{f"k{i}": "v" * 40 for i in range(80_000)}],
    ),
    "uniqueItems, 200k distinct objects": (
        {"type": "array", "uniqueItems": True},
        [[{"a": i} for i in range(200_000)]],
    ),
    "patternProperties 50 x 50k keys": (
        {"patternProperties": {f"^p{i}_": {"type": "integer"} for i in range(50)}},
        [{f"k{i}": i for i in range(50_000)}],
    ),
    "valid: 500k integers": (
        {"type": "array", "items": {"type": "integer", "minimum": 0}},
        [list(range(500_000))],
    ),
    "valid: 20k records of 5 fields": (
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "name": {"type": "string", "pattern": "^[a-z0-9_]+$"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "score": {"type": "number"},
                    "ok": {"type": "boolean"},
                },
                "required": ["id", "name"],
            },
        },
        [
            [
                {"id": i, "name": f"n{i}", "tags": ["a", "b"], "score": 0.5, "ok": True}
                for i in range(20_000)
            ]
        ],
    ),
}


async def _case(name: str, spec: dict[str, Any], values: list[Any]) -> dict[str, Any]:
    schema.check_schema(spec)
    validators = schema.Validators()
    spent: list[int] = []
    original = budget.Budget.charge

    def charge(self: budget.Budget, units: int) -> None:
        original(self, units)
        spent[:] = [self.units - self.remaining]

    budget.Budget.charge = charge  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        outcomes = await schema.validate_inputs(validators, name, spec, values)
        seconds = time.perf_counter() - started
    finally:
        budget.Budget.charge = original  # type: ignore[method-assign]
    units = spent[0] if spent else 0
    codes = sorted({o.code if o is not None else "valid" for o in outcomes})
    return {
        "case": name,
        "seconds": round(seconds, 4),
        "units": units,
        "us_per_unit": round(seconds * 1e6 / units, 3) if units else None,
        "outcomes": codes,
    }


async def main() -> None:
    results = [await _case(name, *case) for name, case in CASES.items()]
    print(json.dumps({"max_units": budget.MAX_UNITS, "cases": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
