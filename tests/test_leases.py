"""Leases and fencing: racing workers never run a step twice; a zombie cannot write after a takeover."""

import os
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

import journal
from journal.driver import leases
from journal.models import EventKind, Run, RunStatus, SessionEvent, Worker
from journal.store.errors import LeaseLost
from journal.store.writer import JournalWriter
from tests.agents import crashy
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENTS = "tests.agents.crashy"


def test_two_worker_processes_racing_for_the_same_runs_never_execute_a_step_twice(tmp_path, worker_env,
                                                                                   spawn_worker):
    env = worker_env(AGENTS, CRASHY_STEP_SLEEP="0.05")
    workers = [spawn_worker(env, "--concurrency", "4") for _ in range(2)]
    # Both must be polling before the runs exist, or the first to boot can finish them all alone.
    for w in workers:
        wait_for(lambda w=w: Worker.objects.filter(pid=w.proc.pid).exists(), timeout=60, message="worker registered")
    run_ids = [journal.start("twelve", 6, 3) for _ in range(16)]
    for run_id in run_ids:
        run = journal.wait(run_id, timeout=120)
        assert run.status == RunStatus.COMPLETED, run.error
    for w in workers:
        assert w.terminate() == 0
    executed = Counter(crashy.executions_by_run(tmp_path))
    assert len(executed) == 16 * 6
    assert set(executed.values()) == {1}, [k for k, v in executed.items() if v > 1]
    claimed_by = set(SessionEvent.objects.filter(kind=EventKind.RUN_CLAIMED).values_list("actor", flat=True))
    assert len(claimed_by) == 2  # both really competed


def test_a_claim_bumps_the_epoch_and_a_stale_writer_is_fenced_off():
    run_id = journal.start("twelve")
    [first] = leases.claim("worker-a", 1, ttl=30)
    stale = JournalWriter(first.run_id, first.epoch, next_seq=2)
    stale.record(EventKind.LOG, {"message": "a is alive"})
    # Worker A stalls past its lease; B takes over.
    Run.objects.filter(id=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    [second] = leases.claim("worker-b", 1, ttl=30)
    assert second.epoch == first.epoch + 1 and second.recovered_from == "worker-a"
    with pytest.raises(LeaseLost):
        stale.record(EventKind.LOG, {"message": "zombie write"}, position=1, step_name="x")
    with pytest.raises(LeaseLost):  # and it stays fenced
        stale.record(EventKind.LOG, {"message": "again"})
    assert not SessionEvent.objects.filter(run_id=run_id, payload__message__in=["zombie write", "again"]).exists()


def _lapse(run_id, seconds_ago: float) -> None:
    Run.objects.filter(id=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=seconds_ago))


@pytest.mark.parametrize("single", [True, False], ids=["one-run-claim", "batch-claim"])
def test_a_late_heartbeat_does_not_let_a_worker_claim_the_run_it_is_driving(single):
    """Under load a heartbeat can come after the lease ran out; the worker's own claim loop must not
    take the run from its own driving thread (that fences the thread out and runs its step again)."""
    run_id = journal.start("twelve")
    [first] = leases.claim("worker-a", 1, ttl=30)
    _lapse(run_id, 1)
    limit = 1 if single else 4
    assert leases.claim("worker-a", limit, ttl=30) == []
    assert leases.claim("worker-a", 1, run_id=run_id, ttl=30) == []
    [taken] = leases.claim("worker-b", limit, ttl=30)  # any other worker takes a lapsed lease at once
    assert (str(taken.run_id), taken.epoch, taken.recovered_from) == (run_id, first.epoch + 1, "worker-a")


def test_a_run_its_worker_dropped_is_its_own_to_claim_a_lease_later():
    """Alone, a worker must still recover a run whose driving thread it lost (no other worker will)."""
    run_id = journal.start("twelve")
    leases.claim("worker-a", 1, ttl=30)
    _lapse(run_id, 29)
    assert leases.claim("worker-a", 1, ttl=30) == []
    _lapse(run_id, 31)
    [again] = leases.claim("worker-a", 1, ttl=30)
    assert str(again.run_id) == run_id and again.recovered_from == "worker-a"


def test_a_run_given_back_in_an_outage_is_claimable_by_its_own_worker_at_once():
    run_id = journal.start("twelve")
    [first] = leases.claim("worker-a", 1, ttl=30)
    assert leases.give_back("worker-a", {run_id: first.epoch}, ttl=30) == 1
    [again] = leases.claim("worker-a", 1, ttl=30)
    assert str(again.run_id) == run_id and again.epoch == first.epoch + 1


@pytest.mark.parametrize("limit", [1, 4], ids=["one-run-claim", "batch-claim"])
def test_the_running_children_of_a_full_fan_out_group_are_recovered_when_their_worker_dies(limit):
    """A group at its limit counted its own running children against them: once their worker died
    no claim took them back (the group was full of them), and the fan-out never finished."""
    group = {"concurrency_key": "fan-out-g", "concurrency_limit": 2}
    running = [journal.start_run("twelve", (), {}, **group) for _ in range(2)]
    waiting = journal.start_run("twelve", (), {}, **group)
    assert {str(c.run_id) for c in leases.claim("worker-dead", 4, ttl=30)} == set(running)  # the third waits
    for run_id in running:
        _lapse(run_id, 1)
    taken = [c for _ in range(2) for c in leases.claim("worker-new", limit, ttl=30)]
    assert {str(c.run_id) for c in taken} == set(running)
    assert {c.recovered_from for c in taken} == {"worker-dead"}
    assert Run.objects.get(id=waiting).status == RunStatus.PENDING  # the group is still full


def test_a_paused_zombie_worker_process_cannot_append_after_another_took_over(tmp_path, worker_env, spawn_worker):
    run_id = journal.start("twelve", 12, 0)
    env = worker_env(AGENTS, CRASHY_STEP_SLEEP="0.25")
    zombie = spawn_worker(env)
    wait_for(lambda: len(crashy.executions(tmp_path)) >= 3, timeout=60, message="the first steps")
    os.kill(zombie.proc.pid, signal.SIGSTOP)  # a GC pause, a frozen VM: the lease runs out
    try:
        time.sleep(3)  # > DURABLE_LEASE_SECONDS=2
        rescuer = spawn_worker(worker_env(AGENTS))
        run = journal.wait(run_id, timeout=90)
        assert run.status == RunStatus.COMPLETED, run.error
    finally:
        os.kill(zombie.proc.pid, signal.SIGCONT)
    time.sleep(1.5)  # the zombie wakes, finishes its step, tries to write, and is refused
    rescuer.terminate()
    zombie.terminate()
    positions = Counter(SessionEvent.objects.steps().filter(run_id=run_id).values_list("position", flat=True))
    assert sorted(positions) == list(range(1, 13)) and set(positions.values()) == {1}
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.RUN_RECOVERED).count() == 1
    last = SessionEvent.objects.filter(run_id=run_id).order_by("-seq").first()
    assert last.kind == EventKind.RUN_COMPLETED


def test_sigterm_gives_the_run_back_at_a_step_boundary_and_another_worker_finishes_it(tmp_path, worker_env,
                                                                                        spawn_worker):
    run_id = journal.start("twelve", 12, 0)
    env = worker_env(AGENTS, CRASHY_STEP_SLEEP="0.2")
    first = spawn_worker(env)
    wait_for(lambda: len(crashy.executions(tmp_path)) >= 3, timeout=60, message="the first steps")
    assert first.terminate(timeout=30) == 0
    run = journal.get_run(run_id)
    assert run.status == RunStatus.PENDING and run.lease_owner == ""  # released, not left to expire
    assert Worker.objects.get(pid=first.proc.pid).stopped_at is not None
    spawn_worker(env)
    assert journal.wait(run_id, timeout=60).status == RunStatus.COMPLETED
    assert set(Counter(crashy.executions(tmp_path)).values()) == {1}
