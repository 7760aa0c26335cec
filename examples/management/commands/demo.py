"""manage.py demo: seed demo users and runs, then serve the dashboard with a worker (what `make demo` runs)."""

from __future__ import annotations

import os
import threading

from django.core.management import call_command
from django.core.management.base import BaseCommand

from examples.seed import seed


class Command(BaseCommand):
    help = "Create demo users and runs in every state, then start the web server and an embedded worker."

    def add_arguments(self, parser):
        parser.add_argument("--no-serve", action="store_true", help="only seed (for tests and scripts)")
        parser.add_argument("--addr", default=os.environ.get("DURABLE_DEMO_ADDR", "127.0.0.1:8000"),
                            help="address:port for the web server")
        parser.add_argument("--contracts", type=int, default=None,
                            help="size of the long-running portfolio (default 500 offline, 20 with a real model)")
        parser.add_argument("--concurrency", type=int, default=4, help="runs the embedded worker drives at once")

    def handle(self, *args, no_serve: bool, addr: str, contracts: int | None, concurrency: int, **options):
        model = os.environ.get("DURABLE_LLM_BASE_URL")
        if model:
            self.stdout.write(f"model: {os.environ.get('DURABLE_LLM_MODEL', 'gpt-4o-mini')} at {model}")
        else:
            self.stdout.write("model: the offline scripted client (set DURABLE_LLM_BASE_URL for a real one)")
        seeded = seed(contracts=contracts, leave_running=not no_serve, log=self.stdout.write)
        if no_serve:
            self._logins(seeded.users, None)
            return
        from journal.driver.worker import EmbeddedWorker

        worker = EmbeddedWorker(concurrency=concurrency, poll_interval=0.2)
        threading.Thread(target=worker.run, name="demo-worker", daemon=True).start()
        self._logins(seeded.users, f"http://{addr}/")
        try:
            call_command("runserver", addr, use_reloader=False, insecure_serving=True)
        finally:
            worker.request_stop()

    def _logins(self, users: dict[str, str], url: str | None) -> None:
        out = self.stdout
        out.write("")
        if url:
            out.write(self.style.SUCCESS(f"durable-ui demo: open {url}"))
        out.write("logins (user / password):")
        for user, password in users.items():
            out.write(f"  {user:9s} / {password}")
        out.write("")
