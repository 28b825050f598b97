"""What an input schema must be, beyond valid Draft 2020-12, to be registered.

``check(schema)`` raises ``InvalidInputSchema`` (422) unless:

* its JSON is at most ``MAX_SCHEMA_BYTES`` and nests at most ``MAX_SCHEMA_DEPTH`` levels;
* it is a valid Draft 2020-12 schema whose patterns RE2 compiles (``app.functions.
  validator.FORMAT_CHECKER``), and so is every value a ``$ref`` points at;
* every ``$ref`` resolves inside the schema itself (nothing is ever fetched);
* it uses none of ``REFUSED`` (see ``app.functions.validator`` for why);
* no chain of in-place applicators (``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``not``,
  ``if``/``then``/``else``, ``dependentSchemas``) leads from a subschema back to itself,
  and none is longer than ``MAX_IN_PLACE``: every cycle a validation can follow then
  descends into the input, whose depth is bounded (``app.http.jsonbody``). So
  ``{"$ref": "#"}`` is refused, and ``{"items": {"$ref": "#"}}`` (a recursive list) is not.

Every walk here is iterative: a hostile schema cannot exhaust the stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from app.errors import InvalidInputSchema
from app.functions import regex, validator

#: The largest schema, as JSON.
MAX_SCHEMA_BYTES = 64 * 1024
#: How deeply a schema's arrays and objects may nest.
MAX_SCHEMA_DEPTH = 32
#: The longest chain of in-place applicators.
MAX_IN_PLACE = 32

REFUSED = {
    "unevaluatedProperties": "is not supported (checked in quadratic time)",
    "unevaluatedItems": "is not supported (checked in quadratic time)",
    "$dynamicRef": "is not supported (use $ref)",
}

#: Keywords whose value is a subschema, a list of them, or a map to them (in place: the
#: subschema applies to the same instance; descending: to a part of it).
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_LIST = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP = ("dependentSchemas",)
_DESCENDING_ONE = ("items", "contains", "additionalProperties", "propertyNames")
_DESCENDING_LIST = ("prefixItems",)
_DESCENDING_MAP = ("properties", "patternProperties")
#: Subschemas that are only reached through ``$ref`` or never applied.
_OTHER_ONE = ("unevaluatedItems", "unevaluatedProperties", "contentSchema")
_OTHER_MAP = ("$defs", "definitions")


def check(schema: dict[str, Any]) -> None:
    """Raise ``InvalidInputSchema`` unless ``schema`` may be registered (see above)."""
    _check_shape(schema)
    _check_metaschema(schema)
    _Graph(schema).check()


def _refuse(text: str, **details: Any) -> InvalidInputSchema:
    return InvalidInputSchema(f"input_schema {text}", details=details or None)


def _check_shape(schema: Any) -> None:
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= MAX_SCHEMA_DEPTH:
                raise _refuse(f"nests deeper than {MAX_SCHEMA_DEPTH} levels")
            items = node.values() if isinstance(node, dict) else node
            stack.extend((item, depth + 1) for item in items)
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        raise _refuse(f"is {size} bytes of JSON; at most {MAX_SCHEMA_BYTES} are allowed")


def _check_metaschema(schema: Any, where: str = "") -> None:
    try:
        Draft202012Validator.check_schema(schema, format_checker=validator.FORMAT_CHECKER)
    except SchemaError as exc:
        path = list(exc.absolute_path)
        at = where + ("/".join(str(p) for p in path) or "(root)")
        message = str(exc.cause) if isinstance(exc.cause, regex.PatternRefused) else exc.message
        raise _refuse(
            f"is not a valid JSON Schema (Draft 2020-12) at {at}: {message}",
            schema_path=path,
            message=message,
        ) from None


def _subschemas(node: dict[str, Any], names: tuple[str, ...], shape: str) -> Iterator[Any]:
    for name in names:
        value = node.get(name)
        if shape == "one" and value is not None:
            yield value
        elif shape == "list" and isinstance(value, list):
            yield from value
        elif shape == "map" and isinstance(value, dict):
            yield from value.values()


def _in_place(node: dict[str, Any]) -> Iterator[Any]:
    yield from _subschemas(node, _IN_PLACE_ONE, "one")
    yield from _subschemas(node, _IN_PLACE_LIST, "list")
    yield from _subschemas(node, _IN_PLACE_MAP, "map")


def _positional(node: dict[str, Any]) -> Iterator[Any]:
    """Every subschema written inside ``node`` (not through ``$ref``)."""
    yield from _in_place(node)
    yield from _subschemas(node, _DESCENDING_ONE + _OTHER_ONE, "one")
    yield from _subschemas(node, _DESCENDING_LIST, "list")
    yield from _subschemas(node, _DESCENDING_MAP + _OTHER_MAP, "map")


class _Graph:
    """The subschemas a validation can reach, and the in-place edges between them."""

    def __init__(self, schema: dict[str, Any]) -> None:
        resource = DRAFT202012.create_resource(schema)
        self._root = schema
        self._resolver = (
            Registry()
            .with_resource(resource.id() or "", resource)
            .resolver(base_uri=resource.id() or "")
        )
        self._checked: set[int] = set()  # subschemas the metaschema has validated
        self._edges: dict[int, list[int]] = {}

    def check(self) -> None:
        self._mark_checked(self._root)
        self._walk()
        self._check_in_place_chains()

    def _mark_checked(self, schema: Any) -> None:
        stack = [schema]
        while stack:
            node = stack.pop()
            if isinstance(node, dict) and id(node) not in self._checked:
                self._checked.add(id(node))
                stack.extend(_positional(node))

    def _walk(self) -> None:
        stack: list[tuple[Any, Any]] = [(self._root, self._resolver)]
        while stack:
            node, resolver = stack.pop()
            if not isinstance(node, dict) or id(node) in self._edges:
                continue
            if "$id" in node:
                resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
            for keyword, why in REFUSED.items():
                if keyword in node:
                    raise _refuse(f"uses {keyword}, which {why}", keyword=keyword)
            in_place = [child for child in _in_place(node) if isinstance(child, dict)]
            stack.extend((child, resolver) for child in _positional(node))
            ref = node.get("$ref")
            if isinstance(ref, str):
                target, target_resolver = self._resolve(ref, resolver)
                stack.append((target, target_resolver))
                if isinstance(target, dict):
                    in_place.append(target)
            self._edges[id(node)] = [id(child) for child in in_place]

    def _resolve(self, ref: str, resolver: Any) -> tuple[Any, Any]:
        try:
            resolved = resolver.lookup(ref)
        except Unresolvable:
            raise _refuse(
                f"has a $ref that does not resolve inside the schema: {ref!r} "
                "(remote references are never fetched)",
                ref=ref,
            ) from None
        target = resolved.contents
        if not isinstance(target, dict | bool):
            raise _refuse(f"has a $ref that points at a {type(target).__name__}: {ref!r}", ref=ref)
        if isinstance(target, dict) and id(target) not in self._checked:
            _check_metaschema(target, where=f"{ref} -> ")
            self._mark_checked(target)
        return target, resolved.resolver

    def _check_in_place_chains(self) -> None:
        """No cycle and no chain longer than ``MAX_IN_PLACE`` along in-place edges."""
        longest: dict[int, int] = {}
        for start in self._edges:
            if start in longest:
                continue
            on_path: set[int] = {start}
            stack: list[tuple[int, Iterator[int]]] = [(start, iter(self._edges[start]))]
            while stack:
                node, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    on_path.discard(node)
                    longest[node] = 1 + max(
                        (longest[c] for c in self._edges.get(node, [])), default=0
                    )
                    if longest[node] > MAX_IN_PLACE:
                        raise _refuse(
                            f"chains more than {MAX_IN_PLACE} in-place applicators "
                            "($ref, allOf, anyOf, ...)"
                        )
                elif child in on_path:
                    raise _refuse(
                        "refers to itself without descending into the input "
                        '(e.g. {"$ref": "#"}): its validation would never end'
                    )
                elif child not in longest and child in self._edges:
                    on_path.add(child)
                    stack.append((child, iter(self._edges[child])))
