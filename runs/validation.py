"""What no database column can hold, checked where input enters (dashboard forms, the HTTP API).

JSON and Python allow values PostgreSQL refuses and SQLite cannot encode: NUL ("\\u0000") in text or
jsonb, lone surrogates ("\\ud800") in any UTF-8 text, NaN and Infinity in jsonb. Handed to the engine
they fail its write with a raw database error (a 500 on PostgreSQL, a run that cannot be recorded);
refused here they are a message naming the problem. Nesting is bounded too: a value nested deeper than
MAX_JSON_DEPTH is a mistake or an attack, and recursive encoders fail on it.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_JSON_DEPTH = 100
_UNWRITABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_text(text: str) -> str:
    """Why ``text`` cannot be stored ("" when it can)."""
    found = _UNWRITABLE.search(text)
    if found is None:
        return ""
    if found.group() == "\x00":
        return "text contains a NUL character (\\u0000)"
    return "text contains a lone surrogate (\\ud800-\\udfff)"


def unstorable(value: Any, depth: int = MAX_JSON_DEPTH) -> str:
    """Why ``value`` (a decoded JSON value) cannot be stored ("" when it can); walks at most ``depth`` levels."""
    if depth < 0:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, str):
        return unstorable_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN and Infinity are not numbers a database stores"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, item in items:
        problem = (unstorable_text(key) if isinstance(key, str) else "") or unstorable(item, depth - 1)
        if problem:
            return problem
    return ""
