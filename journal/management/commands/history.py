"""manage.py history RUN_ID: print a run's journal as JSON, to keep as a golden journal.

    python manage.py history 5f0c... > tests/golden/histories/checkout.json
    python manage.py replay --history tests/golden/histories/checkout.json    # on every deploy
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from journal.operations.timetravel import export_history
from journal.store.errors import DurableError


class Command(BaseCommand):
    requires_system_checks: list[str] = []
    help = "Print a run's history (its journal as replay sees it) as JSON."

    def add_arguments(self, parser):
        parser.add_argument("run_id", metavar="RUN_ID")

    def handle(self, *args, run_id, **options):
        try:
            data = export_history(run_id)
        except DurableError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(json.dumps(data, indent=1, sort_keys=True))
