"""SIGKILL a real worker in the middle of a code-repair run; the next worker restores the sandbox.

After every recovery the run must see, at every later step, exactly the files an uninterrupted
run saw (each command's output starts with a digest of the whole tree), end with the same
result and leave a byte-identical directory. The naive "journal only" resume is shown to fail
on the same crash, so these tests can fail.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest

import journal
import tests.agents.coderepair  # noqa: F401 - registers the agent in this process too
from journal.engine.restore import scan_manifest
from journal.models import Checkpoint, Run
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

AGENT = "tests.agents.coderepair"


@pytest.fixture
def roots():
    made = []

    def make() -> str:
        base = tempfile.mkdtemp(prefix="durable-sbx-crash-")
        os.chmod(base, 0o711)
        made.append(base)
        return base

    yield make
    for base in made:
        shutil.rmtree(base, ignore_errors=True)


def _finish(run_id: str, spawn_worker, env: dict) -> Run:
    worker = spawn_worker(env, "--until-idle")
    wait_for(lambda: Run.objects.get(id=run_id).is_terminal, timeout=120, message="the run to finish")
    worker.wait(timeout=60)
    return Run.objects.get(id=run_id)


def _tree(base: str, run_id: str) -> dict:
    return scan_manifest(Path(base) / run_id)


_REFERENCE: list[tuple[dict, dict]] = []  # plain data, so it outlives the per-test database flush


@pytest.fixture
def reference(worker_env, spawn_worker, roots):
    """An uninterrupted run: its output and final directory (made once per session)."""
    if _REFERENCE:
        return _REFERENCE[0]
    base = roots()
    run_id = journal.start_run("coderepair", checkpoint="selective")
    run = _finish(run_id, spawn_worker, worker_env(AGENT, DURABLE_SANDBOX_ROOT=base))
    assert run.status == "completed", run.error
    assert run.output["green"] and run.output["attempts"] == 4
    _REFERENCE.append((run.output, _tree(base, run_id)))
    return _REFERENCE[0]


def _crash_then_recover(worker_env, spawn_worker, roots, *, policy: str, fault: str | None = None,
                        kill_after: float | None = None, fresh_disk: bool = False, restore: bool = True,
                        slow: str = "0") -> tuple[Run, dict]:
    base = roots()
    run_id = journal.start_run("coderepair", checkpoint=policy)
    env = worker_env(AGENT, DURABLE_SANDBOX_ROOT=base, CODEREPAIR_SLOW=slow,
                     DURABLE_SANDBOX_RESTORE="1" if restore else "0")
    if fault:
        victim = spawn_worker({**env, "DURABLE_FAULTS": fault})
        victim.wait(timeout=120)
        assert victim.proc.returncode == -9, "the fault point was never reached"
    else:
        victim = spawn_worker(env)
        wait_for(lambda: Run.objects.get(id=run_id).status == "running", timeout=60, message="the run to start")
        time.sleep(kill_after or 0)
        victim.kill()
    assert not Run.objects.get(id=run_id).is_terminal
    # The dead worker's lease must expire before a worker that exits when idle can take over.
    wait_for(lambda: Run.objects.runnable().filter(id=run_id).exists(), timeout=30, message="the lease to expire")
    if fresh_disk:  # the replacement worker runs on another machine: nothing of the old disk is there
        new_base = roots()
        env = {**env, "DURABLE_SANDBOX_ROOT": new_base}
        base = new_base
    run = _finish(run_id, spawn_worker, env)
    return run, _tree(base, run_id)


@pytest.mark.parametrize(("policy", "fault", "fresh_disk"), [
    ("selective", "before_commit:position=9", False),   # the test run appended to the logs, then died
    ("selective", "after_commit:position=13", True),    # after an edit, on another machine
    ("selective", "before_commit:position=15", True),   # a read-only command, another machine
    ("every", "before_commit:position=14", False),
    ("every", "after_commit:position=8", True),
])
def test_recovery_sees_the_same_files_as_an_uninterrupted_run(reference, worker_env, spawn_worker, roots,
                                                              policy, fault, fresh_disk):
    expected_output, expected_tree = reference
    run, tree = _crash_then_recover(worker_env, spawn_worker, roots, policy=policy, fault=fault,
                                    fresh_disk=fresh_disk)
    assert run.status == "completed", run.error
    assert run.attempts >= 2
    assert run.output == expected_output
    assert tree == expected_tree
    if policy == "selective":
        assert Checkpoint.objects.filter(run_id=run.id).count() < run.steps


def test_a_kill_at_a_random_moment_recovers_too(reference, worker_env, spawn_worker, roots):
    expected_output, expected_tree = reference
    run, tree = _crash_then_recover(worker_env, spawn_worker, roots, policy="selective",
                                    kill_after=random.uniform(0.2, 1.5), slow="0.6")  # the run takes > 2.4 s
    assert run.status == "completed", run.error
    assert run.output == expected_output
    assert tree == expected_tree


def test_journal_only_resume_without_restore_diverges(reference, worker_env, spawn_worker, roots):
    """The baseline: replay without restoring the sandbox re-runs the interrupted command on top of
    its own half-done work (the logs get a second append), so the run sees other files."""
    expected_output, expected_tree = reference
    run, tree = _crash_then_recover(worker_env, spawn_worker, roots, policy="selective",
                                    fault="before_commit:position=9", restore=False)
    assert run.status == "completed", run.error
    assert run.output != expected_output or tree != expected_tree


def test_a_killed_worker_takes_its_running_command_with_it(worker_env, spawn_worker, roots):
    """No orphan keeps writing into the sandbox while another worker restores it."""
    from journal.engine.sandbox_exec import sandbox_uid

    base = roots()
    run_id = journal.start("sandbox_hang")
    worker = spawn_worker(worker_env(AGENT, DURABLE_SANDBOX_ROOT=base))
    tick = Path(base) / run_id / "tick.txt"
    wait_for(lambda: tick.exists() and tick.stat().st_size > 0, timeout=60, message="the command to start")
    worker.kill()
    time.sleep(0.5)
    size = tick.stat().st_size
    time.sleep(1.0)
    assert tick.stat().st_size == size, "the command outlived its worker"
    uid = sandbox_uid(run_id)
    if uid is not None:
        import psutil

        alive = [p for p in psutil.process_iter(["uids", "status"])
                 if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]
        assert not alive
