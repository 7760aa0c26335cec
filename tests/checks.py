"""Assertions about the journal that several fault tests share."""

from __future__ import annotations

from collections import defaultdict

from journal.models import SessionEvent


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
