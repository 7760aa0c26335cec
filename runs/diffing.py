"""Readable differences between two JSON values and between two versions of a text file.

Pure functions: the stepper shows "what changed at this step" as a short list of paths, not
two walls of JSON side by side.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

MAX_CHANGES = 200
MAX_FILE_BYTES = 200_000


@dataclass(frozen=True)
class Change:
    path: str  # e.g. "messages[3].content"
    op: str  # added | removed | changed
    old: Any = None
    new: Any = None


def json_diff(old: Any, new: Any, path: str = "", limit: int = MAX_CHANGES) -> list[Change]:
    """Changes that turn ``old`` into ``new``, deepest first, at most ``limit`` of them."""
    out: list[Change] = []
    _walk(old, new, path, out, limit)
    return out


def _walk(old: Any, new: Any, path: str, out: list[Change], limit: int) -> None:
    if len(out) >= limit or old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in new:
                out.append(Change(sub, "removed", old=old[key]))
            elif key not in old:
                out.append(Change(sub, "added", new=new[key]))
            else:
                _walk(old[key], new[key], sub, out, limit)
            if len(out) >= limit:
                return
        return
    if isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            sub = f"{path}[{i}]"
            if i >= len(new):
                out.append(Change(sub, "removed", old=old[i]))
            elif i >= len(old):
                out.append(Change(sub, "added", new=new[i]))
            else:
                _walk(old[i], new[i], sub, out, limit)
            if len(out) >= limit:
                return
        return
    if old is None and path == "":
        out.append(Change("(value)", "added", new=new))
    else:
        out.append(Change(path or "(value)", "changed", old=old, new=new))


def text_diff(old: bytes | None, new: bytes | None, name: str) -> str:
    """A unified diff of two file versions; a note instead when binary or too large."""
    for data in (old, new):
        if data is not None and (len(data) > MAX_FILE_BYTES or b"\0" in data[:8192]):
            return f"(binary or larger than {MAX_FILE_BYTES // 1000} kB: {len(old or b'')} -> {len(new or b'')} bytes)"
    a = (old or b"").decode("utf-8", "replace").splitlines(keepends=True)
    b = (new or b"").decode("utf-8", "replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"a/{name}" if old is not None else "/dev/null",
                                        f"b/{name}" if new is not None else "/dev/null"))
