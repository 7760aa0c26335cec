"""SIGKILL torture: several worker processes driving runs with effects, one of them killed every
1–2 s and restarted, until every run has stopped. Nothing an effect did may happen twice; every run
ends completed, or needs_attention where an effect was genuinely in doubt; no session has a gap.

The short variant runs in `make test`; DURABLE_SLOW=1 adds the long one (more runs, longer)."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

import journal
from journal.models import EffectStatus, Run, RunStatus, SideEffect
from tests.agents import crashy
from tests.checks import assert_no_seq_gaps

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.crashy"


def torture(worker_env, spawn_worker, tmp_path, *, runs: int, workers: int, seconds: float) -> dict:
    ids = [journal.start("twelve", 12, 3) for _ in range(runs)]
    env = worker_env(AGENTS, CRASHY_STEP_SLEEP="0.2", DURABLE_LEASE_SECONDS="2")
    procs = [spawn_worker(env, "--concurrency", "2") for _ in range(workers)]
    kills = 0
    deadline = time.monotonic() + seconds
    rng = random.Random(7)
    while time.monotonic() < deadline:
        live = Run.objects.filter(id__in=ids).exclude(status__in=[RunStatus.COMPLETED, RunStatus.NEEDS_ATTENTION])
        if not live.exists():
            break
        time.sleep(rng.uniform(1.0, 2.0))
        victim = rng.randrange(len(procs))
        procs[victim].kill()
        kills += 1
        procs[victim] = spawn_worker(env, "--concurrency", "2")
    for run_id in ids:  # the killing is over: let the survivors finish what is left
        journal.wait(run_id, timeout=60)
    final = {str(r.id): r.status for r in Run.objects.filter(id__in=ids)}
    for p in procs:
        assert p.terminate() == 0, p.log()[-2000:]
    return {"ids": ids, "kills": kills, "final": final}


def check(result: dict, tmp_path) -> None:
    statuses = Counter(result["final"].values())
    assert set(statuses) <= {RunStatus.COMPLETED, RunStatus.NEEDS_ATTENTION}, statuses
    # Exactly once: an effect's key executed at most once (its log line is written before it runs).
    effects = Counter(line for line in crashy.executions(tmp_path) if line.startswith("effect "))
    assert all(n == 1 for n in effects.values()), [k for k, n in effects.items() if n > 1]
    # Every needs_attention run waits on an effect that really started without a recorded outcome.
    for run_id, status in result["final"].items():
        if status == RunStatus.NEEDS_ATTENTION:
            assert SideEffect.objects.filter(run_id=run_id, status=EffectStatus.STARTED).exists(), run_id
    completed = [r for r, s in result["final"].items() if s == RunStatus.COMPLETED]
    for run_id in completed:
        assert journal.get_run(run_id).output == {"total": sum(i * i for i in range(1, 13))}
        assert SideEffect.objects.filter(run_id=run_id, status=EffectStatus.COMPLETED).count() == 4
    assert_no_seq_gaps(result["ids"])
    print(f"torture: {len(result['ids'])} runs, {result['kills']} SIGKILLs, {dict(statuses)}, "
          f"{len(effects)} effects each executed once")


def test_sigkill_every_one_to_two_seconds_across_three_workers(worker_env, spawn_worker, tmp_path):
    result = torture(worker_env, spawn_worker, tmp_path, runs=18, workers=3, seconds=60)
    assert result["kills"] >= 3, "the workers were never killed: the test proved nothing"
    check(result, tmp_path)


@pytest.mark.slow
def test_sigkill_torture_long(worker_env, spawn_worker, tmp_path):
    result = torture(worker_env, spawn_worker, tmp_path, runs=80, workers=3, seconds=600)
    assert result["kills"] >= 20
    check(result, tmp_path)
