"""A thread's database connection closed when the thread ends, whoever ends it.

Django opens a connection per thread and closes it only when told (a request's end, or
``close_old_connections``). A thread that ends without being told leaves its connection open on
the server until the garbage collector happens to free it, and psycopg then warns that it was
deleted while open. Two kinds of thread end that way: the threads an executor starts and stops on
its own (LangGraph's, for each invocation, which save checkpoints), and the worker's pool threads
when the pool shuts down while a run is still being driven (they keep their connection between
runs, and only idle threads can be asked to close it).

``close_at_thread_exit()`` puts a closer in the thread's locals. CPython clears a thread's locals
in that thread when it ends, and the closer closes the driver connection Django holds for it
then (the driver's own ``close``: Django's checks the calling thread, and this one is ending).

Only in the process that opened it: a child forked to run a command (``subprocess`` with a
``preexec_fn``, as the sandbox does) clears the other threads' locals too, and closing there would
end the parent's PostgreSQL session on the shared socket, or hang on a lock SQLite held at the fork.
"""

from __future__ import annotations

import os
import threading

from django.db import DEFAULT_DB_ALIAS, connections


class _CloseAtThreadExit:
    def __init__(self) -> None:
        self.wrapper = connections[DEFAULT_DB_ALIAS]
        self.pid = os.getpid()

    def __del__(self) -> None:
        if os.getpid() != self.pid:  # a forked child dropping the parent's threads: not its connection
            return
        raw = self.wrapper.connection
        if raw is not None:
            try:
                raw.close()
            except Exception:  # noqa: S110 - a connection to a server that went away is closed either way
                pass


_local = threading.local()


def close_at_thread_exit() -> None:
    """Close this thread's default connection when the thread ends (once per thread; the main
    thread is left alone: it ends with the process)."""
    if threading.current_thread() is not threading.main_thread() and not hasattr(_local, "closer"):
        _local.closer = _CloseAtThreadExit()
