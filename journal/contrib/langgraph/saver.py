"""JournalSaver: a LangGraph checkpointer on durable-ui's models and Blob store.

Checkpoints, channel versions and pending writes are rows in Django's default database
(`journal.models.langgraph`); channel values are content-addressed blobs (`values`). The
async methods run the same ORM code in Django's sync thread (`sync_to_async`), because the ORM
refuses to run on an event loop (SynchronousOnlyOperation).
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections, transaction
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

from journal.contrib.langgraph import values
from journal.models import LangGraphChannel, LangGraphCheckpoint, LangGraphWrite
from journal.store.errors import LeaseLost
from journal.store.thread_connections import close_at_thread_exit

_PAGE = 100  # checkpoints decoded per batch while listing


def _again_after_deadlock(write) -> None:
    """Parallel nodes save at once; a deadlock's victim was rolled back whole, so it is written again
    (twice at most), unless a caller's transaction holds it (then the caller's transaction is lost too)."""
    for attempt in range(3):
        try:
            return write()
        except OperationalError as exc:
            state = getattr(exc.__cause__, "sqlstate", None)
            if attempt == 2 or connection.in_atomic_block or state not in ("40P01", "40001"):
                raise


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}}


class JournalSaver(BaseCheckpointSaver[str]):
    """`builder.compile(checkpointer=JournalSaver())`: threads stored in durable-ui's database.

    Needs Django set up (it uses the default database); holds no connection of its own.
    """

    def __init__(self, *, serde: SerializerProtocol | None = None, fence: tuple[str, int] | None = None) -> None:
        """`fence=(run_id, epoch)`: every write commits only while the run is still at that epoch
        (raising LeaseLost otherwise), so a worker that lost its lease cannot write over the
        thread another worker has resumed. `graph_workflow` sets it; plain use leaves it off."""
        super().__init__(serde=serde)
        self.fence = fence

    def _check_fence(self) -> None:
        """Inside the write's transaction, as the journal's writer does: on PostgreSQL the share lock
        makes a claim (which bumps the epoch) wait for this commit; SQLite serializes writers, and a
        transaction whose read went stale cannot write (SQLITE_BUSY_SNAPSHOT)."""
        if self.fence is None:
            return
        connection = connections[DEFAULT_DB_ALIAS]
        run_id = uuid.UUID(str(self.fence[0]))
        pg = connection.vendor == "postgresql"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM journal_run WHERE id = %s AND epoch = %s{' FOR SHARE' if pg else ''}",
                           [run_id if pg else run_id.hex, self.fence[1]])
            if cursor.fetchone() is None:
                raise LeaseLost(f"run {run_id} was claimed by another worker (epoch {self.fence[1]} is stale)")

    # -- writing ------------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        close_at_thread_exit()
        conf = config["configurable"]
        thread_id, checkpoint_ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        body = checkpoint.copy()
        channel_values: dict[str, Any] = body.pop("channel_values")  # type: ignore[misc]
        encoder = values.Encoder(self.serde)
        channels = [
            LangGraphChannel(thread_id=thread_id, checkpoint_ns=checkpoint_ns, channel=name, version=str(version),
                             value=encoder.encode(channel_values[name]) if name in channel_values else values.EMPTY)
            for name, version in new_versions.items()
        ]
        full_metadata = get_checkpoint_metadata(config, metadata)
        checkpoint_type, checkpoint_bytes = self.serde.dumps_typed(body)
        metadata_type, metadata_bytes = self.serde.dumps_typed(full_metadata)
        row = LangGraphCheckpoint(
            thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint["id"],
            parent_checkpoint_id=conf.get("checkpoint_id") or "",
            langgraph_run_id=str(full_metadata.get("run_id") or ""),
            checkpoint_type=checkpoint_type, checkpoint=checkpoint_bytes,
            metadata_type=metadata_type, metadata=metadata_bytes)
        _again_after_deadlock(lambda: self._put_rows(encoder, channels, row))
        return _config(thread_id, checkpoint_ns, checkpoint["id"])

    def _put_rows(self, encoder, channels: list, row) -> None:
        with transaction.atomic():
            encoder.flush()  # blobs first: a channel row never points at bytes that are not there
            self._check_fence()
            if channels:
                LangGraphChannel.objects.bulk_create(
                    channels, update_conflicts=True, update_fields=["value"],
                    unique_fields=["thread_id", "checkpoint_ns", "channel", "version"])
            LangGraphCheckpoint.objects.bulk_create(
                [row], update_conflicts=True,
                update_fields=["parent_checkpoint_id", "langgraph_run_id", "checkpoint_type", "checkpoint",
                               "metadata_type", "metadata"],
                unique_fields=["thread_id", "checkpoint_ns", "checkpoint_id"])

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        close_at_thread_exit()
        conf = config["configurable"]
        key = {"thread_id": conf["thread_id"], "checkpoint_ns": conf.get("checkpoint_ns", ""),
               "checkpoint_id": conf["checkpoint_id"]}
        special, regular = [], []
        encoder = values.Encoder(self.serde)
        for idx, (channel, value) in enumerate(writes):
            write = LangGraphWrite(**key, task_id=task_id, idx=WRITES_IDX_MAP.get(channel, idx), channel=channel,
                                   task_path=task_path, value=encoder.encode(value))
            (special if channel in WRITES_IDX_MAP else regular).append(write)
        _again_after_deadlock(lambda: self._put_write_rows(encoder, regular, special))

    def _put_write_rows(self, encoder, regular: list, special: list) -> None:
        with transaction.atomic():
            encoder.flush()
            self._check_fence()
            # A task's regular writes are saved once (a retried task does not overwrite what it wrote);
            # the special ones (error, interrupt, resume, scheduled) take the latest value.
            if regular:
                LangGraphWrite.objects.bulk_create(regular, ignore_conflicts=True)
            if special:
                LangGraphWrite.objects.bulk_create(
                    special, update_conflicts=True, update_fields=["channel", "task_path", "value"],
                    unique_fields=["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"])

    # -- reading ------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        close_at_thread_exit()
        conf = config["configurable"]
        rows = LangGraphCheckpoint.objects.filter(thread_id=conf["thread_id"],
                                                  checkpoint_ns=conf.get("checkpoint_ns", ""))
        if checkpoint_id := get_checkpoint_id(config):
            rows = rows.filter(checkpoint_id=checkpoint_id)
        row = rows.order_by("-checkpoint_id").first()
        if row is None:
            return None
        return self._tuples([(row, self._metadata(row))])[0]

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        close_at_thread_exit()
        rows = LangGraphCheckpoint.objects.all()
        if config is not None:
            conf = config["configurable"]
            rows = rows.filter(thread_id=conf["thread_id"])
            if conf.get("checkpoint_ns") is not None:
                rows = rows.filter(checkpoint_ns=conf["checkpoint_ns"])
            if checkpoint_id := get_checkpoint_id(config):
                rows = rows.filter(checkpoint_id=checkpoint_id)
        if before is not None and (before_id := get_checkpoint_id(before)):
            rows = rows.filter(checkpoint_id__lt=before_id)
        rows = rows.order_by("-checkpoint_id", "thread_id", "checkpoint_ns")
        if limit is not None and limit <= 0:
            return
        if not filter and limit is not None:
            rows = rows[:limit]
        remaining = limit
        page: list[tuple[LangGraphCheckpoint, dict]] = []
        for row in rows.iterator(chunk_size=_PAGE):
            metadata = self._metadata(row)
            if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                continue
            page.append((row, metadata))
            if remaining is not None:
                remaining -= 1
                if remaining == 0:
                    break
            if len(page) == _PAGE:
                yield from self._tuples(page)
                page = []
        if page:
            yield from self._tuples(page)

    def _metadata(self, row: LangGraphCheckpoint) -> dict:
        return self.serde.loads_typed((row.metadata_type, bytes(row.metadata)))

    def _tuples(self, page: list[tuple[LangGraphCheckpoint, dict]]) -> list[CheckpointTuple]:
        """Build tuples for a page of rows, with their channel values and writes in a few batched reads."""
        bodies = [self.serde.loads_typed((row.checkpoint_type, bytes(row.checkpoint))) for row, _ in page]
        wanted: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
        for (row, _), body in zip(page, bodies, strict=True):
            for name, version in body["channel_versions"].items():
                wanted[(row.thread_id, row.checkpoint_ns)].add((name, str(version)))
        refs: dict[tuple[str, str, str, str], list] = {}
        for (thread_id, checkpoint_ns), pairs in wanted.items():
            names = {name for name, _ in pairs}
            for ch in LangGraphChannel.objects.filter(thread_id=thread_id, checkpoint_ns=checkpoint_ns,
                                                      channel__in=names, version__in={v for _, v in pairs}):
                if (ch.channel, ch.version) in pairs:
                    refs[(thread_id, checkpoint_ns, ch.channel, ch.version)] = ch.value
        writes: dict[tuple[str, str, str], list[LangGraphWrite]] = defaultdict(list)
        by_thread: dict[tuple[str, str], list[str]] = defaultdict(list)
        for row, _ in page:
            by_thread[(row.thread_id, row.checkpoint_ns)].append(row.checkpoint_id)
        for (thread_id, checkpoint_ns), ids in by_thread.items():
            for w in LangGraphWrite.objects.filter(thread_id=thread_id, checkpoint_ns=checkpoint_ns,
                                                   checkpoint_id__in=ids):
                writes[(thread_id, checkpoint_ns, w.checkpoint_id)].append(w)
        # Channel values and write values decoded together: two reads of the Blob store per page.
        all_writes = [w for ws in writes.values() for w in ws]
        keys = list(refs)
        decoded_all = values.decode_many(self.serde, [refs[k] for k in keys] + [w.value for w in all_writes])
        decoded = dict(zip(keys, decoded_all[:len(keys)], strict=True))
        write_values = {id(w): v for w, (_, v) in zip(all_writes, decoded_all[len(keys):], strict=True)}

        out = []
        for (row, metadata), body in zip(page, bodies, strict=True):
            channel_values = {}
            for name, version in body["channel_versions"].items():
                present, value = decoded.get((row.thread_id, row.checkpoint_ns, name, str(version)), (False, None))
                if present:
                    channel_values[name] = value
            pending = sorted(writes[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)],
                             key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
            out.append(CheckpointTuple(
                config=_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id),
                checkpoint={**body, "channel_values": channel_values},
                metadata=metadata,
                parent_config=(_config(row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id)
                               if row.parent_checkpoint_id else None),
                pending_writes=[(w.task_id, w.channel, write_values[id(w)]) for w in pending],
            ))
        return out

    # -- the optional capabilities ------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        close_at_thread_exit()
        with transaction.atomic():
            for model in (LangGraphWrite, LangGraphChannel, LangGraphCheckpoint):
                model.objects.filter(thread_id=thread_id).delete()

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) that LangGraph's runs `run_ids` created.

        Channel rows stay: other checkpoints of the thread may share their versions; they are
        references only, and `delete_thread` / `prune` remove them.
        """
        close_at_thread_exit()
        run_ids = [str(r) for r in run_ids]
        if not run_ids:
            return
        with transaction.atomic():
            doomed = list(LangGraphCheckpoint.objects.filter(langgraph_run_id__in=run_ids)
                          .values_list("thread_id", "checkpoint_ns", "checkpoint_id"))
            self._delete_checkpoints(doomed)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, channel version and write; the values themselves are shared blobs."""

        def copies(model, fields: Iterable[str]):
            return [model(thread_id=target_thread_id, **{f: getattr(obj, f) for f in fields})
                    for obj in model.objects.filter(thread_id=source_thread_id).iterator()]

        close_at_thread_exit()
        with transaction.atomic():
            for model in (LangGraphCheckpoint, LangGraphChannel, LangGraphWrite):
                fields = [f.name for f in model._meta.concrete_fields if f.name not in ("id", "thread_id")]
                model.objects.bulk_create(copies(model, fields), ignore_conflicts=True, batch_size=500)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: only the newest checkpoint of each namespace stays (with its writes and the
        channel versions it refers to); `delete`: the threads go entirely."""
        close_at_thread_exit()
        if strategy == "delete":
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
            return
        if strategy != "keep_latest":
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        with transaction.atomic():
            for thread_id in thread_ids:
                latest: dict[str, LangGraphCheckpoint] = {}
                doomed = []
                for row in LangGraphCheckpoint.objects.filter(thread_id=thread_id).order_by("-checkpoint_id"):
                    if row.checkpoint_ns in latest:
                        doomed.append((thread_id, row.checkpoint_ns, row.checkpoint_id))
                    else:
                        latest[row.checkpoint_ns] = row
                self._delete_checkpoints(doomed)
                for checkpoint_ns, row in latest.items():
                    body = self.serde.loads_typed((row.checkpoint_type, bytes(row.checkpoint)))
                    kept = {(name, str(version)) for name, version in body["channel_versions"].items()}
                    stale = [ch.pk for ch in LangGraphChannel.objects.filter(thread_id=thread_id,
                                                                             checkpoint_ns=checkpoint_ns)
                             if (ch.channel, ch.version) not in kept]
                    LangGraphChannel.objects.filter(pk__in=stale).delete()

    @staticmethod
    def _delete_checkpoints(keys: list[tuple[str, str, str]]) -> None:
        grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
        for thread_id, checkpoint_ns, checkpoint_id in keys:
            grouped[(thread_id, checkpoint_ns)].append(checkpoint_id)
        for (thread_id, checkpoint_ns), ids in grouped.items():
            for model in (LangGraphWrite, LangGraphCheckpoint):
                model.objects.filter(thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id__in=ids).delete()

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """Monotonic, and unique across the branches of a forked thread (the random part): two
        branches never write different values under one (channel, version)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:012}.{random.getrandbits(40):010x}"

    # -- async: the same code in Django's sync thread ----------------------------------------

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await _in_sync_thread(self.put)(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await _in_sync_thread(self.put_writes)(config, writes, task_id, task_path)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await _in_sync_thread(self.get_tuple)(config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        def collect() -> list[CheckpointTuple]:
            return list(self.list(config, filter=filter, before=before, limit=limit))

        for item in await _in_sync_thread(collect)():
            yield item

    async def adelete_thread(self, thread_id: str) -> None:
        await _in_sync_thread(self.delete_thread)(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await _in_sync_thread(self.delete_for_runs)(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await _in_sync_thread(self.copy_thread)(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await _in_sync_thread(lambda: self.prune(thread_ids, strategy=strategy))()


def _in_sync_thread(fn):
    # thread_sensitive: all ORM work of an event loop runs in one thread on one connection, as
    # Django's own async views do, so transactions and connection state stay where they began.
    return sync_to_async(fn, thread_sensitive=True)
