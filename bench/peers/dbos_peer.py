"""DBOS Transact: ``@DBOS.workflow`` calling ``@DBOS.step`` functions, its system database on
SQLite or PostgreSQL (every step's output is recorded there before the workflow goes on).

A run is one workflow call, made directly in the calling thread (DBOS runs a called workflow
inline); the throughput workload calls it from as many threads as the concurrency. Crash
recovery is DBOS's own: a relaunched process recovers the pending workflows of its executor.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dbos import DBOS, SetWorkflowID

from .databases import Store
from .workloads import CRASH_STEP_SECONDS, CRASH_STEPS, message, record_effect, threaded


@DBOS.step()
def tiny(i: int) -> int:
    return i + 1


@DBOS.step()
def reply(i: int) -> str:
    return message(i)


@DBOS.step()
def work(i: int) -> int:
    time.sleep(CRASH_STEP_SECONDS)
    record_effect(Path(os.environ["PEERS_CRASH_LOG"]), i)
    return i


@DBOS.workflow()
def steps_workflow(n: int) -> int:
    return sum(tiny(i) for i in range(n))


@DBOS.workflow()
def conversation_workflow(n: int, base: int) -> int:
    messages: list[str] = []
    for i in range(n):
        messages.append(reply(base + i))
    return len(messages)


@DBOS.workflow()
def crash_workflow(n: int) -> int:
    return sum(work(i) for i in range(n))


def _launch(store: Store) -> None:
    DBOS(config={"name": "peers", "system_database_url": store.url, "run_admin_server": False})
    DBOS.launch()


class Dbos:
    name = "DBOS"
    modes = ("sync",)

    def __init__(self, store: Store) -> None:
        _launch(store)

    def one_run(self, steps: int, mode: str = "sync") -> None:
        assert steps_workflow(steps) == sum(range(1, steps + 1))

    def many_runs(self, runs: int, steps: int, concurrency: int) -> None:
        threaded(lambda _: self.one_run(steps), runs, concurrency)

    def conversation(self, messages: int, base: int = 0) -> None:
        assert conversation_workflow(messages, base) == messages

    def close(self) -> None:
        DBOS.destroy()


def open_system(store: Store) -> Dbos:
    return Dbos(store)


def crash(store: Store, log: Path, *, resume: bool) -> None:
    """First process: run the workflow under a known id (until killed). Second: launch again, which
    recovers the pending workflow, and wait for its result."""
    os.environ["PEERS_CRASH_LOG"] = str(log)
    _launch(store)
    if resume:
        DBOS.retrieve_workflow("crash").get_result()
    else:
        with SetWorkflowID("crash"):
            crash_workflow(CRASH_STEPS)
    DBOS.destroy()
