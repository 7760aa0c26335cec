"""journal.replay_check and manage.py replay: the current code against recorded journals."""

import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

import journal
from journal.models import EventKind, RunStatus, SessionEvent
from tests.agents import timetravel as agents
from tests.agents.timetravel import add, send, swap_code, verdict
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def test_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DURABLE_TEST_DIR", str(tmp_path))
    return tmp_path


# Changed versions of tt-pipeline (steps: add x n, verdict, send).
def reordered(ctx, n):
    """Non-deterministic change: the verdict is asked before the third addition."""
    total = 0
    for i in range(1, n + 1):
        if i == 3:
            verdict(total)
        total = add(total, i)
    v = verdict(total)
    return {"total": total, "verdict": v["verdict"], "sent": send(f"{v['verdict']}:{total}")["sent"]}


def other_arguments(ctx, n):
    total = 0
    for i in range(1, n + 1):
        total = add(total, i * (2 if i == 2 else 1))
    v = verdict(total)
    return {"total": total, "verdict": v["verdict"], "sent": send(f"{v['verdict']}:{total}")["sent"]}


def compatible(ctx, n):
    """Same calls with the same arguments, written differently (and a comment): replays."""
    total = 0
    for i in range(n):
        total = add(total, i + 1)  # 1-based
        ctx.set_state({"total": total, "i": i + 1})
    decision = verdict(total)["verdict"]
    sent = send(decision + ":" + str(total))
    return {"sent": sent["sent"], "total": total, "verdict": decision}


def other_output(ctx, n):
    total = 0
    for i in range(1, n + 1):
        total = add(total, i)
    v = verdict(total)
    send(f"{v['verdict']}:{total}")
    return {"total": total}


def ends_early(ctx, n):
    total = 0
    for i in range(1, n + 1):
        total = add(total, i)
    return {"total": total}


def crashes(ctx, n):
    add(0, 1)
    raise KeyError("renamed field")


@pytest.fixture
def finished(drive):
    run_id = journal.start("tt-pipeline", 4)  # add x4 (1-4), verdict (5), send (6)
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    return run_id


def test_unchanged_code_replays(finished):
    check = journal.replay_check(finished)
    assert check.ok and check.divergence is None
    assert check.checked == 6 and check.outcome == "returned"


def test_a_reordered_call_is_caught_at_its_position(finished):
    swap_code("tt-pipeline", reordered)
    check = journal.replay_check(finished)
    assert not check.ok
    assert check.divergence.position == 3
    assert check.divergence.expected.endswith(".add") and check.divergence.got.endswith(".verdict")
    assert check.checked == 2


def test_changed_arguments_are_caught(finished):
    swap_code("tt-pipeline", other_arguments)
    check = journal.replay_check(finished)
    assert (check.ok, check.divergence.position) == (False, 2)
    assert "args" in check.divergence.expected


def test_a_compatible_change_passes(finished):
    swap_code("tt-pipeline", compatible)
    check = journal.replay_check(finished)
    assert check.ok, check.divergence
    assert check.fingerprint != check.recorded_fingerprint


def test_same_calls_with_a_different_output_diverge(finished):
    swap_code("tt-pipeline", other_output)
    check = journal.replay_check(finished)
    assert (check.ok, check.divergence.position) == (False, 7)
    assert "different output" in check.divergence.detail


def test_code_that_now_ends_early_diverges(finished):
    swap_code("tt-pipeline", ends_early)
    check = journal.replay_check(finished)
    assert (check.ok, check.divergence.position) == (False, 5)
    assert check.divergence.expected.endswith(".verdict")


def test_code_that_now_raises_on_recorded_results_diverges(finished):
    swap_code("tt-pipeline", crashes)
    check = journal.replay_check(finished)
    assert (check.ok, check.divergence.position) == (False, 2)
    assert "KeyError" in check.divergence.got


def test_an_unfinished_run_is_ok_so_far(drive):
    run_id = journal.start("tt-wait", 3)
    drive()
    assert journal.get_run(run_id).status == RunStatus.SUSPENDED
    check = journal.replay_check(run_id)
    assert check.ok and check.checked == 3 and check.outcome == "exhausted"
    swap_code("tt-wait", reordered)
    assert journal.replay_check(run_id).divergence.position == 3


def test_a_replay_check_executes_and_writes_nothing(finished):
    events = SessionEvent.objects.filter(run_id=finished).count()
    executed = agents.executed()
    swap_code("tt-pipeline", compatible)
    assert journal.replay_check(finished).ok
    assert SessionEvent.objects.filter(run_id=finished).count() == events
    assert agents.executed() == executed
    assert journal.get_run(finished).status == RunStatus.COMPLETED


def test_replay_check_of_an_unknown_run_is_a_clear_error():
    with pytest.raises(journal.RunNotFoundError):
        journal.replay_check("not-a-run")


def test_replay_command_exit_codes(finished, drive, capsys):
    call_command("replay", str(finished))
    assert "ok" in capsys.readouterr().out
    call_command("replay", "--agent", "tt-pipeline", "--since", "1d")
    swap_code("tt-pipeline", reordered)
    with pytest.raises(CommandError) as exc:
        call_command("replay", "--agent", "tt-pipeline", "--since", "7d")
    assert exc.value.returncode == 1
    assert "step 3" in capsys.readouterr().out
    with pytest.raises(CommandError) as exc:
        call_command("replay", "--agent", "tt-pipeline", "--since", "last tuesday")
    assert exc.value.returncode == 2
    with pytest.raises(CommandError) as exc:
        call_command("replay")
    assert exc.value.returncode == 2


def test_replay_command_in_a_real_process(drive, worker_env):
    """The CI gate: a run recorded by other code makes the real command exit 1; a good one exits 0."""
    good = journal.start("tt-pipeline", 2)
    drive()
    swap_code("tt-pipeline", reordered)
    bad = journal.start("tt-pipeline", 4)  # recorded by the reordered code
    drive()
    assert journal.get_run(bad).status == RunStatus.COMPLETED
    env = worker_env("tests.agents.timetravel")

    def replay(*args):
        return subprocess.run([sys.executable, str(ROOT / "manage.py"), "replay", *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    ok = replay(str(good))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    diverged = replay("--agent", "tt-pipeline", "--since", "1h")
    assert diverged.returncode == 1, diverged.stdout + diverged.stderr
    assert f"FAIL {bad}: step 3" in diverged.stdout
    assert SessionEvent.objects.filter(run_id=bad, kind=EventKind.NONDETERMINISM).count() == 0


def test_a_run_that_used_the_sandbox_replays_without_touching_files(drive, settings, tmp_path):
    settings.DURABLE_SANDBOX_ROOT = str(tmp_path / "sandboxes")
    run_id = journal.start("tt-files")
    drive()
    assert journal.get_run(run_id).status == RunStatus.COMPLETED
    from journal.engine.restore import sandbox_root

    root = sandbox_root(run_id)
    before = sorted((p.name, p.read_text()) for p in root.iterdir())
    (root / "approve.txt").unlink()  # replay reads the journal, not the files
    check = journal.replay_check(run_id)
    assert check.ok and check.checked == 6, check
    assert sorted(p.name for p in root.iterdir()) == [name for name, _ in before if name != "approve.txt"]


GOLDEN = ROOT / "tests" / "golden"


def load_golden(name: str) -> str:
    """Recreate a recorded journal from tests/golden (Temporal-style replay fixtures)."""
    import json

    from journal.models import Run

    data = json.loads((GOLDEN / name).read_text())
    run = Run.objects.create(agent=data["agent"], input=data["input"], status=data["status"], output=data["output"],
                             fingerprint="golden", steps=len(data["steps"]))
    SessionEvent.objects.bulk_create([
        SessionEvent(run=run, seq=i, kind=EventKind.STEP_COMPLETED, position=s["position"],
                     step_name=s["step_name"], payload=s["payload"])
        for i, s in enumerate(data["steps"], 1)])
    return str(run.id)


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_golden_journals_keep_replaying_on_the_current_code(name):
    """A change to tests/agents/timetravel.py that would mis-replay these recorded runs fails here."""
    check = journal.replay_check(load_golden(name))
    assert check.ok, check.divergence
    assert check.checked == check.recorded


def test_a_golden_journal_catches_an_incompatible_change():
    run_id = load_golden("tt-pipeline-3.json")
    swap_code("tt-pipeline", other_arguments)
    assert journal.replay_check(run_id).divergence.position == 2
