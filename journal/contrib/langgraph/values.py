"""Channel values as references into the content-addressed Blob store.

A value is serialized with the saver's serializer and stored once by SHA-256. A list (a growing
message list, typically) is stored element by element, and its element references in fixed
chunks of CHUNK: between two checkpoints of a thread that appended one message only the new
message and the last chunk are new bytes, so n appends cost O(n) storage, not the O(n²) of a
snapshot per checkpoint. The same value in another checkpoint, thread or copy costs nothing.

A reference is JSON, kept in `LangGraphChannel.value`:
  ["empty"]                       the channel has no value at this version
  ["value", type, sha256]         one serialized value
  ["list", [sha256, ...]]         chunks, each a JSON list of [type, sha256] elements
"""

from __future__ import annotations

import json
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from journal.store import blobs

CHUNK = 16  # element references per chunk: the bytes rewritten per append stay small
LIST_SPLIT_MIN = 4  # shorter lists are stored whole: fewer rows for the common small value

EMPTY = ["empty"]


class Encoder:
    """Collects the payloads of many values so a checkpoint stores them in one `put_many`."""

    def __init__(self, serde: SerializerProtocol):
        self.serde = serde
        self.payloads: dict[str, bytes] = {}

    def _add(self, data: bytes) -> str:
        digest = blobs.digest_of(data)
        self.payloads.setdefault(digest, data)
        return digest

    def encode(self, value: Any) -> list:
        if type(value) is list and len(value) >= LIST_SPLIT_MIN:
            elements = []
            for item in value:
                kind, data = self.serde.dumps_typed(item)
                elements.append([kind, self._add(data)])
            chunks = [self._add(json.dumps(elements[i:i + CHUNK], separators=(",", ":")).encode())
                      for i in range(0, len(elements), CHUNK)]
            return ["list", chunks]
        kind, data = self.serde.dumps_typed(value)
        return ["value", kind, self._add(data)]

    def flush(self) -> int:
        """Store what was collected; returns the bytes newly written (0 for content already stored)."""
        if not self.payloads:
            return 0
        _, written = blobs.put_many(list(self.payloads.values()))
        self.payloads.clear()
        return written


def decode_many(serde: SerializerProtocol, refs: list[list]) -> list[tuple[bool, Any]]:
    """Decode references in two batched reads (values and chunks, then list elements).

    Returns (present, value) per reference; an "empty" reference is (False, None).
    """
    first = [r[2] if r[0] == "value" else c for r in refs if r[0] != "empty"
             for c in (r[1] if r[0] == "list" else [None])]
    loaded = blobs.get_many([d for d in first if d])
    element_refs: dict[str, list] = {}
    for ref in refs:
        if ref[0] == "list":
            for digest in ref[1]:
                element_refs[digest] = json.loads(_need(loaded, digest))
    wanted = [digest for elements in element_refs.values() for _, digest in elements if digest not in loaded]
    if wanted:
        loaded.update(blobs.get_many(wanted))
    out: list[tuple[bool, Any]] = []
    for ref in refs:
        if ref[0] == "empty":
            out.append((False, None))
        elif ref[0] == "value":
            out.append((True, serde.loads_typed((ref[1], _need(loaded, ref[2])))))
        else:
            out.append((True, [serde.loads_typed((kind, _need(loaded, digest)))
                               for chunk in ref[1] for kind, digest in element_refs[chunk]]))
    return out


def _need(loaded: dict[str, bytes], digest: str) -> bytes:
    try:
        return loaded[digest]
    except KeyError:
        raise LookupError(f"blob {digest} referenced by a LangGraph checkpoint is missing from the store") from None

