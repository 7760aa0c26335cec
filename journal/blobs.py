"""Content-addressed blob store: bytes stored once by SHA-256, zlib-compressed, shared across runs."""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

from django.db import IntegrityError, transaction

INLINE_LIMIT = 8_192  # results larger than this (as text) live in the store, referenced from the journal row


def put(data: bytes) -> tuple[str, int]:
    """Store bytes; returns (sha256, bytes newly written: 0 when they were already there)."""
    from journal.models import Blob

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


def get(digest: str) -> bytes:
    from journal.models import Blob

    blob = Blob.objects.get(sha256=digest)
    data = bytes(blob.data)
    return zlib.decompress(data) if blob.compression == "zlib" else data


def get_many(digests: list[str]) -> dict[str, bytes]:
    from journal.models import Blob

    out = {}
    for blob in Blob.objects.filter(sha256__in=set(digests)):
        data = bytes(blob.data)
        out[blob.sha256] = zlib.decompress(data) if blob.compression == "zlib" else data
    return out


def store_json(value: Any) -> str:
    digest, _ = put(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())
    return digest


def load_json(digest: str) -> Any:
    return json.loads(get(digest))
