"""Content-addressed blob store: bytes stored once by SHA-256, zlib-compressed, shared across runs.

Checkpoints, large step results and long transcripts all land here, so the same bytes are
stored once however many steps or runs refer to them: storage grows with what changed.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction

from journal.models import Blob

INLINE_LIMIT = 8_192  # results larger than this (as text) live in the store, referenced from the journal row


def put(data: bytes) -> tuple[str, int]:
    """Store bytes; returns (sha256, bytes newly written: 0 when they were already there)."""
    digest = hashlib.sha256(data).hexdigest()
    if Blob.objects.filter(sha256=digest).exists():
        return digest, 0
    packed = zlib.compress(data, 6)
    try:
        with transaction.atomic():
            Blob.objects.create(sha256=digest, size=len(data), stored_size=len(packed), data=packed)
    except IntegrityError:  # a concurrent writer stored the same bytes
        return digest, 0
    return digest, len(packed)


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pack(data: bytes) -> tuple[bytes, str]:
    """zlib unless it does not help (already-compressed files are stored as they are)."""
    packed = zlib.compress(data, 6)
    return (packed, "zlib") if len(packed) < len(data) else (data, "none")


_CHUNK = 400  # digests per IN (...) query: under SQLite's variable limit


def put_many(datas: Iterable[bytes]) -> tuple[list[str], int]:
    """Store many byte strings with one existence query and one bulk insert per chunk.

    Returns their digests in order and the bytes newly written (already-stored content costs 0).
    Safe against a concurrent writer storing the same content (conflicts are ignored).
    """
    digests: list[str] = []
    unique: dict[str, bytes] = {}
    for data in datas:
        digest = digest_of(data)
        digests.append(digest)
        unique.setdefault(digest, data)
    keys = list(unique)
    written = 0
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i:i + _CHUNK]
        have = set(Blob.objects.filter(sha256__in=chunk).values_list("sha256", flat=True))
        new = []
        for digest in chunk:
            if digest in have:
                continue
            data = unique[digest]
            packed, compression = _pack(data)
            new.append(Blob(sha256=digest, size=len(data), stored_size=len(packed), compression=compression,
                            data=packed))
            written += len(packed)
        if new:
            Blob.objects.bulk_create(new, ignore_conflicts=True)
    return digests, written


def get(digest: str) -> bytes:
    blob = Blob.objects.get(sha256=digest)
    data = bytes(blob.data)
    return zlib.decompress(data) if blob.compression == "zlib" else data


def get_many(digests: list[str]) -> dict[str, bytes]:
    out = {}
    keys = list(set(digests))
    for i in range(0, len(keys), _CHUNK):
        for blob in Blob.objects.filter(sha256__in=keys[i:i + _CHUNK]):
            data = bytes(blob.data)
            out[blob.sha256] = zlib.decompress(data) if blob.compression == "zlib" else data
    return out


def store_json(value: Any) -> str:
    digest, _ = put(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())
    return digest


def load_json(digest: str) -> Any:
    return json.loads(get(digest))
