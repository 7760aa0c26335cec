"""How a drive ends in the run row: the fenced status move and the fields every end writes.

Shared by the executor and the saga, which both settle the run a worker holds.
"""

from __future__ import annotations

from typing import Any

from journal.models import RunStatus
from journal.primitives.context import Context
from journal.store import runstate


def end_fields(ctx: Context) -> dict[str, Any]:
    """What every end of a drive writes besides the status (the lease let go, progress, cost)."""
    fields = runstate.released_fields(steps=max(ctx.position, ctx.run.steps),
                                      progress=ctx.progress if ctx.progress_dirty else None,
                                      tokens=ctx.tokens, cost=ctx.cost)
    ctx.tokens, ctx.cost = 0, 0.0
    return fields


def settle_move(ctx: Context, target: str, **fields: Any) -> runstate.FencedMove:
    """The fenced move from the status the claim left the run in, for ``writer.record(extra=...)``."""
    source = ctx.run.status if ctx.run.status == RunStatus.COMPENSATING else RunStatus.RUNNING
    return runstate.FencedMove(ctx.run.id, ctx.epoch, target, cause=runstate.Cause.SETTLE, sources=(source,),
                               **fields)
