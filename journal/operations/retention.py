"""Retention: the only code allowed to delete from the append-only session log.

Admins keep finished runs for N days per agent and status (RetentionRule); ``preview()`` says
what a purge would delete, ``purge()`` deletes it in small batches (short transactions, so a
purge never blocks workers for long), then collects the blobs nothing refers to any more. Live runs
are never purged. The embedded worker and
Celery beat run ``purge()`` on a schedule; ``manage.py purge`` runs it by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from journal.models import TERMINAL_STATUSES, RetentionRule, Run
from journal.models.session import allow_deletes
from journal.store import blobs
from journal.store.errors import DurableError
from journal.store.serialization import check_text

log = logging.getLogger(__name__)
MAX_KEEP_DAYS = 36_500  # a century: beyond it, a date overflows

@dataclass
class RulePreview:
    rule_id: int
    label: str
    keep_days: int
    runs: int
    oldest: datetime | None


def _rule_filter(rule) -> Q:
    q = Q()
    if rule.agent:
        q &= Q(agent=rule.agent)
    if rule.status:
        q &= Q(status=rule.status)
    return q


def expired_runs(rule, rules: list, now: datetime | None = None) -> QuerySet:
    """Finished runs this rule governs (no more specific rule matches them) that are past their time."""
    now = now or timezone.now()
    qs = Run.objects.filter(status__in=TERMINAL_STATUSES, finished_at__lt=now - timedelta(days=rule.keep_days))
    qs = qs.filter(_rule_filter(rule))
    for other in rules:
        if other.pk != rule.pk and other.specificity > rule.specificity and _covers(rule, other):
            qs = qs.exclude(_rule_filter(other))
    return qs


def _covers(general, specific) -> bool:
    return (not general.agent or general.agent == specific.agent) and (
        not general.status or general.status == specific.status)


def preview(now: datetime | None = None) -> list[RulePreview]:
    rules = list(RetentionRule.objects.all())
    out = []
    for rule in sorted(rules, key=lambda r: -r.specificity):
        qs = expired_runs(rule, rules, now)
        oldest = qs.order_by("finished_at").values_list("finished_at", flat=True).first()
        out.append(RulePreview(rule.pk, str(rule), rule.keep_days, qs.count(), oldest))
    return out


def purge(now: datetime | None = None, *, batch: int = 200,
          progress: Callable[[int, int], None] | None = None) -> int:
    """Delete every expired run with its journal, effects, spans and checkpoints; returns how many."""
    rules = list(RetentionRule.objects.all())
    if not rules:
        return 0
    total = sum(expired_runs(rule, rules, now).count() for rule in rules)
    deleted = 0
    for rule in sorted(rules, key=lambda r: -r.specificity):
        while True:
            ids = list(expired_runs(rule, rules, now).values_list("id", flat=True)[:batch])
            if not ids:
                break
            with transaction.atomic(), allow_deletes():
                Run.objects.filter(id__in=ids).delete()
            deleted += len(ids)
            if progress:
                progress(deleted, total)
    if deleted:
        # The purged runs' results, transcripts and sandbox files: the blobs nothing refers to any more.
        collected = blobs.collect_garbage()
        log.info("retention purged %d finished run(s) and %d unreferenced blob(s)", deleted, collected)
    return deleted


def set_rule(*, agent: str = "", status: str = "", keep_days: int, actor: str = ""):
    """Create or change the rule for (agent, status); blank means "every"."""
    if status and status not in TERMINAL_STATUSES:
        raise DurableError(f"retention applies to finished runs: status must be one of "
                           f"{', '.join(sorted(TERMINAL_STATUSES))} or blank")
    if not isinstance(keep_days, int) or isinstance(keep_days, bool) or not 1 <= keep_days <= MAX_KEEP_DAYS:
        raise DurableError(f"keep_days must be a whole number of days from 1 to {MAX_KEEP_DAYS:,}")
    if not isinstance(agent, str) or len(agent.strip()) > 200:
        raise DurableError("an agent name has at most 200 characters")
    check_text(agent, what="the agent name")
    rule, _ = RetentionRule.objects.update_or_create(
        agent=agent.strip(), status=status,
        defaults={"keep_days": keep_days, "created_by": actor, "updated_at": timezone.now()})
    return rule


def delete_rule(rule_id: int, *, actor: str = "") -> str:
    rule = RetentionRule.objects.filter(pk=rule_id).first()
    if rule is None:
        raise DurableError(f"no retention rule {rule_id}")
    label = str(rule)
    rule.delete()
    return label
