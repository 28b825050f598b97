"""JSON Schema (Draft 2020-12) for a function's input: checked at registration, applied
before every invocation, so bad input never reaches a node.

Validators are built once per function version (versions are immutable) and kept in a
small LRU (``Validators``, one per process, owned by the app's services). Remote ``$ref``
is never fetched: jsonschema's default registry resolves only references inside the
schema itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

from app.errors import InputValidationFailed, InvalidInputSchema

#: How many validators (one per function version) are kept.
CACHE_SIZE = 1024
#: How many failures are listed in an error's details.
MAX_REPORTED = 20


def check_schema(schema: dict[str, Any]) -> None:
    """Raise ``InvalidInputSchema`` unless ``schema`` is a valid Draft 2020-12 schema."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidInputSchema(
            f"input_schema is not a valid JSON Schema (Draft 2020-12) at {where}: {exc.message}",
            details={"schema_path": list(exc.absolute_path), "message": exc.message},
        ) from None


class Validators:
    """Compiled validators by function version id."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._cache: OrderedDict[str, Draft202012Validator] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, version_id: str, schema: dict[str, Any]) -> Draft202012Validator:
        with self._lock:
            validator = self._cache.get(version_id)
            if validator is not None:
                self._cache.move_to_end(version_id)
                return validator
            validator = Draft202012Validator(schema)
            self._cache[version_id] = validator
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
            return validator


def validate_input(
    validators: Validators, version_id: str, schema: dict[str, Any], value: Any
) -> None:
    """Raise ``InputValidationFailed`` naming each failing field (a JSON path)."""
    if not schema:
        return
    validator = validators.get(version_id, schema)
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
    except Unresolvable as exc:
        raise InvalidInputSchema(f"the function's input_schema cannot be resolved: {exc}") from None
    if not errors:
        return
    details = [
        {
            "path": list(err.absolute_path),
            "json_path": err.json_path,
            "message": err.message,
            "validator": str(err.validator),
        }
        for err in errors[:MAX_REPORTED]
    ]
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    raise InputValidationFailed(
        f"input failed validation at {first.json_path}: {first.message}{more}",
        details=details,
    )
