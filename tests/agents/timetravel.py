"""Agents for tests of fork, replay checks, versioning and operator actions.

Steps append to $DURABLE_TEST_DIR/steps.log when they really execute, so tests can tell an
execution from a replay.
"""

import os
from pathlib import Path

import journal


def test_dir() -> Path:
    return Path(os.environ.get("DURABLE_TEST_DIR", "/tmp"))


def executed() -> list[str]:
    path = test_dir() / "steps.log"
    return path.read_text().splitlines() if path.exists() else []


@journal.step()
def add(a: int, b: int) -> int:
    with open(test_dir() / "steps.log", "a") as fh:
        fh.write(f"add {a} {b}\n")
    return a + b


@journal.step()
def verdict(total: int) -> dict:
    with open(test_dir() / "steps.log", "a") as fh:
        fh.write(f"verdict {total}\n")
    return {"verdict": "approve" if total < 100 else "reject"}


@journal.step(effect=True)
def send(message: str, *, idempotency_key: str) -> dict:
    with open(test_dir() / "steps.log", "a") as fh:
        fh.write(f"send {message} {idempotency_key}\n")
    return {"sent": message, "key": idempotency_key}


@journal.workflow(name="tt-pipeline")
def pipeline(ctx, n: int) -> dict:
    """n additions with explicit state, a verdict, then an effect that announces it."""
    total = 0
    for i in range(1, n + 1):
        total = add(total, i)
        ctx.set_state({"total": total, "i": i})
    v = verdict(total)
    sent = send(f"{v['verdict']}:{total}")
    return {"total": total, "verdict": v["verdict"], "sent": sent["sent"]}


@journal.workflow(name="tt-state", signals=("go",))
def state_flow(ctx, n: int, wait: bool = False) -> dict:
    """Explicit state drives the work: each addition reads the running total from ctx.state (so a
    fork with edited state changes what the later steps compute); optionally waits before the verdict."""
    ctx.set_state({"total": 0, "seen": []})
    for i in range(1, n + 1):
        st = ctx.state
        total = add(st["total"], i)
        ctx.set_state({"total": total, "seen": [*st["seen"], i]})
    if wait:
        ctx.wait_for_signal("go")
    v = verdict(ctx.state["total"])
    return {"total": ctx.state["total"], "seen": ctx.state["seen"], "verdict": v["verdict"]}


@journal.workflow(name="tt-wait", signals=("go",))
def waiter(ctx, n: int) -> dict:
    """n additions, then a wait for a signal, then one more addition."""
    total = 0
    for i in range(1, n + 1):
        total = add(total, i)
    extra = ctx.wait_for_signal("go")
    return {"total": add(total, extra)}


@journal.step()
def flaky(path: str) -> str:
    """Fails while the file ``path`` exists (an outage an operator fixes, then retries)."""
    if Path(path).exists():
        raise RuntimeError("service unavailable")
    return "ok"


@journal.workflow(name="tt-flaky")
def flaky_flow(ctx, path: str) -> dict:
    first = add(1, 2)
    return {"first": first, "flaky": flaky(path)}


@journal.step(effect=True)
def pay(amount: int, *, idempotency_key: str) -> dict:
    with open(test_dir() / "steps.log", "a") as fh:
        fh.write(f"pay {amount} {idempotency_key}\n")
    return {"paid": amount}


@journal.workflow(name="tt-pay")
def pay_flow(ctx, amount: int) -> dict:
    first = add(amount, 0)
    receipt = pay(first)
    return {"receipt": receipt, "after": add(first, 1)}


@journal.step()
def tick(i: int) -> int:
    import time

    time.sleep(0.05)
    return i


@journal.workflow(name="tt-slow")
def slow(ctx, n: int) -> int:
    return sum(tick(i) for i in range(n))


@journal.workflow(name="tt-files")
def files_flow(ctx) -> dict:
    """Sandbox files around a decision: forking at the decision with an override changes what is written."""
    ctx.sandbox.write_file("notes.txt", "start")
    total = add(1, 2)
    ctx.sandbox.write_file("sum.txt", str(total))
    ctx.set_state({"total": total})
    decision = verdict(total)
    ctx.sandbox.write_file(f"{decision['verdict']}.txt", "yes")
    return {"files": ctx.sandbox.list_files(), "verdict": decision["verdict"]}


def swap_code(name: str, fn) -> None:
    """Deploy changed code for the workflow ``name`` in this process (tests of versioning and replay).

    The autouse registry fixture of tests/conftest.py puts the original back after the test.
    """
    import dataclasses

    from journal.engine import registry

    defn = registry.get_workflow(name)
    registry._workflows[name] = dataclasses.replace(defn, fn=fn, fingerprint=registry.code_fingerprint(fn))
