"""Demo data: users for each role, and runs in every state the dashboard can show.

``seed()`` starts real runs of the example agents and drives them with a real worker until each
reaches the state it is meant to show; nothing is written into the journal by hand:

=================  ===========================================================================
completed          a research report, a 12-contract review, a code repair that went green
forked             the research run forked at its synthesis step onto another model
                   (``journal.operations.whatif.fork_with_model``): compare the two side by side
suspended          a contract review waiting in the approvals inbox for a high-risk contract
failed             a contract review stopped at an unreadable scan: step through it, fork it
compensated        a research run whose fact check failed after publishing: the report was
                   retracted by its compensation
needs_attention    a contract review whose worker process was SIGKILLed while writing the
                   report (a real crash, by fault injection): the outcome is unknown, so the
                   engine asks an operator instead of guessing
running            the 500-contract portfolio, paced so its progress is visible; the demo's
                   worker drives it (``--no-serve`` leaves it part-way, pending, with progress)
=================  ===========================================================================
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection

import journal

PASSWORDS = {"viewer": "viewer-demo", "operator": "operator-demo", "admin": "admin-demo"}
ACTOR = "demo-seed"


@dataclass
class Seeded:
    runs: dict[str, str] = field(default_factory=dict)  # label -> run_id
    users: dict[str, str] = field(default_factory=dict)  # username -> password
    notes: list[str] = field(default_factory=list)


def create_users() -> dict[str, str]:
    """One user per role (viewer, operator, admin), in the dashboard's groups when it is installed."""
    from django.contrib.auth.models import Group, User

    try:
        from runs.roles import ensure_roles
    except ImportError:  # the engine works without the dashboard
        ensure_roles = None
    if ensure_roles:
        ensure_roles()
    for role, password in PASSWORDS.items():
        user, _ = User.objects.get_or_create(username=role)
        user.set_password(password)
        user.is_staff = role == "admin"
        user.save()
        group = Group.objects.filter(name=role).first()
        if group is not None:
            user.groups.add(group)
    return dict(PASSWORDS)


def database_url() -> str:
    """This process's database as a URL, for the worker process the needs_attention demo crashes."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = f"{s.get('USER') or 'postgres'}:{s['PASSWORD']}" if s.get("PASSWORD") else (s.get("USER") or "postgres")
    return f"postgres://{auth}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def drive_until(done: Callable[[], bool], *, timeout: float = 120.0, concurrency: int = 2) -> None:
    """Drive runs with an in-process EmbeddedWorker until ``done()`` or the timeout."""
    from journal.driver.worker import EmbeddedWorker

    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise RuntimeError("demo seeding: runs did not reach their states in time")
        EmbeddedWorker(concurrency=concurrency, poll_interval=0.05).run(until_idle=True, max_seconds=60)
        if not done():
            time.sleep(0.2)


def _status(run_id: str) -> str:
    from journal.models import Run

    return Run.objects.filter(id=run_id).values_list("status", flat=True).first() or ""


def crash_while_writing_report(size: int = 3) -> str:
    """A contract review whose worker process dies (SIGKILL, by fault injection) right after the
    report effect's intent is committed: the engine cannot know whether the report was written."""
    run_id = journal.start_run("contract_review", kwargs={"size": size, "high_risk": 11}, actor=ACTOR)
    env = {**os.environ, "DATABASE_URL": database_url(), "DURABLE_FAULTS": f"effect_started:run_id={run_id}",
           "DURABLE_LEASE_SECONDS": "1", "DJANGO_SETTINGS_MODULE": "durable_ui.settings"}
    manage = Path(settings.BASE_DIR) / "manage.py"
    proc = subprocess.run([sys.executable, str(manage), "runworker", "--until-idle", "--poll", "0.05"], env=env,
                          cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                          check=False)
    if proc.returncode != -9:
        raise RuntimeError(f"the crashing worker exited with {proc.returncode}, not SIGKILL")
    drive_until(lambda: _status(run_id) == "needs_attention", timeout=60)
    return run_id


def seed(*, contracts: int | None = None, leave_running: bool = True, log: Callable[[str], None] = print) -> Seeded:
    """Create the demo users and runs; returns what was made. Takes a few seconds offline."""
    from journal.models import SessionEvent

    real_model = bool(os.environ.get("DURABLE_LLM_BASE_URL"))
    out = Seeded(users=create_users())

    log("seeding: a worker crashes mid-effect (needs_attention) …")
    out.runs["needs_attention"] = crash_while_writing_report()

    log("seeding: completed, suspended, failed and compensated runs …")
    starts = {
        "completed_research": ("research", {"topic": "durable execution for AI agents"}),
        "completed_contracts": ("contract_review", {"size": 12, "high_risk": 11}),
        "completed_code_repair": ("code_repair", {}),
        "suspended": ("contract_review", {"size": 30}),
        "failed": ("contract_review", {"size": 20, "corrupt": [13], "high_risk": 11}),
        "compensated": ("research", {"topic": "sagas and compensation", "fact_check_mode": "strict"}),
    }
    for label, (agent, kwargs) in starts.items():
        out.runs[label] = journal.start_run(agent, kwargs=kwargs, actor=ACTOR)
    settled = {"completed", "failed", "suspended", "compensated", "needs_attention", "cancelled"}
    drive_until(lambda: all(_status(r) in settled for r in out.runs.values()))

    log("seeding: a counterfactual fork of the research run on another model …")
    from journal.operations.whatif import fork_with_model

    research_id = out.runs["completed_research"]
    synthesis = (SessionEvent.objects.steps().filter(run_id=research_id, step_name__startswith="model:")
                 .order_by("-position").values_list("position", flat=True).first())
    if real_model:
        out.runs["forked"] = fork_with_model(research_id, synthesis, params={"temperature": 0.9}, actor=ACTOR)
    else:
        out.runs["forked"] = fork_with_model(research_id, synthesis, model="scripted-large", actor=ACTOR)
    drive_until(lambda: _status(out.runs["forked"]) in settled)

    size = contracts or (20 if real_model else 500)
    log(f"seeding: the {size}-contract portfolio review (long-running) …")
    out.runs["running"] = journal.start_run("contract_review", kwargs={"size": size, "high_risk": 11,
                                                                       "pace": 0.0 if real_model else 0.15},
                                            actor=ACTOR)
    if not leave_running:
        _drive_for(2.0)
    for label, run_id in out.runs.items():
        log(f"  {label:22s} {_status(run_id):16s} {run_id}")
    return out


def _drive_for(seconds: float) -> None:
    """Drive for a while, then stop: runs still in flight are given back at a step boundary."""
    from journal.driver.worker import EmbeddedWorker

    worker = EmbeddedWorker(concurrency=2, poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"max_seconds": seconds}, daemon=True)
    thread.start()
    thread.join(timeout=seconds + 60)
