"""The in-memory replayer: re-execute a workflow against a history with every call stubbed by its record.

Nothing executes and nothing is written (a ``NullWriter`` stands in for the journal writer), so
the same replay serves the replay check of a live run (``journal.replay_check``), the gate a
worker runs before resuming a run on changed code (``check_before_resume``), ``manage.py
replay`` as a deploy gate, and golden journals kept as JSON in the manner of Temporal's
``Replayer`` with ``WorkflowHistory.from_json``::

    history = History.from_json(path.read_text())
    result = replay(history)          # ReplayCheck: .ok, .divergence (position, expected, got)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from journal.engine import registry
from journal.engine.history import History
from journal.engine.launch import harness_for
from journal.engine.protocol import ReplayExhausted
from journal.models import EventKind, Run, RunStatus
from journal.primitives.context import Context, _current
from journal.store.errors import LeaseLost, NondeterminismError
from journal.store.serialization import to_json


@dataclass
class Divergence:
    position: int
    expected: str
    got: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"step {self.position}: the journal recorded {self.expected}, the code now does {self.got}"
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass
class ReplayCheck:
    run_id: str
    ok: bool
    divergence: Divergence | None = None
    checked: int = 0  # positions verified against their records
    recorded: int = 0  # positions the journal holds
    outcome: str = ""  # how the replay ended: "returned", "exhausted", "raised <Type>"
    fingerprint: str = ""  # the code checked
    recorded_fingerprint: str = ""  # the code the run recorded
    notes: list[str] = field(default_factory=list)


class NullWriter:
    """A journal writer that writes nothing: a replay check must leave no trace in the run."""

    lost = None
    writes = 0

    def __init__(self) -> None:
        self.next_seq = 1

    def record(self, *args: Any, extra=None, **kwargs: Any) -> int:
        self.next_seq += 1
        return self.next_seq - 1

    def add_span(self, span: dict) -> None:
        pass

    def barrier(self, extra=None) -> None:
        pass

    def close(self) -> None:
        pass


def replay(history: History, defn: registry.WorkflowDef | None = None, *, run: Run | None = None) -> ReplayCheck:
    """Run the workflow (``defn``, else the registered one of the history) against ``history`` with every
    call stubbed; report the first divergence. ``run`` is the live row when there is one."""
    defn = defn or registry.get_workflow(history.workflow)
    return replay_in_memory(run or history.as_run(), defn, history.records, history.markers,
                            edited_state=history.edited_state)


def replay_in_memory(run: Run, defn: registry.WorkflowDef, recorded: dict, markers: dict, *,
                     edited_state: dict[int, dict] | None = None) -> ReplayCheck:
    """Run ``defn`` against ``recorded`` with every call stubbed; report the first divergence.

    ``edited_state``: a state fork's edit, applied where the fork's executions apply it."""
    ctx = Context(run=run, writer=NullWriter(), recorded=recorded, markers=dict(markers), worker_id="replay-check",
                  replay_only=True, edited_state=edited_state)
    result = ReplayCheck(run_id=str(run.id), ok=True, recorded=max(recorded, default=0),
                         fingerprint=defn.fingerprint, recorded_fingerprint=run.fingerprint)
    token = _current.set(ctx)
    try:
        output = defn.fn(ctx, *run.input.get("args", []), **run.input.get("kwargs", {}))
        result.outcome = "returned"
        result.checked = ctx.position
        later = sorted(p for p in recorded if p > ctx.position)
        if later:
            rec = recorded[later[0]]
            result.divergence = Divergence(later[0], rec["step_name"], "return (the workflow now ends earlier)")
        elif run.status == RunStatus.COMPLETED:
            got = to_json(output, what="the replayed output", limit=False)
            if got != run.output:
                result.divergence = Divergence(ctx.position + 1, f"return {_short(run.output)}",
                                               f"return {_short(got)}", "same calls, different output")
    except NondeterminismError as exc:
        result.outcome = "nondeterminism"
        result.checked = exc.position - 1
        result.divergence = Divergence(exc.position, exc.expected, exc.got, "a different call")
    except ReplayExhausted as exc:
        result.outcome = "exhausted"
        result.checked = exc.position - 1
        if run.status == RunStatus.COMPLETED:
            result.divergence = Divergence(exc.position, "the end of the run",
                                           f"a call to {exc.step_name}", "the code makes more calls")
    except Exception as exc:  # the code raised while replaying recorded results
        result.outcome = f"raised {type(exc).__name__}"
        result.checked = ctx.position
        got = f"raise {type(exc).__name__}: {_short(str(exc))}"
        later = sorted(p for p in (*recorded, *markers) if p > ctx.position)
        if later:  # the journal went on past the point where the code now fails
            expected = recorded[later[0]]["step_name"] if later[0] in recorded else "a wait"
            result.divergence = Divergence(later[0], expected, got, "the code now fails on recorded results")
        elif run.status == RunStatus.COMPLETED:
            result.divergence = Divergence(ctx.position + 1, f"return {_short(run.output)}", got,
                                           "the code now fails on recorded results")
        else:  # it failed here before too (or would fail live): no recorded call contradicts it
            result.notes.append(f"the replay ended raising {type(exc).__name__}: {_short(str(exc))}")
    except BaseException as exc:  # Suspend, Cancelled, NeedsAttention...: the code stopped where it would live
        if isinstance(exc, KeyboardInterrupt | SystemExit | LeaseLost):
            raise
        result.outcome = f"stopped ({type(exc).__name__})"
        result.checked = ctx.position
    finally:
        _current.reset(token)
    result.ok = result.divergence is None
    return result


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_before_resume(ctx, defn) -> None:
    """Replay-check a run that recorded steps on different code before it executes anything live.

    Raises NondeterminismError (the executor puts the run in needs_attention with the divergence)
    when the new code would not make the recorded calls.
    """
    run = ctx.run
    if not run.fingerprint or run.fingerprint == defn.fingerprint:
        return
    if ctx.recorded:
        check = replay_in_memory(run, defn, ctx.recorded, ctx.markers, edited_state=ctx.state_edits)
        if not check.ok:
            d = check.divergence
            raise NondeterminismError(d.position, d.expected, d.got,
                                      f"replay check before resuming on code {defn.fingerprint} (the run recorded "
                                      f"{run.fingerprint}): {d.detail}")
        ctx.writer.record(EventKind.LOG, {
            "message": f"replay-checked {check.checked} recorded step(s) on new code: compatible",
            "from_fingerprint": run.fingerprint, "to_fingerprint": defn.fingerprint,
            "from_version": run.version, "to_version": defn.version}, durability="exit")
    # The run continues on this code from now on: later resumes compare against it.
    harness = harness_for(defn)
    Run.objects.filter(id=run.id, epoch=ctx.epoch).update(
        fingerprint=defn.fingerprint, version=defn.version, harness=harness)
    run.fingerprint, run.version, run.harness_id = defn.fingerprint, defn.version, harness.id


