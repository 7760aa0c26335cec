"""manage.py purge: apply the retention rules now (what the schedule does), with a progress bar."""

import sys

from django.core.management.base import BaseCommand

from journal.operations import retention


class Command(BaseCommand):
    help = "Delete finished runs older than their retention rule allows (--dry-run shows what would go)."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, dry_run, **options):
        rows = retention.preview()
        if not rows:
            self.stdout.write("no retention rules: nothing is ever purged (add rules in the dashboard)")
            return
        for row in rows:
            self.stdout.write(f"{row.label}: {row.runs} run(s) expired")
        if dry_run:
            return

        def bar(done: int, total: int) -> None:
            width = 30
            filled = int(width * done / max(total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            sys.stderr.flush()

        deleted = retention.purge(progress=bar)
        sys.stderr.write("\n")
        self.stdout.write(f"purged {deleted} run(s)")
