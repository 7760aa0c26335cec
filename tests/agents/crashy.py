"""A twelve-step workflow with effects, instrumented to count executions in a file.

Each execution appends a line to $DURABLE_TEST_DIR/executions.log *before* doing its work, so a
step that is killed mid-way still counts: the tests can tell "ran twice" from "replayed".
"""

import os
import signal
import time
from pathlib import Path

import journal


def _log(line: str) -> None:
    path = Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "executions.log"
    with open(path, "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _maybe_die(i: int) -> None:
    """CRASHY_KILL_AT=8 kills this process inside step 8, once (a marker file remembers)."""
    if os.environ.get("CRASHY_KILL_AT") != str(i):
        return
    marker = Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / f"killed-at-{i}"
    if not marker.exists():
        marker.write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)


def _log_run(line: str) -> None:
    path = Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "by-run.log"
    with open(path, "a") as fh:
        fh.write(f"{journal.current().run_id} {line}\n")


@journal.step()
def work(i: int) -> int:
    _log(f"step {i}")
    _log_run(f"step {i}")
    _maybe_die(i)
    time.sleep(float(os.environ.get("CRASHY_STEP_SLEEP", "0.01")))
    return i * i


@journal.step(effect=True)
def notify(total: int, *, idempotency_key: str, fencing_token: int) -> dict:
    _log(f"effect {idempotency_key}")
    return {"sent": total, "token": fencing_token}


@journal.step(effect=True, on_in_doubt="retry")
def notify_idempotent(total: int, *, idempotency_key: str) -> dict:
    _log(f"effect-retry {idempotency_key}")
    return {"sent": total}


@journal.workflow(name="twelve")
def twelve(ctx, n: int = 12, effect_every: int = 4) -> dict:
    total = 0
    for i in range(1, n + 1):
        total += work(i)
        if effect_every and i % effect_every == 0:
            notify(total)
    return {"total": total}


@journal.workflow(name="twelve_async", durability="async")
def twelve_async(ctx, n: int = 12, effect_every: int = 4) -> dict:
    return twelve(ctx, n, effect_every)


@journal.workflow(name="twelve_exit", durability="exit")
def twelve_exit(ctx, n: int = 12, effect_every: int = 4) -> dict:
    return twelve(ctx, n, effect_every)


@journal.workflow(name="retry_effect")
def retry_effect(ctx) -> dict:
    total = work(1)
    return notify_idempotent(total)


def executions(test_dir) -> list[str]:
    path = Path(test_dir) / "executions.log"
    return path.read_text().splitlines() if path.exists() else []


def executions_by_run(test_dir) -> list[str]:
    path = Path(test_dir) / "by-run.log"
    return path.read_text().splitlines() if path.exists() else []


@journal.step(durability="exit")
def cheap(i: int) -> int:
    """A cheap read-only step: its record may ride along with the next durable write."""
    _log(f"cheap {i}")
    return i


@journal.workflow(name="mixed")
def mixed(ctx) -> int:
    return cheap(1) + cheap(2) + work(3) + work(4)
