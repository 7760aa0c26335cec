"""A saga: bookings (effects) with refunds (compensations), for tests of journal.driver.saga.

The "outside system" is a directory, $DURABLE_TEST_DIR: every call appends to a log *before*
returning, so tests can count real executions across SIGKILLed workers. The refund desk, like a
real payment provider, applies a repeated idempotency key only once (undone.log holds what it
applied, calls.log every call it received).
"""

import os
from pathlib import Path

import journal


def test_dir() -> Path:
    return Path(os.environ.get("DURABLE_TEST_DIR", "/tmp"))


def append(name: str, line: str) -> None:
    with open(test_dir() / name, "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def lines(name: str) -> list[str]:
    path = test_dir() / name
    return path.read_text().splitlines() if path.exists() else []


def refund(result, item, fail=False, *, idempotency_key):
    """Compensation contract: (original result, *original args, **original kwargs, idempotency_key=)."""
    append("calls.log", f"{item} {idempotency_key}")
    if not any(line.endswith(" " + idempotency_key) for line in lines("undone.log")):
        append("undone.log", f"{item} {idempotency_key}")
    return {"refunded": result["booked"]}


@journal.step(effect=True, compensate=refund)
def book(item, fail=False, *, idempotency_key):
    append("booked.log", item)
    if fail:
        raise RuntimeError(f"no seats left for {item}")
    return {"booked": item}


@journal.workflow(name="saga-trip")
def trip(ctx, items: list, fail_at: int = 0) -> dict:
    """Book each item in turn; the booking number ``fail_at`` (1-based) fails."""
    booked = []
    for i, item in enumerate(items, 1):
        booked.append(book(item, fail=(i == fail_at))["booked"])
    return {"booked": booked}


@journal.workflow(name="saga-cancellable", signals=("go",), compensate_on_cancel=True)
def cancellable(ctx, items: list) -> dict:
    """Book, then wait for a go-ahead; a cancel while waiting refunds the bookings."""
    for item in items:
        book(item)
    ctx.wait_for_signal("go")
    return {"booked": items}


@journal.workflow(name="saga-no-undo", signals=("go",))
def no_undo(ctx, items: list) -> dict:
    for item in items:
        book(item)
    ctx.wait_for_signal("go")
    return {"booked": items}


@journal.step()
def wait_a_bit(i: int) -> int:
    import time

    time.sleep(0.05)
    return i


@journal.workflow(name="saga-long", compensate_on_cancel=True)
def long_trip(ctx, items: list, ticks: int = 200) -> dict:
    """Book, then work for a while: a cancel while it runs stops it at a step boundary and refunds."""
    for item in items:
        book(item)
    for i in range(ticks):
        wait_a_bit(i)
    return {"booked": items}
