"""manage.py erase: erase a subject's data from the runs that hold it (journal.erase), with a preview
and a progress bar. The runs stay, with their steps and timings; their payloads are replaced."""

import getpass
import sys

from django.core.management.base import BaseCommand, CommandError

from journal.operations import erasure
from journal.store.errors import DurableError


class Command(BaseCommand):
    help = ("Erase the data of a subject's runs (--subject) or of given runs (--run, repeatable), keeping their "
            "skeleton; --dry-run shows what would be erased.")

    def add_arguments(self, parser):
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--subject", help="the subject the runs are linked to (ctx.set_subject)")
        who.add_argument("--run", action="append", dest="runs", metavar="RUN_ID", help="a run id (repeatable)")
        parser.add_argument("--reason", help="why (e.g. the request's reference); kept in the erasure record")
        parser.add_argument("--actor", default="", help="who asked (default: the shell user)")
        parser.add_argument("--dry-run", action="store_true", help="show the preview, erase nothing")
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    def handle(self, *args, subject, runs, reason, actor, dry_run, yes, **options):
        try:
            preview = erasure.preview_erasure(run_ids=runs, subject=subject)
        except DurableError as exc:
            raise CommandError(str(exc)) from None
        for line in preview.runs:
            note = f"  REFUSED: {line.refused}" if line.refused else "  (erased before: skipped)" if line.erased else ""
            self.stdout.write(f"{line.run_id}  {line.agent}  {line.status}  {line.events} event(s){note}")
        for earlier in preview.already_erased:
            self.stdout.write(f"earlier erasure {earlier.id} of this subject: {earlier.runs} run(s) by "
                              f"{earlier.actor} on {earlier.created_at:%Y-%m-%d %H:%M}")
        erasable = preview.to_erase
        self.stdout.write(f"would erase {len(erasable)} run(s): {preview.events} session event(s), "
                          f"{preview.files} sandbox file(s), {preview.blobs} blob(s) "
                          f"({preview.blobs_kept} shared with other runs are kept)")
        if dry_run:
            return
        if not reason:
            raise CommandError("--reason is required (it is kept in the erasure record)")
        if not yes:
            answer = input("Erase this data? It cannot be undone. [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                raise CommandError("nothing erased")

        def bar(done: int, total: int) -> None:
            width = 30
            filled = int(width * done / max(total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            sys.stderr.flush()

        try:
            report = erasure.erase(run_ids=runs, subject=subject, actor=actor or f"shell:{getpass.getuser()}",
                                   reason=reason, progress=bar)
        except DurableError as exc:
            raise CommandError(str(exc)) from None
        sys.stderr.write("\n")
        self.stdout.write(f"erasure {report.erasure_id}: erased {len(report.run_ids)} run(s), {report.events} "
                          f"session event(s), {report.files} sandbox file(s); deleted {report.blobs_deleted} blob(s)")
