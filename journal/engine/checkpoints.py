"""Checkpoint policy: decide after each step whether recovery needs a checkpoint, and read them back.

Replaying the journal rebuilds a run's control flow and recorded results, but not the files its
commands changed: that is what a checkpoint holds (a manifest path -> sha256 into the
content-addressed blob store, plus explicit agent state).

``every`` checkpoints after each step; ``selective`` (the default) only when the step changed
recovery-relevant state (sandbox files, explicit agent state) or is marked ``checkpoint=True``;
``manual`` only when marked. Every step's journal record says what was decided and why
(``"checkpoint": "skipped: no sandbox or state change"``), so the dashboard can show skipped
steps without a row (or a statement) of their own; a taken checkpoint is one Checkpoint row
written in the same transaction as the step's record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from journal.engine.protocol import result_of
from journal.engine.sandbox_exec import sandbox_root
from journal.models import Checkpoint, CheckpointDecision, EventKind, Run, SessionEvent
from journal.store import blobs

SKIP_PREFIX = "skipped: "
TAKEN_PREFIX = "taken: "


def decide(ctx, defn) -> tuple[bool, str]:
    """(take?, why) for the step that just ran."""
    policy = ctx.run.checkpoint_policy
    marked = getattr(defn, "checkpoint", None)
    if marked is False:
        return False, "step marked checkpoint=False"
    if marked is True:
        return True, "step marked checkpoint=True"
    if policy == "every":
        return True, "policy every"
    if policy == "manual":
        return False, "policy manual: step not marked"
    changed = []
    if ctx.sandbox_dirty:
        changed.append("sandbox files")
    # A replayed set_state() re-marks the state dirty; only a value the last checkpoint lacks counts.
    if ctx.state_dirty and ctx.agent_state != ctx.checkpointed_state:
        changed.append("agent state")
    if changed:
        return True, "changed " + " and ".join(changed)
    return False, "no sandbox or state change"


def _unsaved_contents(ctx, manifest: dict[str, str]) -> list[bytes]:
    """Bytes of the files changed since the last checkpoint (the only ones that may be new to the store)."""
    unsaved = ctx.sandbox_unsaved
    if not unsaved:
        return []
    root = sandbox_root(ctx.run_id)
    out = []
    for path in sorted(unsaved):
        sha = manifest.get(path)
        if sha is None or sha.startswith("->"):  # deleted since, or a symlink (kept in the manifest itself)
            continue
        out.append((root / path).read_bytes())
    return out


def after_step(ctx, position: int, defn, commit: Callable[[Callable[[], None] | None], None],
               payload: dict | None = None) -> None:
    """Commit the step's record, with a checkpoint in the same transaction when the policy says so.

    ``payload`` is the step's journal record: the decision and its reason are added to it.
    """
    take, reason = decide(ctx, defn)
    if payload is not None:
        payload["checkpoint"] = (TAKEN_PREFIX if take else SKIP_PREFIX) + reason
    if not take:
        commit(None)
        return
    state = ctx.agent_state
    stored_state, state_bytes, chain = encode_state(ctx, position, state)
    manifest = dict(ctx.sandbox_manifest or {})
    contents = _unsaved_contents(ctx, manifest)
    changed = len(ctx.sandbox_unsaved or ())

    def write_checkpoint() -> None:
        _, written = blobs.put_many(contents)
        meta = len(json.dumps(manifest, separators=(",", ":"))) + state_bytes
        Checkpoint.objects.create(
            run_id=ctx.run_id, position=position, step_name=getattr(defn, "name", ""),
            decision=CheckpointDecision.TAKEN, reason=reason, manifest=manifest, state=stored_state,
            bytes_written=written + meta, files_changed=changed,
        )

    commit(write_checkpoint)
    ctx.state_dirty = False
    ctx.sandbox_dirty = False
    ctx.sandbox_unsaved = set()
    ctx.checkpointed_state = state
    ctx.checkpointed_position = position
    ctx.state_chain = chain


# -- explicit agent state, stored as deltas ------------------------------------------------------
# A conversation kept in ctx.set_state() grows by a message a step; storing it whole at every
# checkpoint is the O(n^2) of snapshot-per-step checkpointers. A checkpoint stores the state whole
# only when the deltas written since the last whole copy outweigh it (so whole copies at most
# double in size: O(n) in total); otherwise {"__delta__": {"base": position, "append", "set", "unset"}}
# against the previous checkpoint of the same run.
#
# The messages of such a conversation are what its steps returned, and each step's record holds
# its result already. So a value of the state (or an item of a list in it) whose JSON is a result
# this execution recorded is stored as {"__result__": position} and read back from that record:
# the conversation is written once, not three times (record, delta, whole copies). A checkpoint
# that refers is a delta marked "refs" (a whole copy is one with base None); only its items are
# read as references, so a state of the workflow's own that holds such a dict is never misread.

DELTA_KEY = "__delta__"
RESULT_KEY = "__result__"
RESULT_MIN = 256  # bytes of JSON: a shorter result is stored again rather than referred to
RESULTS_KEPT = 100_000  # results an execution remembers (a digest and a position each)


def note_results(ctx, results: dict[int, Any]) -> None:
    """Results a resumed execution read back through its checkpoint's references: its next
    checkpoints refer to them again rather than copying them in."""
    for position, value in results.items():
        note_result(ctx, position, json.dumps(value, sort_keys=True, separators=(",", ":")))


def note_result(ctx, position: int, result_text: str) -> None:
    """A step at ``position`` recorded this result (its canonical JSON): the state may refer to it."""
    if len(result_text) < RESULT_MIN:
        return
    known = ctx.result_positions
    known[_digest(result_text)] = position
    if len(known) > RESULTS_KEPT:
        del known[next(iter(known))]


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"))) if value is not None else 0


def _delta(prev: dict, state: dict) -> dict:
    append: dict[str, list] = {}
    changed: dict[str, Any] = {}
    for key, value in state.items():
        old = prev.get(key, _MISSING)
        if old == value:
            continue
        if isinstance(value, list) and isinstance(old, list) and len(value) > len(old) and value[:len(old)] == old:
            append[key] = value[len(old):]
        else:
            changed[key] = value
    return {"append": append, "set": changed, "unset": sorted(k for k in prev if k not in state)}


_MISSING = object()


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(RESULT_KEY), int)


class _Refer:
    """Replaces recorded results by references in a delta's values and list items."""

    def __init__(self, known: dict[bytes, int]):
        self.known = known
        self.used = False
        self.clash = False  # the state holds a dict shaped like a reference: refer to nothing

    def one(self, value: Any) -> Any:
        if _is_ref(value):
            self.clash = True
            return value
        if isinstance(value, str) and len(value) < RESULT_MIN - 2:
            return value
        if isinstance(value, (str, list, dict)):
            text = json.dumps(value, sort_keys=True, separators=(",", ":"))
            if len(text) >= RESULT_MIN and (position := self.known.get(_digest(text))) is not None:
                self.used = True
                return {RESULT_KEY: position}
        return value

    def value(self, value: Any) -> Any:
        referred = self.one(value)
        if referred is value and isinstance(value, list):
            return [self.one(item) for item in value]
        return referred

    def items(self, values: list) -> list:
        return [self.one(item) for item in values]


def _referring(delta: dict, known: dict[bytes, int]) -> dict:
    """The delta with references, marked "refs", or the delta as it is when nothing was referred to."""
    if not known:
        return delta
    refer = _Refer(known)
    out = {**delta, "append": {k: refer.items(v) for k, v in delta.get("append", {}).items()},
           "set": {k: refer.value(v) for k, v in delta.get("set", {}).items()}}
    if not refer.used or refer.clash:
        return delta
    return {**out, "refs": True}


def _whole(state: dict | None, known: dict[bytes, int]) -> tuple[Any, int, tuple[int, int] | None]:
    if isinstance(state, dict) and known:
        delta = _referring({"append": {}, "set": state, "unset": []}, known)
        if delta.get("refs"):
            stored = {DELTA_KEY: {"base": None, **delta}}
            size = _size(stored)
            return stored, size, (size, 0)
    size = _size(state)
    return state, size, (size, 0) if state is not None else None


def encode_state(ctx, position: int, state: dict | None) -> tuple[Any, int, tuple[int, int] | None]:
    """(what to store, its size, the new (whole_bytes, delta_bytes) chain) for a checkpoint."""
    prev = ctx.checkpointed_state
    chain = ctx.state_chain
    base = ctx.checkpointed_position
    known = ctx.result_positions
    if state is None or not isinstance(state, dict) or not isinstance(prev, dict) or chain is None or base is None:
        return _whole(state, known)
    stored = {DELTA_KEY: {"base": base, **_referring(_delta(prev, state), known)}}
    size = _size(stored)
    whole_bytes, delta_bytes = chain
    if delta_bytes + size > whole_bytes:
        return _whole(state, known)
    return stored, size, (whole_bytes, delta_bytes + size)


def _apply(state: dict, delta: dict, results: dict[int, Any]) -> dict:
    if delta.get("refs"):
        def back(value: Any) -> Any:
            return results[value[RESULT_KEY]] if _is_ref(value) else value

        delta = {"append": {k: [back(i) for i in v] for k, v in delta.get("append", {}).items()},
                 "set": {k: [back(i) for i in v] if isinstance(v, list) else back(v)
                         for k, v in delta.get("set", {}).items()},
                 "unset": delta.get("unset", [])}
    out = dict(state)
    for key, items in delta.get("append", {}).items():
        out[key] = list(out.get(key, [])) + list(items)
    out.update(delta.get("set", {}))
    for key in delta.get("unset", []):
        out.pop(key, None)
    return out


def _referred(run_id, chain: list[dict]) -> dict[int, Any]:
    """The recorded results the chain's deltas refer to (one query; none when they refer to nothing)."""
    positions: set[int] = set()
    for delta in chain:
        if not delta.get("refs"):
            continue
        for values in (*delta.get("append", {}).values(), *delta.get("set", {}).values()):
            for value in values if isinstance(values, list) else [values]:
                if _is_ref(value):
                    positions.add(value[RESULT_KEY])
    if not positions:
        return {}
    rows = (SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED, position__in=positions)
            .order_by("seq").values_list("position", "payload"))
    results = {position: result_of(payload) for position, payload in rows if "error" not in payload}
    missing = positions - results.keys()
    if missing:
        raise LookupError(f"run {run_id}: the state refers to results the journal lacks (step {min(missing)})")
    return results


def decode_state(run_id, checkpoint: Checkpoint, referred: dict[int, Any] | None = None) -> dict | None:
    """The full agent state of a checkpoint, following its delta chain (one query, and one more for
    the step results it refers to: put in ``referred``, position -> result, when given)."""
    state = checkpoint.state
    if not (isinstance(state, dict) and DELTA_KEY in state):
        return state
    chain = [state[DELTA_KEY]]
    wanted = state[DELTA_KEY]["base"]
    base_state = {} if wanted is None else None
    if wanted is not None:
        rows = (Checkpoint.objects.filter(run_id=run_id, decision=CheckpointDecision.TAKEN, position__lte=wanted)
                .order_by("-position", "-id").values_list("position", "state").iterator())
        for pos, st in rows:
            if pos != wanted:
                continue
            if isinstance(st, dict) and DELTA_KEY in st:
                chain.append(st[DELTA_KEY])
                wanted = st[DELTA_KEY]["base"]
                if wanted is None:  # a whole copy that refers to results
                    base_state = {}
                    break
                continue
            base_state = st or {}
            break
        else:
            raise LookupError(f"run {run_id}: the state delta chain of checkpoint {checkpoint.position} is broken")
    results = _referred(run_id, chain)
    if referred is not None:
        referred.update(results)
    for delta in reversed(chain):
        base_state = _apply(base_state, delta, results)
    return base_state


# -- reading checkpoints back: recovery, fork and time travel ----------------------------------

def latest_checkpoint(run_id, position: int | None = None) -> Checkpoint | None:
    """The latest taken checkpoint of this run at or before ``position`` (None: any position)."""
    qs = Checkpoint.objects.filter(run_id=run_id, decision=CheckpointDecision.TAKEN)
    if position is not None:
        qs = qs.filter(position__lte=position)
    return qs.order_by("-position", "-id").only("id", "run_id", "position", "manifest", "state").first()


def checkpoint_for(run_id, position: int | None = None) -> Checkpoint | None:
    """Like latest_checkpoint, following fork lineage: a fork that has no checkpoint of its own at
    or before ``position`` inherits its parent's files at the step it was forked from."""
    seen = set()
    while run_id is not None and run_id not in seen:
        seen.add(run_id)
        found = latest_checkpoint(run_id, position)
        if found is not None:
            return found
        parent = Run.objects.filter(id=run_id).values_list("forked_from_id", "fork_step").first()
        if parent is None or parent[0] is None:
            return None
        run_id, fork_step = parent
        position = fork_step if position is None or fork_step is None else min(position, fork_step)
    return None


def manifest_at(run_id, position: int) -> dict[str, str]:
    """The sandbox files at step ``position`` (1-based) as path -> sha256 (a symlink: "->target").

    The latest taken checkpoint at or before that step; {} when there is none (an empty sandbox).
    """
    found = checkpoint_for(run_id, position)
    return dict(found.manifest) if found is not None else {}


def state_at_checkpoint(run_id, position: int) -> dict | None:
    """Explicit agent state (ctx.set_state) as of the latest checkpoint at or before ``position``."""
    found = checkpoint_for(run_id, position)
    return decode_state(found.run_id, found) if found is not None else None


def files_at(run_id, position: int) -> dict[str, bytes]:
    """The sandbox's regular files at step ``position``: path -> bytes (symlinks left out)."""
    manifest = manifest_at(run_id, position)
    return read_manifest(manifest)


def read_manifest(manifest: dict[str, str]) -> dict[str, bytes]:
    wanted = {p: sha for p, sha in manifest.items() if not sha.startswith("->")}
    contents = blobs.get_many(list(wanted.values()))
    missing = sorted(p for p, sha in wanted.items() if sha not in contents)
    if missing:
        raise LookupError(f"checkpoint blobs missing from the store for {len(missing)} file(s), e.g. {missing[0]!r}")
    return {p: contents[sha] for p, sha in wanted.items()}


FORK_STATE = "fork: edited state"  # the step_name of the checkpoint a state fork starts from


def edited_state(run: Run) -> dict[int, dict]:
    """position -> state for a fork made with edited state (``journal.fork(..., state=...)``), else {}.

    The edit is a checkpoint of the fork at its fork step, written by ``fork``; the context reads it
    on every execution of the fork (first run, resume, recovery, replay check), so the workflow sees
    the same edited state each time rather than what its replayed code would have set. A fork of
    such a fork inherits the edit's checkpoint (it replays the steps that saw it), hence a mapping.
    One indexed query, only for forks.
    """
    if run.forked_from_id is None or not run.fork_step:
        return {}
    rows = (Checkpoint.objects.filter(run_id=run.id, position__lte=run.fork_step, step_name=FORK_STATE)
            .order_by("id").values_list("position", "state"))
    out: dict[int, dict] = {}
    for position, state in rows:
        if isinstance(state, dict):
            out.setdefault(position, state)
    return out


def step_decisions(run_id) -> dict[int, dict[str, Any]]:
    """Per step position: {"decision": "taken"|"skipped", "reason", "bytes"} for the dashboard.

    Skips come from the steps' journal records (no rows of their own); taken ones from Checkpoint.
    """
    out: dict[int, dict[str, Any]] = {}
    rows = SessionEvent.objects.filter(run_id=run_id, kind=EventKind.STEP_COMPLETED, position__isnull=False,
                                       payload__has_key="checkpoint").values_list("position", "payload")
    for position, payload in rows:
        note = str(payload.get("checkpoint", ""))
        if note.startswith(SKIP_PREFIX):
            out[position] = {"decision": "skipped", "reason": note[len(SKIP_PREFIX):], "bytes": 0}
    for cp in Checkpoint.objects.filter(run_id=run_id, decision=CheckpointDecision.TAKEN).values(
            "position", "reason", "bytes_written", "files_changed"):
        out[cp["position"]] = {"decision": "taken", "reason": cp["reason"], "bytes": cp["bytes_written"],
                               "files_changed": cp["files_changed"]}
    return out


__all__ = ["FORK_STATE", "after_step", "checkpoint_for", "decide", "decode_state", "edited_state", "files_at",
           "latest_checkpoint", "manifest_at", "read_manifest", "state_at_checkpoint", "step_decisions"]
