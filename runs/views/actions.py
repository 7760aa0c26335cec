"""Actions on one run. Each is role-checked (operator), audited, calls exactly one engine function,
and answers in place (an htmx fragment) or, without htmx, with a message and a redirect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from journal.operations.whatif import fork_with_model, model_choices
from runs.permissions import operator_required
from runs.views.common import Outcome, get_run_or_404, parse_int, parse_json_field, perform

EFFECT_RESOLUTIONS = ("done", "retry", "skip")
FORKS = ("fork", "rerun", "fork_state", "fork_thread", "whatif")  # actions that answer with a new run


def _text(request: HttpRequest, name: str, limit: int = 2000) -> str:
    return request.POST.get(name, "").strip()[:limit]


def _do_cancel(request, run, actor):
    import journal

    reason = _text(request, "reason") or "cancelled from the dashboard"
    return (lambda: journal.cancel(run.id, reason, actor=actor)), reason, lambda r: f"cancel requested: {reason}"


def _simple(name: str, message: str) -> Callable:
    """pause, unpause, resume, retry, compensate: journal.<name>(run_id, actor=, reason=)."""

    def build(request, run, actor):
        import journal

        reason = _text(request, "reason")
        return (lambda: getattr(journal, name)(run.id, actor=actor, reason=reason)), reason, lambda r: message

    return build


def _do_signal(request, run, actor):
    import journal

    name = _text(request, "name", 200)
    payload, error = parse_json_field(request.POST.get("payload", ""), "the payload")
    if error:
        return error, "", None
    if not name:
        return "a signal needs a name", "", None
    return (lambda: journal.signal(run.id, name, payload, actor=actor)), f"signal {name}", \
        lambda r: f"signal {name!r} delivered"


def _do_resolve(request, run, actor):
    import journal

    position = parse_int(request.POST.get("position", ""), minimum=1)
    if position is None:
        return "choose the step position of the effect to resolve", "", None
    how = request.POST.get("resolution", "")
    if how not in EFFECT_RESOLUTIONS:
        return f"resolution must be one of {', '.join(EFFECT_RESOLUTIONS)}", "", None
    result, error = parse_json_field(request.POST.get("result", ""), "the result")
    if error:
        return error, "", None
    comment = _text(request, "comment")
    return (lambda: journal.resolve_effect(run.id, position, action=how, result=result, actor=actor,
                                           comment=comment)), comment, \
        lambda r: f"effect at step {position} resolved: {how}"


def _do_fork(request, run, actor):
    """Fork from step N. Only a checked "use an edited result" box sends an override: the textarea's
    text alone never does (it may hold the recorded result, or a failed step's error)."""
    import journal

    at_step = parse_int(request.POST.get("at_step", ""), minimum=1)
    if at_step is None:
        return "choose the step to fork from", "", None
    reason = _text(request, "reason")
    kwargs: dict[str, Any] = {"actor": actor, "reason": reason}
    if request.POST.get("edit") == "on":
        if not request.POST.get("override", "").strip():
            return "the edited result is empty: write the JSON the step should return, or re-run instead", "", None
        override, error = parse_json_field(request.POST.get("override", ""), "the edited result")
        if error:
            return error, "", None
        if override is None:
            return "null cannot be an edited result (the engine reads it as no override): re-run instead", "", None
        kwargs["override"] = override
        done = f"forked at step {at_step} with an edited result"
    else:
        done = f"re-running from step {at_step}"
    return (lambda: journal.fork(run.id, at_step, **kwargs)), reason, lambda new_id: done


def _do_rerun(request, run, actor):
    """Re-run from step N: a fork that replays steps 1..N-1 and executes step N anew (never an override)."""
    import journal

    at_step = parse_int(request.POST.get("at_step", ""), minimum=1)
    if at_step is None:
        return "choose the step to re-run from", "", None
    reason = _text(request, "reason")
    return (lambda: journal.fork(run.id, at_step, actor=actor, reason=reason)), reason, \
        lambda new_id: f"re-running from step {at_step}"


def _do_fork_state(request, run, actor):
    """Fork from step N with an edited explicit state (LangGraph's ``update_state`` on a past checkpoint):
    sent only with the "use an edited state" box ticked; the textarea's pre-filled state alone never is."""
    import journal

    at_step = parse_int(request.POST.get("at_step", ""), minimum=1)
    if at_step is None:
        return "choose the step to fork from", "", None
    if request.POST.get("edit_state") != "on":
        return "tick \"use an edited state\" to fork with the state below, or re-run from the step instead", "", None
    if not request.POST.get("state", "").strip():
        return "the edited state is empty: write the JSON object ctx.state should hold, or re-run instead", "", None
    state, error = parse_json_field(request.POST.get("state", ""), "the edited state")
    if error:
        return error, "", None
    if not isinstance(state, dict):
        return "the edited state must be a JSON object ({...}): it is what ctx.state returns", "", None
    reason = _text(request, "reason")
    return (lambda: journal.fork(run.id, at_step, state=state, actor=actor, reason=reason)), reason, \
        lambda new_id: f"forked at step {at_step} with an edited state"


def _do_fork_thread(request, run, actor):
    """Fork a LangGraph run from a checkpoint of its thread with edited channel values (update_state on
    a copy of the thread); sent only with its box ticked, never from the pre-filled values alone."""
    import journal

    checkpoint_id = _text(request, "checkpoint_id", 255)
    if not checkpoint_id:
        return "choose the checkpoint to fork from", "", None
    if request.POST.get("edit_thread") != "on":
        return "tick \"use these edited values\" to fork with the values below", "", None
    values, error = parse_json_field(request.POST.get("values", ""), "the edited values")
    if error:
        return error, "", None
    if not isinstance(values, dict):
        return "the edited values must be a JSON object of channel -> value", "", None
    as_node = _text(request, "as_node", 255) or None
    reason = _text(request, "reason")
    return (lambda: journal.fork_thread(run.id, checkpoint_id, values, as_node=as_node, actor=actor,
                                        reason=reason)), reason, \
        lambda new_id: f"forked the thread at checkpoint {checkpoint_id} with edited state"


def _do_whatif(request, run, actor):
    """Re-run from a model-call step with another model (or other parameters): the same history up to
    that step, then every model call on the new choice; the new run opens beside its parent."""
    at_step = parse_int(request.POST.get("at_step", ""), minimum=1)
    if at_step is None:
        return "choose the model-call step to re-run from", "", None
    model, used = _text(request, "model", 200), _text(request, "used_model", 200)
    if model and model not in model_choices(used):
        return f"{model!r} is not one of the configured models", "", None
    params: dict[str, Any] = {}
    raw = _text(request, "temperature", 20)
    if raw:
        try:
            temperature = float(raw)
        except ValueError:
            temperature = -1.0
        if not 0.0 <= temperature <= 2.0:
            return "temperature must be a number from 0 to 2", "", None
        params["temperature"] = temperature
    if model == used:
        model = ""  # the same model: only the parameters change
    if not model and not params:
        return "choose another model or a temperature: otherwise this is a plain re-run", "", None
    reason = _text(request, "reason")

    def call():
        return fork_with_model(run.id, at_step, model=model or None, params=params or None, actor=actor)

    return call, reason, lambda new_id: f"what-if from step {at_step}: {model or 'the same model'} {params or ''}"


def _do_replay_check(request, run, actor):
    import journal

    def describe(check) -> str:
        if getattr(check, "ok", False):
            return "replay check passed: the code reproduces every recorded step"
        d = getattr(check, "divergence", None)
        if d is None:
            return "replay check failed"
        return f"diverges at step {d.position}: expected {d.expected}, got {d.got}"

    return (lambda: journal.replay_check(run.id)), "", describe


ACTIONS: dict[str, Callable] = {
    "cancel": _do_cancel,
    "pause": _simple("pause", "paused: no worker will advance it until unpaused"),
    "unpause": _simple("unpause", "unpaused"),
    "resume": _simple("resume", "resumed"),
    "retry": _simple("retry", "retry scheduled"),
    "compensate": _simple("compensate", "compensation started"),
    "signal": _do_signal,
    "resolve_effect": _do_resolve,
    "fork": _do_fork,
    "rerun": _do_rerun,
    "fork_state": _do_fork_state,
    "fork_thread": _do_fork_thread,
    "whatif": _do_whatif,
    "replay_check": _do_replay_check,
}


@require_POST
@operator_required
def run_action(request: HttpRequest, run_id, action: str) -> HttpResponse:
    builder = ACTIONS.get(action)
    if builder is None:
        raise Http404(f"no action named {action!r}")
    run = get_run_or_404(run_id)
    actor = request.user.get_username()
    call, comment, describe = builder(request, run, actor)
    if describe is None:  # the form itself was wrong: nothing was called, nothing to audit
        outcome = Outcome(False, call)
    else:
        outcome = perform(request, action, call, run_id=run.id, comment=comment, describe=describe)
    new_run = str(outcome.value) if outcome.ok and action in FORKS else ""
    # A what-if opens beside its parent: the compare view, model answers, tokens and cost side by side.
    target = (f"{reverse('run_compare')}?a={run.id}&b={new_run}" if action == "whatif"
              else reverse("run_detail", args=[new_run])) if new_run else ""
    if request.htmx:
        response = render(request, "runs/detail.html#action_result",
                          {"run": run, "outcome": outcome, "action": action, "new_run": new_run})
        if new_run:
            response["HX-Redirect"] = target
        elif outcome.ok and action not in ("replay_check",):
            response["HX-Trigger"] = "run-changed"
        return response
    (messages.success if outcome.ok else messages.error)(request, outcome.message)
    return redirect(target or reverse("run_detail", args=[run.id]))
