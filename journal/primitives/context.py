"""journal.Context: what a workflow sees of its run, and the per-run state the engine keeps while driving it.

The current context lives in a ContextVar (one per driving thread); ``current()`` fails loudly
outside a workflow. Everything nondeterministic a workflow needs (time, randomness, ids,
waiting) goes through it so that replay returns what the first execution saw. Each such method
is an ``engine_call``: a database outage inside it is the engine's, never the workflow's failure.

Forbidden in workflow code (do it in a step, or through the context): reading the clock,
random numbers, uuid generation, network or file I/O, reading mutable globals, threads.
"""

from __future__ import annotations

import contextvars
import copy
import random as _random
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from journal.engine.protocol import record_value
from journal.models import EventKind, Run
from journal.primitives.approvals import request_approval
from journal.primitives.children import map_children, run_child
from journal.primitives.llm import model_call
from journal.primitives.sandbox import SandboxHandle
from journal.primitives.versioning import patched
from journal.primitives.waits import sleep, wait_for_signal
from journal.store.errors import Cancelled, DurableError, Released
from journal.store.outage import engine_call
from journal.store.serialization import check_text, to_json
from journal.store.writer import JournalWriter

_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar("journal_context", default=None)


def current() -> Context:
    ctx = _current.get()
    if ctx is None:
        raise DurableError("no workflow is running in this thread: journal.current() works only inside a workflow")
    return ctx


def current_or_none() -> Context | None:
    return _current.get()


class Context:
    """Handed to every workflow as its first argument."""

    def __init__(self, *, run: Run, writer: JournalWriter, recorded: dict[int, dict], markers: dict[int, dict],
                 worker_id: str = "", replay_only: bool = False, edited_state: dict[int, dict] | None = None):
        """``writer`` is the run's fenced journal writer (the in-memory replayer passes one that writes nothing).

        ``edited_state={N: state}`` for a fork made with edited state: once call N-1 has been made
        (at once when N is 1) ``ctx.state`` is ``state``, and ``set_state`` calls the replayed code
        makes before call N begins are superseded by it, so step N and everything after it see the
        edit on every execution of the fork.
        """
        self.run = run
        self.run_id: str = str(run.id)
        self.agent: str = run.agent
        self.epoch: int = run.epoch
        self.writer = writer
        self.recorded = recorded  # position -> {"kind", "step_name", "payload"}
        self.markers = markers  # position -> {kind: payload} for waits and timers
        self.worker_id = worker_id
        self.replay_only = replay_only
        self.position = 0
        self.in_step = False
        self.last_result_text = ""  # the JSON text of the last step result, encoded once
        self.mode: str = run.durability
        self.interrupt: str | None = None  # "cancel" | "release" | "pause", set by the heartbeat thread
        self.interrupt_reason = ""
        self.progress: dict | None = run.progress
        self.progress_dirty = False
        self.agent_state: dict | None = None
        self.state_dirty = False
        self.tokens = 0
        self.cost = 0.0
        self.lock = threading.Lock()
        self.patches: dict[str, bool] = {}  # ctx.patched() answers, one per change id per execution
        # The sandbox and checkpoints (journal.engine.restore prepares them, journal.engine.checkpoints
        # consumes them): the workspace manifest now, files changed since the last checkpoint, and the
        # explicit state as last checkpointed (with its delta chain).
        self.sandbox_handle: SandboxHandle | None = None
        self.sandbox_manifest: dict[str, str] = {}
        self.sandbox_unsaved: set[str] = set()
        self.sandbox_dirty = False
        self.checkpointed_state: dict | None = None
        self.checkpointed_position: int | None = None
        self.state_chain: list | None = None
        self.result_positions: dict[bytes, int] = {}  # results recorded live, which the state may refer to
        self.state_edits: dict[int, dict] = dict(edited_state or {})
        if 1 in self.state_edits:
            self._apply_state_edit()

    # -- bookkeeping the engine uses ---------------------------------------------------
    def next_position(self) -> int:
        self.position += 1
        if self.state_edits and self.position + 1 in self.state_edits:
            self._apply_state_edit()
        return self.position

    def _apply_state_edit(self) -> None:
        self.agent_state = copy.deepcopy(self.state_edits[self.position + 1])
        self.state_dirty = True

    def _state_pinned(self) -> bool:
        """Between the end of call N-1 and the start of call N of a state fork: the edit stands."""
        return bool(self.state_edits) and self.position + 1 in self.state_edits

    def check_interrupts(self) -> None:
        """Cooperative stop points: cancellation, pause and shutdown act at step boundaries."""
        what = self.interrupt
        if what == "cancel":
            raise Cancelled(self.interrupt_reason or "cancelled")
        if what in ("release", "pause"):
            raise Released(what)

    # -- replay-safe primitives ----------------------------------------------------------
    @engine_call
    def now(self) -> datetime:
        """The current time, recorded: replay returns the time the first execution saw."""
        return datetime.fromisoformat(record_value(self, "now", lambda: timezone.now().isoformat()))

    @engine_call
    def random(self) -> float:
        return record_value(self, "random", _random.random)

    @engine_call
    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(record_value(self, "uuid4", lambda: str(uuid.uuid4())))

    # -- waiting without a thread ----------------------------------------------------------
    @engine_call
    def sleep(self, duration: timedelta | float) -> None:
        """A durable timer: the run suspends and any worker resumes it when it is due."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
        sleep(self, seconds=seconds)

    @engine_call
    def sleep_until(self, when: datetime) -> None:
        sleep(self, until=when)

    @engine_call
    def wait_for_signal(self, name: str, timeout: timedelta | float | None = None) -> Any:
        """Suspend until a signal named ``name`` arrives; returns its payload.

        Raises journal.WaitTimeout when ``timeout`` passes first.
        """
        return wait_for_signal(self, name, timeout)

    @engine_call
    def request_approval(self, prompt: str, **options: Any) -> Any:
        """Suspend until a person with the right role decides; returns the decision."""
        return request_approval(self, prompt, **options)

    @engine_call
    def child(self, workflow: Any, *args: Any, **kwargs: Any) -> Any:
        """Start a child run and wait for its result durably (the parent suspends meanwhile)."""
        return run_child(self, workflow, args, kwargs)

    @engine_call
    def map_children(self, workflow: Any, items: list, *, concurrency: int = 8) -> list:
        """Fan out one child per item, at most ``concurrency`` at a time; results in item order."""
        return map_children(self, workflow, items, concurrency=concurrency)

    # -- the sandbox, models and explicit state ---------------------------------------------
    @property
    def sandbox(self):
        if self.sandbox_handle is None:
            self.sandbox_handle = SandboxHandle(self)
        return self.sandbox_handle

    @engine_call
    def model(self, client: Any, messages: list[dict], **params: Any) -> Any:
        """A model call as a durable step: recorded with tokens and cost, never re-sent on replay."""
        return model_call(self, client, messages, **params)

    @property
    def state(self) -> dict | None:
        """Explicit agent state: what the checkpoint keeps besides the sandbox files."""
        return self.agent_state

    def set_state(self, state: dict) -> None:
        value = to_json(state, what="agent state")
        if self._state_pinned():  # a state fork: the operator's edit replaces what the replayed code sets here
            return
        self.agent_state = value
        self.state_dirty = True

    def set_progress(self, done: int, total: int | None = None, label: str = "") -> None:
        """Progress an operator sees in the runs list and run page (written with the heartbeat)."""
        self.progress = {"done": int(done), "total": total, "label": label}
        self.progress_dirty = True

    @engine_call
    def set_subject(self, subject: str) -> None:
        """Link this run to the person (customer, user) whose data it holds: what ``journal.erase(subject=)``
        finds. Written at once with a ``subject_set`` event, fenced like every journal write; calling it
        again with the same subject (as every replay does) writes nothing. A run has one subject."""
        if not isinstance(subject, str) or not subject.strip() or len(subject) > 200:
            raise DurableError("a subject is a non-empty string of at most 200 characters")
        check_text(subject, what="the subject")
        if subject == self.run.subject:
            return
        if self.run.subject:
            raise DurableError(f"run {self.run_id} is already linked to another subject; a run has one subject")
        run_id, epoch = self.run.id, self.epoch

        def link() -> None:
            Run.objects.filter(id=run_id, epoch=epoch).update(subject=subject)

        self.writer.record(EventKind.SUBJECT_SET, {"subject": subject}, actor=self.worker_id, extra=link)
        self.run.subject = subject

    @engine_call
    def patched(self, change_id: str) -> bool:
        """True for runs that reach this point on code that has the change; see journal.primitives.versioning."""
        return patched(self, change_id)

    @engine_call
    def log(self, message: str, **data: Any) -> None:
        self.writer.record(EventKind.LOG, to_json({"message": message, **data}), durability="exit")
