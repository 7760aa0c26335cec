"""Checkpoint policy: decide after each step whether recovery needs a checkpoint.

``every`` checkpoints after each step; ``selective`` (the default) only when the step changed
recovery-relevant state (sandbox files, explicit agent state) or is marked ``checkpoint=True``;
``manual`` only when marked. A skipped step records why in its journal record, so the
dashboard can show it without a row of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from journal.models import Checkpoint, CheckpointDecision


def decide(ctx, defn) -> tuple[bool, str]:
    policy = ctx.run.checkpoint_policy
    if defn is not None and defn.checkpoint is False:
        return False, "step marked checkpoint=False"
    if defn is not None and defn.checkpoint is True:
        return True, "step marked checkpoint=True"
    if policy == "every":
        return True, "policy every"
    if policy == "manual":
        return False, "policy manual: step not marked"
    changed = []
    if ctx.state_dirty:
        changed.append("agent state")
    if changed:
        return True, "changed " + " and ".join(changed)
    return False, "no sandbox or state change"


def after_step(ctx, position: int, defn, commit: Callable[[Callable[[], None] | None], None]) -> None:
    """Commit the step's record, with a checkpoint in the same transaction when the policy says so."""
    take, reason = decide(ctx, defn)
    if not take:
        commit(None)
        return
    state = ctx.agent_state

    def write_checkpoint() -> None:
        Checkpoint.objects.create(
            run_id=ctx.run_id, position=position, step_name=getattr(defn, "name", ""),
            decision=CheckpointDecision.TAKEN, reason=reason, manifest={}, state=state,
            bytes_written=len(str(state)) if state is not None else 0,
        )

    commit(write_checkpoint)
    ctx.state_dirty = False
