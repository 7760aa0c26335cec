"""manage.py replay: re-execute the current code against recorded journals; exit 1 on any divergence.

    python manage.py replay RUN_ID [RUN_ID ...]
    python manage.py replay --agent checkout --since 7d        # or --since 2026-11-01T00:00
    python manage.py replay --history tests/golden/histories/*.json   # journals kept as JSON
                                                                        # (manage.py history RUN_ID)

Gate deploys on it: exit code 0 when every run replays on this code, 1 when one diverges, 2 for
bad input. Nothing executes and nothing is written.
"""

from __future__ import annotations

import re
import sys
from datetime import datetime, timedelta
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from journal.models import Run
from journal.operations.timetravel import History, check_runs, replay
from journal.store.errors import DurableError


def parse_since(text: str) -> datetime:
    """'7d', '12h', '30m' (ago) or an ISO date/datetime."""
    match = re.fullmatch(r"(\d+)([dhm])", text.strip())
    if match:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[match.group(2)]
        return timezone.now() - timedelta(**{unit: int(match.group(1))})
    parsed = parse_datetime(text) or (parse_datetime(text + "T00:00") if len(text) == 10 else None)
    if parsed is None:
        raise CommandError(f"--since {text!r}: give an ISO date/datetime or a duration like 7d, 12h, 30m",
                           returncode=2)
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # the engine needs no dashboard
    help = "Replay-check runs against the current code (exit 0: all replay, 1: a divergence, 2: bad input)."

    def add_arguments(self, parser):
        parser.add_argument("run_ids", nargs="*", metavar="RUN_ID")
        parser.add_argument("--agent", help="check the runs of this agent")
        parser.add_argument("--since", help="with --agent: runs created since (ISO date/datetime, or 7d/12h/30m)")
        parser.add_argument("--limit", type=int, default=0, help="check at most this many runs (newest first)")
        parser.add_argument("--history", nargs="+", metavar="FILE", default=[],
                            help="replay these exported histories (JSON) instead of runs in the database")

    def handle(self, *args, run_ids, agent, since, limit, history, **options):
        if history:
            if run_ids or agent:
                raise CommandError("give --history FILE(s), RUN_ID(s) or --agent NAME (one of them)", returncode=2)
            return self._report(self._histories(history), options["verbosity"])
        if bool(run_ids) == bool(agent):
            raise CommandError("give RUN_ID(s) or --agent NAME (not both)", returncode=2)
        if since and not agent:
            raise CommandError("--since needs --agent", returncode=2)
        if agent:
            qs = Run.objects.filter(agent=agent, steps__gt=0)
            if since:
                qs = qs.filter(created_at__gte=parse_since(since))
            run_ids = list(qs.order_by("-created_at").values_list("id", flat=True)[: limit or None])
            if not run_ids:
                self.stdout.write(f"no runs of {agent!r} with recorded steps to check")
                return
        try:
            report = check_runs(run_ids, progress=self._progress if len(run_ids) > 1 else None)
        except DurableError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self._report(report, options["verbosity"])

    def _histories(self, paths: list[str]) -> list:
        report = []
        for path in paths:
            try:
                report.append(replay(History.from_json(Path(path).read_text())))
            except (OSError, ValueError, KeyError, DurableError) as exc:
                raise CommandError(f"{path}: not a history this code can replay ({exc})", returncode=2) from None
        return report

    def _report(self, report: list, verbosity: int) -> None:
        for check in report:
            if check.ok:
                if len(report) == 1 or verbosity > 1:
                    self.stdout.write(f"ok   {check.run_id}: {check.checked} step(s) replay ({check.outcome})")
            else:
                self.stdout.write(f"FAIL {check.run_id}: {check.divergence}")
        bad = sum(1 for c in report if not c.ok)
        summary = f"{len(report) - bad} of {len(report)} run(s) replay on this code"
        if bad:
            raise CommandError(f"{summary}; {bad} diverge", returncode=1)
        self.stdout.write(summary)

    def _progress(self, done: int, total: int) -> None:
        if not sys.stderr.isatty() and done not in (total,) and done % max(1, total // 20):
            return
        width = 30
        filled = width * done // total
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
