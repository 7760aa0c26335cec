"""Assertions about the journal that several fault tests share."""

from __future__ import annotations

from collections import defaultdict

from django.db import connection

from journal.models import SessionEvent


def sqlite_vm_steps(call) -> int:
    """SQLite's virtual-machine instructions to answer ``call`` (counted in 10s): the work done, not the time."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    connection.ensure_connection()
    connection.connection.set_progress_handler(count, 10)
    try:
        call()
    finally:
        connection.connection.set_progress_handler(None, 10)
    return steps[0] * 10


def assert_no_seq_gaps(run_ids=None) -> int:
    """Every run's session log is numbered 1..N with no gap and no repeat; returns how many runs were checked."""
    qs = SessionEvent.objects.all()
    if run_ids is not None:
        qs = qs.filter(run_id__in=list(run_ids))
    seqs: dict = defaultdict(list)
    for run_id, seq in qs.values_list("run_id", "seq").order_by("run_id", "seq"):
        seqs[run_id].append(seq)
    gaps = {str(r): s for r, s in seqs.items() if s != list(range(1, len(s) + 1))}
    assert not gaps, f"session sequences with gaps: {gaps}"
    if run_ids is not None:
        missing = {str(r) for r in run_ids} - {str(r) for r in seqs}
        assert not missing, f"runs with no session log at all: {missing}"
    return len(seqs)
