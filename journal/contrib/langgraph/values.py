"""Channel values as references into the content-addressed Blob store.

A value is serialized with the saver's serializer and stored once by SHA-256. A list (a growing
message list, typically) is stored element by element, and its element references in fixed
chunks of CHUNK: between two checkpoints of a thread that appended one message only the new
message and the last (partial) chunk are new bytes, and the list of full chunks (the spine)
changes once every CHUNK appends, so n appends cost O(n) storage (plus the spines' n²/CHUNK²
digests), not the O(n²) of a snapshot per checkpoint. The same value in another checkpoint,
thread or copy costs nothing, and a pending write (`[message]`) shares its element with the
channel's list.

A reference is JSON, kept in `LangGraphChannel.value`:
  ["empty"]                       the channel has no value at this version
  ["value", type, sha256]         one serialized value
  ["list", spine, tail]           spine: a JSON list of the full chunks' sha256; tail: the partial
                                  last chunk. A chunk is a JSON list of elements: sha256 (msgpack,
                                  the serializer's usual type) or [type, sha256]
"""

from __future__ import annotations

import json
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from journal.store import blobs

CHUNK = 16  # element references per chunk: the bytes rewritten per append stay small
USUAL_TYPE = "msgpack"

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
        if type(value) is list and value:
            elements: list = []
            for item in value:
                kind, data = self.serde.dumps_typed(item)
                digest = self._add(data)
                elements.append(digest if kind == USUAL_TYPE else [kind, digest])
            full = len(elements) - len(elements) % CHUNK
            spine = [self._add(_json(elements[i:i + CHUNK])) for i in range(0, full, CHUNK)]
            return ["list", self._add(_json(spine)), self._add(_json(elements[full:]))]
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
    """Decode references in three batched reads (values, spines and tails; full chunks; elements).

    Returns (present, value) per reference; an "empty" reference is (False, None).
    """
    loaded = blobs.get_many([d for r in refs for d in (r[2:] if r[0] == "value" else r[1:] if r[0] == "list" else ())])
    spines = {r[1]: json.loads(_need(loaded, r[1])) for r in refs if r[0] == "list"}
    loaded.update(blobs.get_many([c for chunks in spines.values() for c in chunks if c not in loaded]))
    chunks = {c: json.loads(_need(loaded, c)) for r in refs if r[0] == "list" for c in (*spines[r[1]], r[2])}
    loaded.update(blobs.get_many([d for elements in chunks.values() for d in map(_digest, elements)
                                  if d not in loaded]))
    out: list[tuple[bool, Any]] = []
    for ref in refs:
        if ref[0] == "empty":
            out.append((False, None))
        elif ref[0] == "value":
            out.append((True, serde.loads_typed((ref[1], _need(loaded, ref[2])))))
        else:
            out.append((True, [serde.loads_typed((_kind(e), _need(loaded, _digest(e))))
                               for chunk in (*spines[ref[1]], ref[2]) for e in chunks[chunk]]))
    return out


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _digest(element: str | list) -> str:
    return element if isinstance(element, str) else element[1]


def _kind(element: str | list) -> str:
    return USUAL_TYPE if isinstance(element, str) else element[0]


def _need(loaded: dict[str, bytes], digest: str) -> bytes:
    try:
        return loaded[digest]
    except KeyError:
        raise LookupError(f"blob {digest} referenced by a LangGraph checkpoint is missing from the store") from None

