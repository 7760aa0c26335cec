"""Versioning of in-flight runs: replay-check before resuming on changed code, and ``ctx.patched()``.

Every run records the harness version and the code fingerprint it started on (``Run.version``,
``Run.fingerprint``). When a worker resumes a run whose recorded steps were made by different
code, ``journal.driver.replayer.check_before_resume`` first replays the journal in memory against the new code (nothing
executes, nothing is written). A divergence stops the run in ``needs_attention`` with the
position, the recorded call and the new call, instead of letting the new code mis-replay it.
A compatible change passes, and the run continues on the new code (its fingerprint is updated).

Branching on version for in-flight runs (in the spirit of Temporal's patching)::

    @journal.workflow(name="checkout", version="2")
    def checkout(ctx, order_id):
        charge(order_id)
        if ctx.patched("send-receipt"):      # new code path
            send_receipt(order_id)
        ship(order_id)

- A run that reaches the ``patched`` call on this code (live) records a marker at that step
  position (step name ``patch:send-receipt``) and gets True: it takes the new path, and on
  every later replay the marker is found and True is returned again.
- A run that had already passed that point on the old code has no marker there: on replay
  ``patched`` returns False *without taking a position*, so the old journal (charge, ship)
  still lines up and the run finishes on the old path.
- Once no run that could replay without the marker is left, drop the old branch but keep the
  call (``ctx.patched("send-receipt")`` with its result ignored) as long as runs holding the
  marker may replay; a removed call whose marker is in a journal is reported as a divergence.
"""

from __future__ import annotations

import logging

from journal.models import EventKind
from journal.store.errors import BadArgumentsError

log = logging.getLogger(__name__)

PATCH_PREFIX = "patch:"


def patched(ctx, change_id: str) -> bool:
    """True when this run reaches this point on code that has change ``change_id``; see the module doc."""
    if not isinstance(change_id, str) or not change_id.strip():
        raise BadArgumentsError("ctx.patched() needs a non-empty change id")
    name = PATCH_PREFIX + change_id
    memo = ctx.patches
    if name in memo:  # asked twice in one execution: same answer, one marker
        return memo[name]
    position = ctx.position + 1
    record = ctx.recorded.get(position)
    if record is not None or position in ctx.markers:  # a wait started here counts as passing the point
        if record is not None and record["step_name"] == name:
            ctx.next_position()
            memo[name] = True
            return True
        memo[name] = False  # the run passed this point on the old code
        return False
    if ctx.replay_only:
        # A replay check reaching the end of the recording: live execution would take the new path here.
        ctx.next_position()
        memo[name] = True
        return True
    ctx.check_interrupts()
    ctx.next_position()
    # Exit durability: the marker becomes durable with the next write; if it is lost in a crash,
    # nothing after it was durable either, and the re-execution evaluates the patch live again.
    ctx.writer.record(EventKind.STEP_COMPLETED, {"result": True, "kind": "patch", "change_id": change_id},
                      position=position, step_name=name, durability="exit")
    memo[name] = True
    return True
