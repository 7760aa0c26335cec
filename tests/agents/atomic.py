"""Atomic steps: writes to the application's own database (here Django's auth users) that commit
with their journal record. Each execution is logged to $DURABLE_TEST_DIR/atomic.log first, so
the tests can tell "ran again after a rollback" from "replayed"."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from django.contrib.auth.models import User

import journal


def log_path() -> Path:
    return Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "atomic.log"


def executions() -> list[str]:
    return log_path().read_text().splitlines() if log_path().exists() else []


def _log(line: str) -> None:
    with log_path().open("a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@journal.step(atomic=True)
def add_user(name: str) -> int:
    _log(f"add {name}")
    user = User.objects.create(username=name)
    _maybe_die(name)
    return user.id


def _maybe_die(name: str) -> None:
    """ATOMIC_KILL_AFTER_WRITE=<name>: SIGKILL this process inside the step, after its write, once."""
    if os.environ.get("ATOMIC_KILL_AFTER_WRITE") != name:
        return
    marker = log_path().with_name(f"killed-after-{name}")
    if not marker.exists():
        marker.write_text("x")
        os.kill(os.getpid(), signal.SIGKILL)


@journal.step(atomic=True, retries=1, retry_delay=0.01)
def add_user_then_fail_once(name: str) -> int:
    _log(f"flaky {name}")
    user = User.objects.create(username=name)
    if len([line for line in executions() if line == f"flaky {name}"]) == 1:
        raise RuntimeError("the first attempt breaks after its write")
    return user.id


@journal.workflow(name="atomic-users")
def atomic_users(ctx, names: list) -> list:
    return [add_user(name) for name in names]


@journal.workflow(name="atomic-flaky")
def atomic_flaky(ctx, name: str) -> int:
    return add_user_then_fail_once(name)
