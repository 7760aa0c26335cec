"""Crash recovery: a run of 20 steps of 50 ms is SIGKILLed about half-way; a new process starts at
once. Measured: seconds from that start to the run's completion as the new process sees it, and
the duplicate effects (executions beyond the first of a step, counted in an outside log file that
each step appends to when it really runs).

Both processes are ``python -m bench.peers.workloads SYSTEM STORE crash-first|crash-resume``; each
system module's ``crash()`` says what its second process does (durable-ui: a new worker; LangGraph:
the caller invokes the thread again; DBOS: a relaunch, which recovers pending workflows).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from .databases import Store
from .workloads import CRASH_STEP_SECONDS, CRASH_STEPS, ROOT, effect_log


def _child(system: str, store: Store, job: str, log: Path, stderr, effects: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.peers.workloads", system, json.dumps(asdict(store)), job,
                             "--log", str(log), *(["--effects"] if effects else [])], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=stderr, text=True)


def _lines(log: Path) -> list[tuple[int, float]]:
    """(step, when its execution ended) per real execution, in order."""
    return [(step, at) for step, at, _ in effect_log(log)]


def _executions(log: Path) -> list[int]:
    return [step for step, _ in _lines(log)]


def crash_round(system: str, store: Store, workdir: Path, timeout: float = 120, *, effects: bool = False) -> dict:
    """One crash and resume; ``effects``: durable-ui's steps are effects, reconciled against the log."""
    log = workdir / f"crash-{system}-{store.kind}{'-effects' if effects else ''}.log"
    log.unlink(missing_ok=True)
    with (workdir / f"crash-{system}-{store.kind}.err").open("a") as err:
        first = _child(system, store, "crash-first", log, err, effects)
        deadline = time.monotonic() + timeout
        while len(_executions(log)) < CRASH_STEPS // 2:
            if first.poll() is not None or time.monotonic() > deadline:
                first.kill()
                first.wait()
                first.stdout.close()
                raise RuntimeError(f"{system} on {store.kind}: the first process ended or stalled before half-way "
                                   f"(see {err.name})")
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
        first.wait()
        first.stdout.close()
        done_before = len(set(_executions(log)))
        lines_before = len(_lines(log))
        t0, wall0 = time.perf_counter(), time.time()
        second = _child(system, store, "crash-resume", log, err, effects)
        with second.stdout:
            line = second.stdout.readline()  # {"done": true} once the run has completed
            seconds = time.perf_counter() - t0
            second.wait(timeout=timeout)
    if '"done"' not in line:
        raise RuntimeError(f"{system} on {store.kind}: the restarted process did not finish the run (see {err.name})")
    counts = Counter(_executions(log))
    assert sorted(counts) == list(range(CRASH_STEPS)), counts
    # Resumed: the new process's first step began (each logs when it ends, CRASH_STEP_SECONDS after it began).
    resumed = _lines(log)[lines_before][1] - CRASH_STEP_SECONDS - wall0
    return {"seconds": seconds, "resumed": resumed, "duplicates": sum(c - 1 for c in counts.values()),
            "done_before_kill": done_before}
