"""The agent bench/restart_recovery.py crashes: 20 steps of 50 ms, each logged when it really runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import journal

STEP_SECONDS = 0.05


@journal.step()
def work(i: int) -> int:
    time.sleep(STEP_SECONDS)
    with Path(os.environ["BENCH_RESTART_LOG"]).open("a") as log:
        log.write(f"{i} {time.time():.4f}\n")  # when it really ran (the time it ended)
    return i


@journal.workflow(name="bench-restart")
def twenty(ctx, n: int = 20) -> int:
    return sum(work(i) for i in range(n))
