"""Persistence: a worker process SIGKILLed at any point is recovered by another, and nothing
that completed runs again."""

import random
from collections import Counter

import pytest

import journal
from journal.models import EffectStatus, RunStatus, SessionEvent, SideEffect
from tests.agents import crashy
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.crashy"


@pytest.fixture
def worker_env(worker_env):
    """The default 30 s lease, not the suite's 2 s: on a loaded machine a worker whose heartbeat came
    late lost its own run to its own next claim mid-step, and that step counted as run twice. The
    restarted worker still takes the killed one's runs at once (journal.driver.recovery)."""
    return lambda agents, **extra: worker_env(agents, **{"DURABLE_LEASE_SECONDS": "30", **extra})


def _counts(tmp_path) -> Counter:
    return Counter(crashy.executions(tmp_path))


def _finish(env, spawn_worker, run_id, timeout=90):
    """A fresh worker process; it takes the dead worker's run at its start (pid gone), lease or not."""
    worker = spawn_worker(env)
    run = journal.wait(run_id, timeout=timeout)
    assert worker.terminate() == 0, worker.log()
    return run


def test_killed_inside_step_8_resumes_without_rerunning_steps_1_to_7(tmp_path, worker_env, spawn_worker):
    run_id = journal.start("twelve")
    first = spawn_worker(worker_env(AGENTS, CRASHY_KILL_AT="8"))
    assert first.wait(timeout=60) == -9  # really SIGKILLed, inside step 8

    run = journal.get_run(run_id)
    assert run.status == RunStatus.RUNNING  # the dead worker's lease is still on it

    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"total": sum(i * i for i in range(1, 13))}
    counts = _counts(tmp_path)
    assert all(counts[f"step {i}"] == 1 for i in range(1, 8)), counts
    assert counts["step 8"] == 2  # it was in flight when the process died
    assert all(counts[f"step {i}"] == 1 for i in range(9, 13)), counts
    effects = [line for line in counts if line.startswith("effect")]
    assert len(effects) == 3 and all(counts[e] == 1 for e in effects)
    assert SessionEvent.objects.filter(run_id=run_id, kind="run_recovered").count() == 1


@pytest.mark.parametrize("attempt", range(3))
def test_killed_after_a_random_commit_repeats_nothing(attempt, tmp_path, worker_env, spawn_worker):
    """Killed right after the commit of a random position: every completed step stays done."""
    run_id = journal.start("twelve")
    position = random.randint(1, 14)
    fault = f"after_commit:position={position};kind=step_completed"
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS=fault))
    assert first.wait(timeout=60) == -9
    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    counts = _counts(tmp_path)
    assert set(counts.values()) == {1}, f"killed after position {position}: {counts}"
    assert len([c for c in counts if c.startswith("step")]) == 12


@pytest.mark.parametrize("attempt", range(2))
def test_killed_at_a_random_moment_by_an_outside_sigkill(attempt, tmp_path, worker_env, spawn_worker):
    run_id = journal.start("twelve")
    env = worker_env(AGENTS, CRASHY_STEP_SLEEP="0.05")
    first = spawn_worker(env)
    done_before = random.randint(2, 10)
    wait_for(lambda: len(crashy.executions(tmp_path)) >= done_before, timeout=60, message="steps to run")
    first.kill()
    run = _finish(env, spawn_worker, run_id)
    counts = _counts(tmp_path)
    assert all(n == 1 for line, n in counts.items() if line.startswith("effect")), counts  # never twice
    if run.status == RunStatus.NEEDS_ATTENTION:
        # The kill landed inside an effect, between its intent and its result: the engine says so.
        assert SideEffect.objects.filter(run_id=run_id, status=EffectStatus.STARTED).count() == 1
        return
    assert run.status == RunStatus.COMPLETED, run.error
    twice = [line for line, n in counts.items() if n > 1]
    assert len(twice) <= 1 and all(line.startswith("step") for line in twice), counts  # only the one in flight
    assert all(n <= 2 for n in counts.values())
    assert SideEffect.objects.filter(run_id=run_id, status=EffectStatus.COMPLETED).count() == 3


def test_effect_interrupted_mid_flight_needs_attention_and_is_not_guessed(tmp_path, worker_env, spawn_worker):
    # notify() runs at position 5 (after work 1..4); die after it executed, before its result committed.
    run_id = journal.start("twelve")
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS="effect_executed:position=5"))
    assert first.wait(timeout=60) == -9
    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "outcome was never recorded" in run.attention_reason
    effect = SideEffect.objects.get(run_id=run_id, position=5)
    assert effect.status == EffectStatus.STARTED
    counts = _counts(tmp_path)
    assert counts[f"effect {run_id}:5"] == 1  # never re-executed on a guess
    assert SessionEvent.objects.filter(run_id=run_id, kind="effect_in_doubt").exists()


def test_effect_with_retry_policy_is_retried_under_the_same_key(tmp_path, worker_env, spawn_worker):
    run_id = journal.start("retry_effect")
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS="effect_executed:position=2"))
    assert first.wait(timeout=60) == -9
    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert _counts(tmp_path)[f"effect-retry {run_id}:2"] == 2  # same key both times: the outside system dedups
    assert SideEffect.objects.get(run_id=run_id).attempts == 2


def test_the_trace_has_no_hole_where_the_crash_was(tmp_path, worker_env, spawn_worker):
    from journal.models import TraceSpan

    run_id = journal.start("twelve", 12, 0)
    first = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS="after_commit:position=10;kind=step_completed"))
    assert first.wait(timeout=60) == -9
    assert TraceSpan.objects.filter(run_id=run_id).count() < 10  # the dead worker's spans were still buffered
    run = _finish(worker_env(AGENTS), spawn_worker, run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    positions = sorted(TraceSpan.objects.filter(run_id=run_id, position__isnull=False)
                       .values_list("position", flat=True))
    assert positions == list(range(1, 13))
    assert TraceSpan.objects.filter(run_id=run_id, attributes__rebuilt_from_journal=True).count() == 10
