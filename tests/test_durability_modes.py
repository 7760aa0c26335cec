"""Durability modes: async and exit may lose recent plain steps in a crash, never an effect, and
everything before an effect is durable before the effect runs."""

import random

import pytest

import journal
from journal.models import EffectStatus, EventKind, RunStatus, SessionEvent, SideEffect
from journal.store.writer import JournalWriter
from tests.agents import crashy
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.crashy"
EFFECT_POSITIONS = {5, 10, 15}  # twelve(12, 4): work 1-4, notify, work 5-8, notify, ...


def _recorded(run_id) -> list[int]:
    return sorted(SessionEvent.objects.steps().filter(run_id=run_id).values_list("position", flat=True))


@pytest.mark.parametrize("agent", ["twelve_async", "twelve_exit"])
def test_everything_before_an_effect_is_durable_before_it_runs(agent, tmp_path, worker_env, spawn_worker):
    run_id = journal.start(agent)
    worker = spawn_worker(worker_env(AGENTS, DURABLE_FAULTS="effect_started:position=10"))
    assert worker.wait(timeout=60) == -9
    assert _recorded(run_id) == list(range(1, 10))  # the barrier flushed steps 1-9 with the intent
    assert SideEffect.objects.get(run_id=run_id, position=5).status == EffectStatus.COMPLETED
    assert SideEffect.objects.get(run_id=run_id, position=10).status == EffectStatus.STARTED


@pytest.mark.parametrize("agent", ["twelve_async", "twelve_exit"])
def test_a_crash_loses_at_most_plain_steps_after_the_last_flush_and_never_an_effect(agent, tmp_path, worker_env,
                                                                                     spawn_worker):
    run_id = journal.start(agent)
    env = worker_env(AGENTS, CRASHY_STEP_SLEEP="0.04")
    worker = spawn_worker(env)
    executed_before_kill = random.randint(3, 11)
    wait_for(lambda: len([x for x in crashy.executions(tmp_path) if x.startswith("step")]) >= executed_before_kill,
             timeout=60, message="steps")
    worker.kill()
    recorded = _recorded(run_id)
    assert recorded == list(range(1, len(recorded) + 1)), "a hole in the journal"
    executed_effects = [x for x in crashy.executions(tmp_path) if x.startswith("effect")]
    ledger = SideEffect.objects.filter(run_id=run_id)
    assert len(executed_effects) <= ledger.count()  # an effect that ran always has its intent on record
    if agent == "twelve_exit":
        # exit mode writes only at barriers (effects), so the journal ends at an effect or is empty
        assert not recorded or recorded[-1] in EFFECT_POSITIONS or recorded[-1] + 1 in EFFECT_POSITIONS
    completed = set(ledger.filter(status=EffectStatus.COMPLETED).values_list("position", flat=True))
    assert completed <= set(recorded)


def test_async_mode_writes_steps_in_batches_on_a_background_thread():
    from journal.driver.executor import Claim  # noqa: F401  (the writer is independent of the executor)

    run_id = journal.start("twelve_async")
    from journal.driver import leases

    [claim] = leases.claim("bench-worker", 1)
    writer = JournalWriter(claim.run_id, claim.epoch, next_seq=2, mode="async")
    for i in range(200):
        writer.record(EventKind.STEP_COMPLETED, {"result": i}, position=i + 1, step_name="s")
    writer.barrier()
    writer.close()
    assert SessionEvent.objects.steps().filter(run_id=run_id).count() == 200
    assert writer.writes < 200  # batched: fewer commits than entries


def test_a_cheap_step_can_opt_out_of_sync_writes_inside_a_sync_workflow(tmp_path, worker_env, spawn_worker):
    run_id = journal.start("mixed")
    worker = spawn_worker(worker_env(AGENTS, CRASHY_KILL_AT="3"))  # dies inside work(3)
    assert worker.wait(timeout=60) == -9
    assert _recorded(run_id) == []  # cheap(1), cheap(2) were buffered, not committed on their own
    spawn_worker(worker_env(AGENTS))
    run = journal.wait(run_id, timeout=60)
    assert run.status == RunStatus.COMPLETED and run.output == 1 + 2 + 9 + 16
    assert _recorded(run_id) == [1, 2, 3, 4]
