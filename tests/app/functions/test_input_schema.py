"""Input schemas: what registration refuses, and why validating an input is bounded
(RE2 patterns, a work budget) whatever the schema and the input."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from app.errors import CorralError

REDOS = "^(a+)+$"  # catastrophic backtracking in Python's re: 2**n steps for n a's


def refusal(schema: dict[str, Any]) -> str | None:
    """The code and message registration refuses ``schema`` with, or None."""
    from app.functions.schema import check_schema

    try:
        check_schema(schema)
    except CorralError as exc:
        assert exc.status == 422 and exc.code == "invalid_input_schema", exc
        return exc.message
    return None


def validate(schema: dict[str, Any], *values: Any) -> list[str | None]:
    """The error code of each value (None: valid), validated as one request."""
    from app.functions.schema import Validators, validate_inputs

    validators = Validators()
    try:
        outcomes = asyncio.run(validate_inputs(validators, "v1", schema, list(values)))
    finally:
        validators.close()
    return [None if o is None else o.code for o in outcomes]


def test_patterns_are_matched_by_re2_never_by_python_re(monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema._keywords
    import jsonschema._utils
    import re2

    from app.functions.regex import compile_pattern

    assert isinstance(compile_pattern(REDOS), type(re2.compile("a")))

    def backtracking(*args: Any) -> Any:
        raise AssertionError("Python's re was used on a tenant's pattern")

    for module in (jsonschema._keywords, jsonschema._utils):
        monkeypatch.setattr(module.re, "search", backtracking)
    schema = {
        "type": "object",
        "properties": {"s": {"pattern": REDOS}},
        "patternProperties": {REDOS: {"type": "integer"}},
        "propertyNames": {"pattern": "^[a-z!]+$"},
        "additionalProperties": False,
    }
    assert refusal(schema) is None
    attack = "a" * 100_000 + "!"
    # Linear by construction: RE2 answers each of these at once, where Python's re would
    # take 2**100000 steps.
    assert validate(schema, {"s": attack}, {attack: 1}, {"aaa": "x"}) == [
        "input_validation_error",
        "input_validation_error",
        "input_validation_error",
    ]
    assert validate(schema, {"s": "aaaa", "aa": 1}) == [None]


@pytest.mark.parametrize(
    "schema",
    [
        {"pattern": r"^(a)\1$"},  # backreference
        {"pattern": "^(?=a)"},  # lookahead
        {"pattern": "(?<!a)b"},  # lookbehind
        {"patternProperties": {r"(x)\1": {}}},
        {"propertyNames": {"pattern": "(?!x)"}},
        {"$defs": {"s": {"pattern": r"(a)\1"}}},
        {"prefixItems": [{"pattern": "(?="}]},
    ],
)
def test_patterns_re2_cannot_run_are_refused_at_registration(schema: dict[str, Any]) -> None:
    message = refusal(schema)
    assert message is not None and "cannot be used" in message


def test_a_ref_cannot_smuggle_a_pattern_past_the_metaschema() -> None:
    message = refusal({"const": {"pattern": r"(a)\1"}, "$ref": "#/const"})
    assert message is not None and "cannot be used" in message
    assert refusal({"const": {"type": 5}, "$ref": "#/const"}) is not None
    assert refusal({"required": ["a"], "$ref": "#/required"}) is not None


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"allOf": [{"$ref": "#"}]},
        {
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
            "$ref": "#/$defs/a",
        },
        {
            "properties": {"x": {"$ref": "#/$defs/loop"}},
            "$defs": {"loop": {"not": {"$ref": "#/$defs/loop"}}},
        },
        {"$id": "urn:corral:s", "if": {"$ref": "urn:corral:s"}},
    ],
)
def test_unguarded_self_reference_is_refused(schema: dict[str, Any]) -> None:
    message = refusal(schema)
    assert message is not None and "refers to itself" in message


def test_recursion_that_descends_into_the_input_is_accepted() -> None:
    tree = {
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["value"],
    }
    assert refusal(tree) is None
    node: dict[str, Any] = {"value": 0}
    for depth in range(30):
        node = {"value": depth, "children": [node]}
    assert validate(tree, node, {"value": 1, "children": [{"children": []}]}) == [
        None,
        "input_validation_error",
    ]


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "https://example.com/schema.json"}, "does not resolve inside the schema"),
        ({"$ref": "#/$defs/missing"}, "does not resolve inside the schema"),
        ({"$ref": "https://json-schema.org/draft/2020-12/schema"}, "does not resolve"),
        ({"unevaluatedProperties": False}, "unevaluatedProperties"),
        ({"items": {"unevaluatedItems": False}}, "unevaluatedItems"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef"),
    ],
)
def test_constructs_that_cannot_be_checked_safely_are_refused(
    schema: dict[str, Any], words: str
) -> None:
    message = refusal(schema)
    assert message is not None and words in message


def test_schema_size_and_depth_are_bounded() -> None:
    from app.functions.bounds import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH

    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"items": deep}
    assert "nests deeper" in (refusal(deep) or "")
    assert refusal({"items": {"items": {"type": "string"}}}) is None
    big = {"enum": ["x" * 1000] * (MAX_SCHEMA_BYTES // 1000 + 1)}
    assert "bytes of JSON" in (refusal(big) or "")


def test_a_schema_whose_work_doubles_per_level_is_stopped_by_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two branches per level of nesting: 2**40 checks unbounded. The budget (a smaller
    one here, to keep the test short) stops it with input_too_complex."""
    from app.functions import budget

    monkeypatch.setattr(budget, "MAX_UNITS", 20_000)
    branch = {"type": "array", "items": {"$ref": "#/$defs/A"}}
    schema = {"$defs": {"A": {"anyOf": [branch, branch, {"type": "integer"}]}}, "$ref": "#/$defs/A"}
    assert refusal(schema) is None
    value: Any = "x"
    for _ in range(40):
        value = [value]
    assert validate(schema, value, [[1]]) == ["input_too_complex", "input_too_complex"]
    assert validate(schema, [[1]]) == [None]


def test_a_batch_shares_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.functions import budget

    monkeypatch.setattr(budget, "MAX_UNITS", 300)
    outcomes = validate({"type": "string", "maxLength": 3}, *(["abcd"] * 256))
    assert outcomes[0] == "input_validation_error"
    assert outcomes[-1] == "input_too_complex"


def test_unique_items_follows_json_schema_equality() -> None:
    schema = {"type": "array", "uniqueItems": True}
    assert validate(
        schema,
        [1, 1.0],
        [True, 1],
        [{"a": 1, "b": [2]}, {"b": [2], "a": 1}],
        [{"a": i} for i in range(20_000)],
    ) == ["input_validation_error", None, "input_validation_error", None]


def test_reported_messages_are_capped() -> None:
    (outcome,) = validate_errors({"type": "integer"}, "x" * 100_000)
    assert outcome is not None
    assert len(json.dumps(outcome.details)) < 2_000 and len(outcome.message) < 1_000


def validate_errors(schema: dict[str, Any], *values: Any) -> list[CorralError | None]:
    from app.functions.schema import Validators, validate_inputs

    validators = Validators()
    try:
        return asyncio.run(validate_inputs(validators, "v1", schema, list(values)))
    finally:
        validators.close()


def test_a_version_registered_before_the_bounds_is_refused_not_validated_unsafely() -> None:
    """Stored schemas are checked again when their validator is built."""
    for legacy in ({"$ref": "#"}, {"pattern": r"(a)\1"}, {"unevaluatedProperties": False}):
        outcome = validate_errors(legacy, "a", "b")
        assert [o.code if o else None for o in outcome] == ["invalid_input_schema"] * 2
        assert outcome[0] is not None and "register a new version" in outcome[0].message


def _threads_of_validation(
    monkeypatch: pytest.MonkeyPatch, schema: dict[str, Any], *requests: list[Any]
) -> tuple[list[list[str | None]], list[str]]:
    """Validate each request of ``requests`` in turn with one ``Validators`` (one function
    version); the answers' codes, and the thread of every value's check."""
    import threading

    from app.functions import schema as schema_module

    threads: list[str] = []
    checked = schema_module._validate

    def recording(validator: Any, value: Any) -> None:
        threads.append(threading.current_thread().name)
        checked(validator, value)

    monkeypatch.setattr(schema_module, "_validate", recording)
    validators = schema_module.Validators()

    async def run_all() -> list[list[str | None]]:
        answers = []
        for values in requests:
            outcomes = await schema_module.validate_inputs(validators, "v1", schema, values)
            answers.append([None if o is None else o.code for o in outcomes])
        return answers

    try:
        return asyncio.run(run_all()), threads
    finally:
        validators.close()


def test_a_small_input_is_checked_on_the_event_loop_once_the_validator_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first input of a version builds its validator, in a validator thread; later
    small ones are checked on the event loop (a thread's round trip cost more)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    answers, threads = _threads_of_validation(
        monkeypatch, schema, [{"n": 1}], [{"n": 2}], [{"n": "x"}]
    )
    assert answers == [[None], [None], ["input_validation_error"]]
    assert threads[0].startswith("corral-validate")
    assert threads[1:] == ["MainThread", "MainThread"]


def test_an_input_past_the_loops_budget_is_checked_again_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One that spends the event loop's small budget is validated again from the start in
    a thread, with the request's whole budget: the same answer as if it had gone there."""
    from app.functions import schema as schema_module

    monkeypatch.setattr(schema_module, "INLINE_UNITS", 10)
    many = ["abcd"] * 20  # two checks of a unit each per value: past 10 units
    answers, threads = _threads_of_validation(
        monkeypatch, {"type": "string", "maxLength": 3}, ["ab"], many
    )
    assert answers == [[None], ["input_validation_error"] * 20]
    assert threads[0].startswith("corral-validate")  # building the validator
    gave_up = threads[1:-20]  # the attempt on the loop, until its budget ran out
    assert gave_up and set(gave_up) == {"MainThread"} and len(gave_up) < 20
    assert all(t.startswith("corral-validate") for t in threads[-20:])  # all again
