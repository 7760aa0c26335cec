"""Agents whose steps produce what a database cannot store as is (tests/test_hostile_data.py).

Each step execution appends a line to $DURABLE_TEST_DIR/hostile.log *before* it raises or
returns, so a test can tell "ran once" from "ran again after a reclaim".
"""

import os
from pathlib import Path

import journal
from journal.engine.protocol import record_value


def log_path() -> Path:
    return Path(os.environ.get("DURABLE_TEST_DIR", "/tmp")) / "hostile.log"


def executions() -> list[str]:
    path = log_path()
    return path.read_text().splitlines() if path.exists() else []


def _log(line: str) -> None:
    with open(log_path(), "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def deep(levels: int):
    value: object = "bottom"
    for _ in range(levels):
        value = [value]
    return value


class HostileMessageError(Exception):
    pass


@journal.step()
def raise_text(kind: str) -> None:
    _log(f"raise {kind}")
    text = {"surrogate": "bad byte \ud800 here", "nul": "nul \x00 here"}[kind]
    raise HostileMessageError(text)


@journal.step()
def produce(kind: str):
    _log(f"produce {kind}")
    return {"deep": lambda: deep(10_000), "nested65": lambda: deep(65), "surrogate": lambda: {"k": "x\ud800"},
            "nul": lambda: ["a\x00b"], "nan": lambda: float("nan")}[kind]()


@journal.step()
def echo(value):
    _log("echo")
    return value


@journal.workflow(name="hostile-raise")
def hostile_raise(ctx, kind: str) -> None:
    raise_text(kind)


@journal.workflow(name="hostile-result")
def hostile_result(ctx, kind: str):
    return produce(kind)


@journal.workflow(name="hostile-echo")
def hostile_echo(ctx, value=None):
    return {"echo": echo(value), "signal": ctx.wait_for_signal("go")}


@journal.workflow(name="hostile-produced", signals=("go",))
def hostile_produced(ctx) -> dict:
    """A recorded value (a file's text, a listing) holding NUL and a lone surrogate, then a wait:
    the resumed run replays the value and must see exactly what the first execution saw."""
    value = record_value(ctx, "test.produced", lambda: {"text": "nul\x00 lone\udcff", "name\udcff": 1})
    ctx.wait_for_signal("go")
    return {"value": value}
