"""manage.py runworker: the embedded worker (no Redis needed)."""

import signal

from django.core.management.base import BaseCommand

from journal.worker import EmbeddedWorker


class Command(BaseCommand):
    # The worker needs the engine, not the dashboard: don't let a URL or template check stop it.
    requires_system_checks: list[str] = []
    help = "Claim and drive durable runs on this machine until stopped (SIGTERM gives runs back cleanly)."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int, default=4, help="runs driven at once (threads)")
        parser.add_argument("--until-idle", action="store_true", help="exit when nothing is runnable")
        parser.add_argument("--poll", type=float, default=0.2, help="seconds between polls when idle")
        parser.add_argument("--worker-id", default=None)

    def handle(self, *args, concurrency, until_idle, poll, worker_id, **options):
        worker = EmbeddedWorker(concurrency=concurrency, poll_interval=poll, worker_id=worker_id)
        signal.signal(signal.SIGTERM, lambda *_: worker.request_stop())
        signal.signal(signal.SIGINT, lambda *_: worker.request_stop())
        self.stdout.write(f"worker {worker.id}: concurrency {concurrency}, lease {worker.ttl}s")
        self.stdout.flush()
        driven = worker.run(until_idle=until_idle)
        self.stdout.write(f"worker {worker.id}: stopped after driving {driven} run(s)")
