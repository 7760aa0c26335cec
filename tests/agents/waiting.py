"""Agents that wait: on signals, approvals, timers and child runs (tests of the waiting primitives).

Work that must not repeat appends a line to $DURABLE_TEST_DIR/waiting.log *before* returning,
so the tests can tell "ran twice" from "replayed".
"""

import os
from pathlib import Path

import journal
from journal.primitives.children import ChildRunError


def log_path() -> Path:
    return Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "waiting.log"


def lines() -> list[str]:
    path = log_path()
    return path.read_text().splitlines() if path.exists() else []


@journal.step()
def note(line: str) -> str:
    with open(log_path(), "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return line


@journal.workflow(name="wait-signal", signals=("go",))
def wait_signal(ctx, timeout: float | None = None) -> dict:
    try:
        payload = ctx.wait_for_signal("go", timeout=timeout)
    except journal.WaitTimeout:
        return {"timed_out": True}
    note(f"got {ctx.run_id}")
    return {"payload": payload}


@journal.workflow(name="approve-me")
def approve_me(ctx, prompt: str = "ship it?", quorum: int = 1, timeout: float | None = None,
               on_expiry: str = "reject", role: str = "operator") -> dict:
    decision = ctx.request_approval(prompt, timeout=timeout, role=role, quorum=quorum, on_expiry=on_expiry,
                                    context={"diff": "<b>+1 line</b>"})
    note(f"decided {ctx.run_id} {decision['status']}")
    return decision


@journal.workflow(name="sleeper")
def sleeper(ctx, seconds: float = 1.0) -> str:
    ctx.sleep(seconds)
    return note(f"fired {ctx.run_id}")


@journal.workflow(name="square")
def square(ctx, n: int) -> int:
    if n < 0:
        raise ValueError(f"negative: {n}")
    note(f"square {n}")
    return n * n


@journal.workflow(name="square-parent")
def square_parent(ctx, n: int) -> int:
    return ctx.child(square, n) + 1


@journal.workflow(name="square-parent-catches")
def square_parent_catches(ctx, n: int) -> dict:
    try:
        return {"value": ctx.child("square", n)}
    except ChildRunError as exc:
        return {"failed": exc.child_status, "child": exc.child_run_id, "message": str(exc)}


@journal.workflow(name="fan-out")
def fan_out(ctx, items: list, concurrency: int = 3) -> list:
    results = ctx.map_children(square, items, concurrency=concurrency)
    note(f"fan-out done {ctx.run_id}")
    return results


@journal.workflow(name="parent-of-waiter")
def parent_of_waiter(ctx) -> dict:
    return ctx.child(wait_signal)


@journal.workflow(name="child-bad-args")
def child_bad_args(ctx) -> int:
    return ctx.child(square, 1, 2)  # square takes one argument: refused before anything is written


@journal.step()
def slow(i: int, seconds: float) -> int:
    note(f"slow {i}")
    import time

    time.sleep(seconds)
    return i


@journal.workflow(name="slow-steps", signals=("go",))
def slow_steps(ctx, n: int = 10, seconds: float = 0.3, wait_first: bool = False) -> int:
    if wait_first:
        ctx.wait_for_signal("go")
    return sum(slow(i, seconds) for i in range(n))


@journal.workflow(name="slow-child")
def slow_child(ctx, i: int) -> int:
    return slow(i, 0.5) + slow(i, 0.5)


@journal.workflow(name="slow-fan-out")
def slow_fan_out(ctx, items: list, concurrency: int = 2) -> list:
    return ctx.map_children(slow_child, items, concurrency=concurrency)
