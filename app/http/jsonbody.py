"""Parse a JSON request body into Python values the rest of the gateway can always handle.

``parse(raw)`` returns the value of ``raw`` or raises:

* ``InvalidJSON`` (400) when ``raw`` is not UTF-8 JSON (Python's extensions are refused
  too: ``NaN``, ``Infinity`` and integers of more digits than Python converts), or when a
  string or key holds a lone UTF-16 surrogate (``"\\ud800"``): Python's parser accepts
  those escapes, but such a string cannot be encoded as UTF-8 (for the database, the
  logs, a node or a regex), and I-JSON (RFC 7493) forbids it;
* ``TooDeeplyNested`` (400) when arrays and objects nest deeper than ``MAX_DEPTH``: every
  later step (pydantic, the input schema, the stored record) then works on a value whose
  depth is bounded, well within the interpreter's recursion limit.

The check walks the parsed value once, iteratively (no recursion), in time linear in its
size; strings are looked at only when the body has a surrogate escape at all.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.errors import InvalidJSON, TooDeeplyNested

#: How deeply arrays and objects may nest in a request body.
MAX_DEPTH = 64

#: A ``\uD800``-``\uDFFF`` escape: the only way a surrogate gets into a parsed str (raw
#: UTF-8 cannot encode one; ``bytes.decode`` refuses it).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def parse(raw: bytes) -> Any:
    """The JSON value of ``raw``, refused as above unless it is one a client may send."""
    try:
        value = json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        raise TooDeeplyNested(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    check(value, strings=_SURROGATE_ESCAPE.search(raw) is not None)
    return value


def check(value: Any, *, strings: bool = True) -> None:
    """Raise unless ``value`` nests at most ``MAX_DEPTH`` levels and (when ``strings``)
    every string in it, key or value, encodes as UTF-8."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            items: Any = node.values()
            if strings:
                for key in node:
                    _encodable(key)
        elif isinstance(node, list):
            items = node
        else:
            if strings and isinstance(node, str):
                _encodable(node)
            continue
        if depth >= MAX_DEPTH:
            raise TooDeeplyNested(f"the body nests deeper than {MAX_DEPTH} levels")
        stack.extend((item, depth + 1) for item in items if strings or _container(item))


def _not_json(constant: str) -> Any:
    raise InvalidJSON(f"request body is not valid JSON: {constant} is not a JSON number")


def _container(item: Any) -> bool:
    return isinstance(item, dict | list)


def _encodable(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise InvalidJSON(
            f"request body has a string with a lone UTF-16 surrogate "
            f"({bad.encode('unicode_escape').decode('ascii')} at character {exc.start}): "
            "it cannot be encoded as UTF-8"
        ) from None
