"""JSON for the journal: canonical encoding, fingerprints, and clear errors at the call site."""

import hashlib
import json
from typing import Any

from django.conf import settings

from journal.store.errors import PayloadTooLargeError, SerializationError


def _find_bad(value: Any, path: str = "$") -> str | None:
    if value is None or isinstance(value, bool | int | float | str):
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            bad = _find_bad(item, f"{path}[{i}]")
            if bad:
                return bad
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a non-string key {key!r}"
            bad = _find_bad(item, f"{path}.{key}")
            if bad:
                return bad
        return None
    return f"{path} is a {type(value).__name__}"


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode canonically (sorted keys) or raise SerializationError naming the offending path."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        bad = _find_bad(value) or str(exc)
        raise SerializationError(f"{what} must be JSON-serialisable: {bad}") from None
    return text


def check_size(text: str, *, what: str = "payload", limit: int | None = None) -> None:
    limit = limit or int(getattr(settings, "DURABLE_MAX_PAYLOAD_BYTES", 1_000_000))
    if len(text) > limit:
        raise PayloadTooLargeError(f"{what} is {len(text):,} bytes; the limit is {limit:,} (DURABLE_MAX_PAYLOAD_BYTES)")


def encode(value: Any, *, what: str = "value", limit: bool = True) -> tuple[Any, str]:
    """Return (the value as the journal stores it, its canonical JSON text), validating it."""
    text = dumps(value, what=what)
    if limit:
        check_size(text, what=what)
    return json.loads(text), text


def text_fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def to_json(value: Any, *, what: str = "value", limit: bool = True) -> Any:
    """Return the value as the journal will store it (tuples become lists), validating it."""
    text = dumps(value, what=what)
    if limit:
        check_size(text, what=what)
    return json.loads(text)


def fingerprint(value: Any) -> str:
    return hashlib.sha256(dumps(value).encode()).hexdigest()[:16]
