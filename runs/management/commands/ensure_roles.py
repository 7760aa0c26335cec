from django.core.management.base import BaseCommand

from runs.roles import ensure_roles


class Command(BaseCommand):
    help = "Create or repair the viewer, operator and admin groups with their dashboard permissions."

    def handle(self, *args, **options):
        groups = ensure_roles()
        self.stdout.write(f"roles ready: {', '.join(groups)}")
