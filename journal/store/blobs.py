"""Content-addressed blob store: bytes stored once by SHA-256, zlib-compressed, shared across runs.

Checkpoints, large step results and long transcripts all land here, so the same bytes are
stored once however many steps or runs refer to them: storage grows with what changed.

A blob lives as long as something refers to it. ``collect_garbage`` (called by retention's purge
and by erasure) deletes the blobs nothing refers to any more; ``digests_referenced`` is the one
place that knows every kind of reference:

- a session event's ``result_ref`` (a large result) and ``request_ref`` (a model call's messages);
- a checkpoint's manifest (sandbox path -> digest);
- a LangGraph channel version or pending write (``journal.contrib.langgraph.values``): a value's
  digest, or a list's spine and tail, which are blobs listing chunk and element digests in turn.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from journal.models import Blob, Checkpoint, CheckpointDecision, LangGraphChannel, LangGraphWrite, SessionEvent

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
    # In digest order: two transactions storing overlapping sets then lock the index entries in the
    # same order, so they wait for each other instead of deadlocking (seen on PostgreSQL).
    keys = sorted(unique)
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


# -- references and garbage collection ----------------------------------------------------------
GC_GRACE = timedelta(hours=1)  # a full sweep spares younger blobs: a writer may not have committed its reference


def refs_in_payload(payload: dict) -> set[str]:
    """Digests a session event's payload refers to."""
    out: set[str] = set()
    if not isinstance(payload, dict):
        return out
    if isinstance(payload.get("result_ref"), str):
        out.add(payload["result_ref"])
    request = payload.get("request_ref")
    if isinstance(request, dict):
        out.update(d for d in request.get("messages", ()) if isinstance(d, str))
        if isinstance(request.get("rest"), str):
            out.add(request["rest"])
    return out


def refs_in_manifest(manifest: dict) -> set[str]:
    return {d for d in (manifest or {}).values() if isinstance(d, str)} if isinstance(manifest, dict) else set()


def refs_in_langgraph(values: Iterable[list]) -> set[str]:
    """Digests LangGraph value references reach: a value's digest; a list's spine (a blob listing
    full chunks' digests), its tail (a chunk) and every chunk's elements (digest or [type, digest])."""
    out: set[str] = set()
    spines: set[str] = set()
    chunks: set[str] = set()
    for ref in values:
        if not isinstance(ref, list) or len(ref) != 3:
            continue
        if ref[0] == "value":
            out.add(ref[2])
        elif ref[0] == "list":
            spines.add(ref[1])
            chunks.add(ref[2])
    for data in get_many(list(spines)).values():
        chunks.update(json.loads(data))
    for data in get_many(list(chunks)).values():
        out.update(e if isinstance(e, str) else e[1] for e in json.loads(data))
    return out | spines | chunks


def digests_referenced(*, runs: Iterable[Any] | None = None, excluding: Iterable[Any] | None = None) -> set[str]:
    """Every digest something refers to; ``runs``: only what those runs' rows refer to;
    ``excluding``: what everything but those runs refers to (LangGraph threads that are no run included)."""
    events = SessionEvent.objects.filter(Q(payload__has_key="result_ref") | Q(payload__has_key="request_ref"))
    checkpoints = Checkpoint.objects.filter(decision=CheckpointDecision.TAKEN)
    channels, writes = LangGraphChannel.objects.all(), LangGraphWrite.objects.all()
    for ids, keep in ((runs, True), (excluding, False)):
        if ids is None:
            continue
        ids = list(ids)
        threads = [str(i) for i in ids]
        if keep:
            events, checkpoints = events.filter(run_id__in=ids), checkpoints.filter(run_id__in=ids)
            channels, writes = channels.filter(thread_id__in=threads), writes.filter(thread_id__in=threads)
        else:
            events, checkpoints = events.exclude(run_id__in=ids), checkpoints.exclude(run_id__in=ids)
            channels, writes = channels.exclude(thread_id__in=threads), writes.exclude(thread_id__in=threads)
    out: set[str] = set()
    for payload in events.values_list("payload", flat=True).iterator(chunk_size=2000):
        out |= refs_in_payload(payload)
    for manifest in checkpoints.values_list("manifest", flat=True).iterator(chunk_size=2000):
        out |= refs_in_manifest(manifest)
    out |= refs_in_langgraph(channels.values_list("value", flat=True).iterator(chunk_size=2000))
    out |= refs_in_langgraph(writes.values_list("value", flat=True).iterator(chunk_size=2000))
    return out


def collect_garbage(candidates: Iterable[str] | None = None, *, grace: timedelta | None = GC_GRACE) -> int:
    """Delete the blobs nothing refers to; returns how many. Mark (every reference), then sweep.

    ``candidates`` limits the sweep to those digests (erasure passes what the erased runs referred
    to, with ``grace=None``: they go at once). A full sweep spares blobs younger than ``grace``,
    which a writer may have stored before committing the row that refers to them. (A writer that
    finds an *old* blob already stored and refers to it again is not protected: the sweep runs
    after purges and erasures, not beside busy writers of the same bytes.)
    """
    live = digests_referenced()
    qs = Blob.objects.all()
    if grace is not None:
        qs = qs.filter(created_at__lt=timezone.now() - grace)
    if candidates is not None:
        keys = sorted(set(candidates) - live)
    else:
        keys = [d for d in qs.values_list("sha256", flat=True).iterator(chunk_size=2000) if d not in live]
    deleted = 0
    for i in range(0, len(keys), _CHUNK):
        deleted += qs.filter(sha256__in=keys[i:i + _CHUNK]).delete()[0]
    return deleted
