"""The workflows bench/peers/durable.py runs, at module level as durable-ui requires (a resumed
run finds its steps again by name). Imported only after ``django.setup()``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import journal

from .workloads import CRASH_STEP_SECONDS, effects_done, message, record_effect


@journal.step()
def tiny(i: int) -> int:
    return i + 1


@journal.step()
def reply(i: int) -> str:
    """Stands in for a model call returning a 1-KiB message."""
    return message(i)


@journal.step()
def work(i: int) -> int:
    time.sleep(CRASH_STEP_SECONDS)
    record_effect(Path(os.environ["PEERS_CRASH_LOG"]), i)
    return i


@journal.workflow(name="peers-sync", durability="sync")
def steps_sync(ctx, n: int) -> int:
    return sum(tiny(i) for i in range(n))


@journal.workflow(name="peers-async", durability="async")
def steps_async(ctx, n: int) -> int:
    return sum(tiny(i) for i in range(n))


@journal.workflow(name="peers-exit", durability="exit")
def steps_exit(ctx, n: int) -> int:
    return sum(tiny(i) for i in range(n))


@journal.workflow(name="peers-conversation")
def conversation(ctx, n: int, base: int) -> int:
    messages: list[str] = []
    for i in range(n):
        messages.append(reply(base + i))
        ctx.set_state({"messages": messages})
    return len(messages)


def _in_the_log(key: str, i: int) -> int | None:
    """``work_effect``'s reconcile: the log is the outside system, asked whether the key's call went through."""
    return i if key in effects_done(Path(os.environ["PEERS_CRASH_LOG"])) else None


@journal.step(effect=True, on_in_doubt="reconcile", reconcile=_in_the_log)
def work_effect(i: int, *, idempotency_key: str) -> int:
    """``work`` as an effect: the ledger knows it began; a crash before its result committed leaves it
    in doubt, and the resumed run asks the log for its key instead of running it again."""
    time.sleep(CRASH_STEP_SECONDS)
    record_effect(Path(os.environ["PEERS_CRASH_LOG"]), i, idempotency_key)
    time.sleep(float(os.environ.get("PEERS_EFFECT_TAIL", "0")))  # a test widens the in-doubt window with it
    return i


@journal.workflow(name="peers-crash")
def crash_run(ctx, n: int) -> int:
    return sum(work(i) for i in range(n))


@journal.workflow(name="peers-crash-effects")
def crash_effects_run(ctx, n: int) -> int:
    return sum(work_effect(i) for i in range(n))
