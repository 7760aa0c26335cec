"""ctx.sandbox: commands as durable steps, their records, and the limits that contain them."""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import timedelta

import pytest

import journal
from journal.engine.sandbox_exec import isolation
from journal.models import EventKind, Run, SandboxCommand, SessionEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox_root(settings):
    """A sandbox root the per-run uid can traverse (pytest's own tmp dirs are 0700)."""
    base = tempfile.mkdtemp(prefix="durable-sbx-test-")
    os.chmod(base, 0o711)
    settings.DURABLE_SANDBOX_ROOT = base
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _root(run_id) -> str:
    from journal.engine.restore import sandbox_root

    return str(sandbox_root(run_id))


@journal.workflow(name="sbx_basic")
def sbx_basic(ctx):
    ctx.sandbox.write_file("a.txt", "alpha\n")
    ctx.sandbox.write_file("gone.txt", "bye\n")
    r = ctx.sandbox.run("echo out; echo err >&2; echo more >> a.txt; rm gone.txt; mkdir -p d && echo x > d/new.txt; "
                        "echo ran >> count.log; exit 3")
    argv = ctx.sandbox.run(["printf", "%s|", "one two", "$HOME"])
    env = ctx.sandbox.run("env | sort", env={"EXTRA": "yes"})
    listing = ctx.sandbox.list_files()
    text = ctx.sandbox.read_file("a.txt")
    signal = ctx.wait_for_signal("go", timeout=timedelta(minutes=5))
    again = ctx.sandbox.run("cat count.log")
    return {"r": r.to_json(), "ok": r.ok, "argv": argv.stdout, "env": env.stdout, "listing": listing,
            "text": text, "signal": signal, "count": again.stdout}


def test_run_records_output_exit_code_and_changed_files(drive):
    run_id = journal.start("sbx_basic")
    drive()
    assert Run.objects.get(id=run_id).status == "suspended"
    journal.signal(run_id, "go", 1)
    drive()
    run = journal.wait(run_id, timeout=5)
    assert run.status == "completed", run.error
    r = run.output["r"]
    assert r["exit_code"] == 3 and not run.output["ok"] and r["failure_reason"] == ""
    assert r["stdout"] == "out\n" and r["stderr"] == "err\n"
    assert r["files_created"] == ["count.log", "d/new.txt"]
    assert r["files_modified"] == ["a.txt"]
    assert r["files_deleted"] == ["gone.txt"]
    assert run.output["argv"] == "one two|$HOME|"  # an argv list is not parsed by a shell
    env_lines = run.output["env"].splitlines()
    names = {line.split("=", 1)[0] for line in env_lines}
    assert {"PATH", "HOME", "LANG", "EXTRA"} <= names
    assert not names & {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTEST_CURRENT_TEST"}
    assert f"HOME={_root(run_id)}" in env_lines
    assert run.output["listing"] == ["a.txt", "count.log", "d/new.txt"]
    assert run.output["text"] == "alpha\nmore\n"
    # Resuming after the signal replayed the first command from its record: it ran exactly once.
    assert run.output["count"] == "ran\n"
    cmd = SandboxCommand.objects.get(run_id=run_id, command__startswith="echo out")
    assert cmd.exit_code == 3 and cmd.stdout == "out\n" and cmd.files_deleted == ["gone.txt"]
    assert cmd.position is not None and cmd.duration_ms > 0
    assert SessionEvent.objects.filter(run_id=run_id, kind=EventKind.SANDBOX_COMMAND).count() == \
        SandboxCommand.objects.filter(run_id=run_id).count() == 6


@journal.workflow(name="sbx_limits")
def sbx_limits(ctx):
    results = {}
    results["timeout"] = ctx.sandbox.run("sleep 600", timeout=1).to_json()
    results["output"] = ctx.sandbox.run("yes 'runaway output'", timeout=60).to_json()
    results["forkbomb"] = ctx.sandbox.run("bomb() { bomb | bomb & }; bomb; sleep 600", timeout=3).to_json()
    results["memory"] = ctx.sandbox.run(["python3", "-c", "x = bytearray(4 * 1024 ** 3)"],
                                        memory_bytes=256 << 20).to_json()
    results["cpu"] = ctx.sandbox.run(["python3", "-c", "while True: pass"], cpu_seconds=1, timeout=30).to_json()
    results["cwd_escape"] = ctx.sandbox.run("pwd", cwd="../..").to_json()
    ctx.sandbox.run("ln -s /etc etc_link && ln -s .. up")
    results["symlink_cwd"] = ctx.sandbox.run("pwd", cwd="etc_link").to_json()
    errors = []
    for attempt in (lambda: ctx.sandbox.write_file("../outside.txt", "x"),
                    lambda: ctx.sandbox.write_file("/tmp/outside.txt", "x"),
                    lambda: ctx.sandbox.write_file("etc_link/evil.conf", "x"),
                    lambda: ctx.sandbox.read_file("etc_link/hostname"),
                    lambda: ctx.sandbox.read_file("up/../../etc/hostname"),
                    lambda: ctx.sandbox.delete_file("up/something")):
        try:
            attempt()
            errors.append("allowed")
        except journal.DurableError as exc:
            errors.append(type(exc).__name__ + ": " + str(exc))
    results["helpers"] = errors
    ctx.sandbox.run("head -c 2000000 /dev/zero > big.bin")
    try:
        ctx.sandbox.read_file("big.bin")
        results["big_read"] = "allowed"
    except journal.DurableError as exc:
        results["big_read"] = type(exc).__name__
    results["after"] = ctx.sandbox.run("echo still here").to_json()
    return results


def test_runaway_commands_are_contained_and_recorded_and_the_run_goes_on(drive):
    run_id = journal.start("sbx_limits")
    drive()
    run = journal.wait(run_id, timeout=5)
    assert run.status == "completed", run.error
    out = run.output
    assert out["timeout"]["failure_reason"].startswith("timeout") and out["timeout"]["exit_code"] is None
    assert out["output"]["failure_reason"].startswith("output limit") and out["output"]["truncated"]
    assert len(out["output"]["stdout"]) <= 64 << 10
    assert out["forkbomb"]["failure_reason"].startswith("timeout")
    assert out["memory"]["failure_reason"].startswith("memory limit"), out["memory"]
    assert out["cpu"]["failure_reason"].startswith("cpu limit"), out["cpu"]
    assert out["cwd_escape"]["failure_reason"].startswith("path escape")
    assert out["symlink_cwd"]["failure_reason"].startswith("path escape")
    assert all(e.startswith("SandboxPathError") for e in out["helpers"]), out["helpers"]
    assert out["big_read"] == "PayloadTooLargeError"
    assert out["after"]["stdout"] == "still here\n" and out["after"]["exit_code"] == 0
    assert not os.path.exists(os.path.join(os.path.dirname(_root(run_id)), "outside.txt"))
    rows = {c.command: c for c in SandboxCommand.objects.filter(run_id=run_id)}
    assert rows["sleep 600"].failure_reason.startswith("timeout")
    assert rows["yes 'runaway output'"].truncated


@pytest.mark.skipif(isolation() != "namespaces", reason="needs root and unshare (namespaces isolation)")
def test_namespaced_commands_cannot_reach_the_network_or_write_outside_their_directory(drive):
    probe = ("python3 -c \"import socket; s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', 5432))\" "
             "2>&1 | tail -1; touch /work/escaped 2>&1 | tail -1; touch $HOME/../escaped 2>&1 | tail -1; id -u; "
             "ps -e | wc -l")
    run_id = journal.start("sbx_probe", probe)
    drive()
    run = journal.wait(run_id, timeout=5)
    assert run.status == "completed", run.error
    lines = run.output["stdout"].splitlines()
    assert "Network is unreachable" in lines[0]
    assert "Permission denied" in lines[1] and "Permission denied" in lines[2]
    assert int(lines[3]) >= 200_000
    assert int(lines[4]) <= 6  # only the command's own processes are visible (plus the ps header)
    assert not os.path.exists("/work/escaped")


@journal.workflow(name="sbx_probe")
def sbx_probe(ctx, command: str):
    return ctx.sandbox.run(command).to_json()


def test_a_failed_command_does_not_fail_the_run_but_a_bad_path_fails_it_cleanly(drive):
    run_id = journal.start("sbx_escape")
    drive()
    run = journal.wait(run_id, timeout=5)
    assert run.status == "failed"
    assert "SandboxPathError" in run.error and "escapes the sandbox" in run.error
    # Nothing was recorded for the refused write: no position taken, no row.
    assert not SandboxCommand.objects.filter(run_id=run_id, command__contains="outside").exists()


@journal.workflow(name="sbx_escape")
def sbx_escape(ctx):
    ctx.sandbox.run("false")
    ctx.sandbox.write_file("../../outside.txt", "x")
