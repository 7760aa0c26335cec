"""A run's LangGraph thread as the stepper walks it, and "fork from here with edited state".

Reads are windowed and indexed: the thread's checkpoints are ordered by ``checkpoint_id`` (uuid6,
so by creation) on the (thread_id, checkpoint_ns, checkpoint_id) key; a window lists ids and
metadata only, and one checkpoint's values are decoded at a time (with its parent's, for the diff).

A fork is LangGraph's own time travel on a copy of the thread: the checkpoint and its ancestors
are copied to a new thread (the new run's id), ``graph.update_state`` on the copied checkpoint
writes the edit as a new checkpoint branching from it, and the new run invokes the graph with no
input, which continues from there. The parent's thread is never written.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.errors import InvalidUpdateError
from langgraph.types import Overwrite

import journal
from journal.contrib.langgraph.saver import JournalSaver
from journal.contrib.langgraph.workflows import compiled, plain
from journal.engine import registry
from journal.models import EventKind, LangGraphChannel, LangGraphCheckpoint, LangGraphWrite, Run, SessionEvent
from journal.operations import threads
from journal.store.errors import BadArgumentsError
from journal.store.serialization import to_json

NS = ""  # the root namespace: subgraphs' checkpoints are not walked
MAX_WINDOW = 200


def thread_of(run: Run) -> str:
    """The thread a graph run drives: the one it was started on, else its own id."""
    kwargs = (run.input or {}).get("kwargs") or {}
    return str(kwargs.get("thread_id") or run.id)


def _rows(run: Run):
    return LangGraphCheckpoint.objects.filter(thread_id=thread_of(run), checkpoint_ns=NS)


def _node_of(task_path: str) -> str:
    """The node of a task from its path ("~__pregel_pull, add_one" -> "add_one")."""
    return task_path.rsplit(", ", 1)[-1] if task_path else ""


def _visible(values: dict) -> dict:
    """Channel values without LangGraph's internal channels (branch triggers, __start__...)."""
    return {k: plain(v) for k, v in values.items() if not k.startswith(("branch:", "__"))}


class LangGraphThreads:
    """The ``journal.operations.threads`` bridge for threads stored by JournalSaver."""

    def __init__(self) -> None:
        self.saver = JournalSaver()

    def has_thread(self, run: Run) -> bool:
        return _rows(run).exists()

    def thread_total(self, run: Run) -> int:
        return _rows(run).count()

    def thread_checkpoints(self, run: Run, *, offset: int = 0, limit: int = 50) -> list[dict]:
        offset, limit = max(0, int(offset)), max(1, min(int(limit), MAX_WINDOW))
        rows = (_rows(run).order_by("checkpoint_id")
                .only("checkpoint_id", "parent_checkpoint_id", "metadata_type", "metadata", "created_at")
                [offset:offset + limit])
        out = []
        for i, row in enumerate(rows, offset + 1):
            meta = self.saver.serde.loads_typed((row.metadata_type, bytes(row.metadata)))
            out.append({"position": i, "checkpoint_id": row.checkpoint_id,
                        "parent_checkpoint_id": row.parent_checkpoint_id, "step": meta.get("step"),
                        "source": meta.get("source", ""), "created_at": row.created_at})
        return out

    def _position_of(self, run: Run, checkpoint_id: str) -> int:
        return _rows(run).filter(checkpoint_id__lte=checkpoint_id).count()

    def _tuple(self, run: Run, checkpoint_id: str):
        return self.saver.get_tuple({"configurable": {"thread_id": thread_of(run), "checkpoint_ns": NS,
                                                      "checkpoint_id": checkpoint_id}})

    def checkpoint_state(self, run: Run, *, position: int | None = None, checkpoint_id: str | None = None) -> dict:
        total = self.thread_total(run)
        if checkpoint_id is None:
            if not isinstance(position, int) or isinstance(position, bool) or not 1 <= position <= total:
                raise BadArgumentsError(f"checkpoint {position!r} is out of range: the thread of run {run.id} has "
                                        f"{total} checkpoint(s) (positions 1..{total})")
            checkpoint_id = _rows(run).order_by("checkpoint_id").values_list("checkpoint_id", flat=True)[position - 1]
        found = self._tuple(run, str(checkpoint_id))
        if found is None:
            raise BadArgumentsError(f"the thread of run {run.id} has no checkpoint {checkpoint_id!r}")
        position = self._position_of(run, found.config["configurable"]["checkpoint_id"])
        parent = self._tuple(run, found.parent_config["configurable"]["checkpoint_id"]) if found.parent_config \
            else None
        values = found.checkpoint["channel_values"]
        # The writes that made this checkpoint were saved against its parent (the tasks that ran from it).
        writes = [{"node": "", "task_id": task_id, "channel": channel, "value": plain(value)}
                  for task_id, channel, value in (parent.pending_writes if parent else [])]
        paths = dict(LangGraphWrite.objects.filter(
            thread_id=thread_of(run), checkpoint_ns=NS,
            checkpoint_id=parent.config["configurable"]["checkpoint_id"] if parent else "",
        ).values_list("task_id", "task_path")) if parent else {}
        for w in writes:
            w["node"] = _node_of(paths.get(w["task_id"], ""))
        metadata = found.metadata or {}
        return {
            "position": position, "total": total, "checkpoint_id": found.config["configurable"]["checkpoint_id"],
            "parent_checkpoint_id": (found.parent_config or {}).get("configurable", {}).get("checkpoint_id", ""),
            "step": metadata.get("step"), "source": metadata.get("source", ""),
            "values": _visible(values), "previous_values": _visible(parent.checkpoint["channel_values"])
            if parent else None,
            "nodes": sorted({w["node"] for w in writes if w["node"]}),
            "writes": [w for w in writes if not w["channel"].startswith(("branch:", "__"))],
            "next": sorted(k.split(":", 2)[2] for k in values if k.startswith("branch:to:")),
        }

    # -- fork -----------------------------------------------------------------------------------

    def fork_thread(self, run: Run, checkpoint_id: str, values: dict, *, as_node: str | None = None,
                    actor: str = "", reason: str = "") -> str:
        if not isinstance(values, dict):
            raise BadArgumentsError(f"the edited values must be a JSON object of channel -> value, not "
                                    f"{type(values).__name__}")
        values = to_json(values, what="the edited values")
        defn = registry.get_workflow(run.agent)
        build = getattr(defn.fn, "__durable_graph__", None)
        if build is None:
            raise BadArgumentsError(f"agent {run.agent!r} is not a graph workflow (@graph_workflow): "
                                    "its thread cannot be continued by a fork")
        source = self._tuple(run, str(checkpoint_id))
        if source is None:
            raise BadArgumentsError(f"the thread of run {run.id} has no checkpoint {checkpoint_id!r}")
        position = self._position_of(run, str(checkpoint_id))
        graph = compiled(build(), JournalSaver())
        update = self._update(graph, source.checkpoint["channel_values"], values)
        new_id = uuid.uuid4()
        target = str(new_id)
        try:
            with transaction.atomic():
                self._copy_upto(thread_of(run), target, str(checkpoint_id))
                if update or as_node:
                    graph.update_state({"configurable": {"thread_id": target, "checkpoint_ns": NS,
                                                         "checkpoint_id": str(checkpoint_id)}},
                                       update, as_node=as_node)
                journal.start_run(run.agent, [None], actor=actor, run_id=new_id, subject=run.subject or None)
                Run.objects.filter(id=new_id).update(forked_from=run, fork_step=1)
                SessionEvent.objects.create(run_id=new_id, seq=2, kind=EventKind.OPERATOR_ACTION, actor=actor,
                                            payload={"action": "fork", "forked_from": str(run.id), "at_step": 1,
                                                     "reason": reason, "override": False, "state": True,
                                                     "thread_checkpoint": str(checkpoint_id),
                                                     "checkpoint_position": position,
                                                     "edited_channels": sorted(update), "as_node": as_node or ""})
        except (InvalidUpdateError, ValueError, KeyError) as exc:  # LangGraph refused the update: nothing kept
            raise BadArgumentsError(f"LangGraph refused the edit at checkpoint {checkpoint_id}: {exc}") from None
        return target

    @staticmethod
    def _update(graph, current: dict, edited: dict) -> dict[str, Any]:
        """The channels the user changed, as an update that sets them to the edited value: a channel
        with a reducer gets ``Overwrite`` (else an edited list would be appended to itself)."""
        update: dict[str, Any] = {}
        for name, value in edited.items():
            channel = graph.channels.get(name)
            if channel is None or name.startswith(("branch:", "__")):
                known = sorted(k for k in graph.channels if not k.startswith(("branch:", "__")))
                raise BadArgumentsError(f"the graph has no state channel {name!r} (it has {', '.join(known)})")
            if name in current and plain(current[name]) == value:
                continue  # unchanged: the stored value (a message object, say) stays as it was
            update[name] = Overwrite(value) if isinstance(channel, BinaryOperatorAggregate) else value
        return update

    @staticmethod
    def _copy_upto(source: str, target: str, checkpoint_id: str) -> None:
        """Copy the checkpoint and its ancestors (not later ones, nor other branches) with every channel
        version (references only: the values are shared blobs) and the ancestors' pending writes."""
        links = dict(LangGraphCheckpoint.objects.filter(thread_id=source, checkpoint_ns=NS,
                                                        checkpoint_id__lte=checkpoint_id)
                     .values_list("checkpoint_id", "parent_checkpoint_id"))
        chain, at = [], checkpoint_id
        while at and at in links:
            chain.append(at)
            at = links[at]

        def copies(model, qs):
            fields = [f.name for f in model._meta.concrete_fields if f.name not in ("id", "thread_id")]
            return [model(thread_id=target, **{f: getattr(obj, f) for f in fields}) for obj in qs.iterator()]

        LangGraphCheckpoint.objects.bulk_create(copies(LangGraphCheckpoint, LangGraphCheckpoint.objects.filter(
            thread_id=source, checkpoint_ns=NS, checkpoint_id__in=chain)), batch_size=500)
        LangGraphChannel.objects.bulk_create(copies(LangGraphChannel, LangGraphChannel.objects.filter(
            thread_id=source, checkpoint_ns=NS)), batch_size=500)
        LangGraphWrite.objects.bulk_create(copies(LangGraphWrite, LangGraphWrite.objects.filter(
            thread_id=source, checkpoint_ns=NS, checkpoint_id__in=chain[1:])), batch_size=500)


threads.register(LangGraphThreads())
