"""manage.py runworker: the embedded worker (no Redis needed)."""

import os
import signal
import sys
import threading

from django.core.management.base import BaseCommand

from journal.driver.worker import EmbeddedWorker


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
        def stop(*_args) -> None:
            # A signal handler runs in the main thread between two bytecodes, possibly while that
            # thread holds the worker's lock: stop from another thread, which can wait for it.
            threading.Thread(target=worker.request_stop, name="stop-request", daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"worker {worker.id}: concurrency {concurrency}, lease {worker.ttl}s")
        self.stdout.flush()
        driven = worker.run(until_idle=until_idle)
        self.stdout.write(f"worker {worker.id}: stopped after driving {driven} run(s)")
        stuck = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
        if stuck:
            # A step stuck in user code past the shutdown grace: its lease was already expired, so
            # another worker takes the run over. Don't let the interpreter wait for it at exit.
            self.stdout.write(f"worker {worker.id}: exiting with {len(stuck)} thread(s) still busy: {stuck}")
            self.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
