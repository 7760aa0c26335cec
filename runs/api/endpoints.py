"""The API's endpoints: thin wrappers that check the caller, then call journal's public functions."""

from __future__ import annotations

import json
from datetime import timedelta
from enum import Enum
from uuid import UUID

from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.utils import timezone
from ninja import NinjaAPI, Path, Query
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError

try:
    from ninja import Status
except ImportError:  # django-ninja before Status(): the (code, body) tuple it replaced

    def Status(code: int, value):  # noqa: N802
        return code, value
from pydantic import ValidationError as PydanticValidationError

import journal
from journal import (
    BadArgumentsError,
    DurableError,
    PayloadTooLargeError,
    RunNotFoundError,
    RunStateError,
    SerializationError,
    SignalError,
    UnknownAgentError,
)
from journal.models import Approval, Run, RunStatus, SessionEvent
from journal.operations.approvals import (
    ApprovalClosedError,
    ApprovalError,
    ApprovalNotFoundError,
    ApprovalPermissionError,
    DuplicateVoteError,
    get_approval,
    pending_approvals,
)
from runs import queries
from runs.api.auth import TOLERANCE_SECONDS, ApiError, TokenAuth, require_scope, verify_webhook
from runs.api.docs import LocalSwagger
from runs.api.schemas import (
    UNSTORABLE,
    ApprovalOut,
    DecisionIn,
    ErrorOut,
    EventPageOut,
    ForkIn,
    ReasonIn,
    ReplayCheckOut,
    ResolveIn,
    RunOut,
    RunPageOut,
    SignalIn,
    SignalOut,
    StartRunIn,
    StepStateOut,
    WebhookSignalIn,
)
from runs.models import AuditEntry, WebhookDelivery
from runs.validation import unstorable_text

api = NinjaAPI(title="durable-ui API", version="1", urls_namespace="api", auth=TokenAuth(), docs=LocalSwagger(),
               description="Everything the dashboard does: start, list and search runs, read a run's journal "
                           "page by page and its state at any step, send signals, decide approvals, cancel, "
                           "pause, unpause, retry, resume, compensate, fork or re-run from a step, replay-check, "
                           "resolve an in-doubt effect. Bearer tokens carry scopes: runs:read, runs:start, "
                           "runs:act (cancel, pause, unpause, retry, resume, compensate), runs:fork (fork, "
                           "replay-check), effects:resolve, signals:send, approvals:decide. Every action is "
                           "recorded with the token's actor, in the run's journal and in the audit log. Outside "
                           "systems send signals through HMAC-signed webhooks. Errors are always "
                           '{"detail": str, "code": str}; a run in a state that does not allow the action '
                           "is 409 with code \"conflict\".")

# Every error any operation can answer, all in the one documented shape {"detail": str, "code": str}:
# declared on each operation, so a client (and schemathesis) can rely on the schema for errors too.
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 413: ErrorOut, 422: ErrorOut}

# Engine errors -> HTTP status. Order matters: the first matching class wins.
_STATUS = (
    (UnknownAgentError, 404),
    (RunNotFoundError, 404),
    (ApprovalNotFoundError, 404),
    (ApprovalPermissionError, 403),
    (ApprovalClosedError, 409),
    (DuplicateVoteError, 409),
    (RunStateError, 409),
    (PayloadTooLargeError, 413),
    (BadArgumentsError, 400),
    (SerializationError, 400),
    (SignalError, 400),
    (ApprovalError, 400),
    (DurableError, 400),
)


def _error(request: HttpRequest, status: int, message: str, code: str = "") -> HttpResponse:
    return api.create_response(request, {"detail": message, "code": code or ApiError(status, "").code},
                               status=status)


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return _error(request, exc.status, exc.message, exc.code)


@api.exception_handler(NinjaValidationError)
def _invalid_request(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    """A body, path or query value that does not fit the schema. Ninja's own answer is a 422 with a
    list in "detail", a shape the schema never declared; here it is the documented one. A value that
    fits the schema but no database can store (NUL, a lone surrogate, NaN) is bad input: 400, as the
    engine answers the same value from Python (SerializationError)."""
    if exc.errors and all(UNSTORABLE in str(e.get("msg", "")) for e in exc.errors):
        return _error(request, 400, validation_message(exc.errors), "bad_request")
    return _error(request, 422, validation_message(exc.errors), "invalid")


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    """Ninja's own refusals (401 from the bearer check, ...) in the documented shape too."""
    return _error(request, exc.status_code, str(exc))


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _error(request, 404, "not found")


def validation_message(errors: list[dict]) -> str:
    """'body.agent: Field required; query.limit: ...': where each problem is, then what it is.

    Ninja repeats the parameter group in the location ("body", "body", "agent"); once is enough.
    """
    parts = []
    for e in errors[:20]:
        loc = [str(p) for p in e.get("loc", ())]
        if len(loc) > 1 and loc[0] == loc[1]:
            loc = loc[1:]
        parts.append(f"{'.'.join(loc) or 'request'}: {e.get('msg', 'invalid')}")
    return "; ".join(parts) or "the request does not match the schema"


@api.exception_handler(DurableError)
def _engine_error(request: HttpRequest, exc: DurableError) -> HttpResponse:
    status = next(code for cls, code in _STATUS if isinstance(exc, cls))
    return _error(request, status, str(exc))


def _run_out(run: Run) -> dict:
    return {"run_id": str(run.id), "agent": run.agent, "version": run.version, "status": run.status,
            "created_at": run.created_at, "started_at": run.started_at, "finished_at": run.finished_at,
            "output": run.output, "error": run.error, "waiting_for": run.waiting_for, "wake_at": run.wake_at,
            "parent_id": str(run.parent_id) if run.parent_id else None, "steps": run.steps, "paused": run.paused,
            "attention_reason": run.attention_reason,
            "forked_from": str(run.forked_from_id) if run.forked_from_id else None, "fork_step": run.fork_step}


def _approval_out(approval: Approval) -> dict:
    return {"approval_id": str(approval.id), "run_id": str(approval.run_id), "agent": approval.run.agent,
            "position": approval.position, "prompt": approval.prompt, "context": approval.context,
            "role": approval.role, "quorum": approval.quorum, "status": approval.status,
            "requested_at": approval.requested_at, "expires_at": approval.expires_at,
            "decisions": [{"approver": d.approver, "approved": d.approved, "comment": d.comment,
                           "edited": d.edited, "decided_at": d.decided_at} for d in approval.decisions.all()]}


def _signal(run_id: UUID, body: SignalIn, actor: str) -> dict:
    run = journal.get_run(run_id)
    if run.is_terminal:
        raise ApiError(409, f"run {run.id} is {run.status}; it accepts no more signals")
    sig = journal.signal(run.id, body.name, body.payload, actor=actor, signal_id=body.signal_id)
    return {"run_id": str(run.id), "name": sig.name, "signal_id": sig.signal_id, "accepted_at": sig.created_at,
            "consumed": sig.consumed_at is not None}


@api.post("/runs", response={201: RunOut, **ERRORS}, tags=["runs"], summary="Start a run")
def start_run(request: HttpRequest, body: StartRunIn):
    token = require_scope(request, "runs:start")
    run_id = journal.start_run(body.agent, body.args, body.kwargs, actor=token.actor)
    return Status(201, _run_out(journal.get_run(run_id)))


@api.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, tags=["runs"], summary="A run's status")
def get_run(request: HttpRequest, run_id: UUID):
    require_scope(request, "runs:read")
    return Status(200, _run_out(journal.get_run(run_id)))


@api.post("/runs/{run_id}/signals", response={202: SignalOut, **ERRORS}, tags=["signals"],
          summary="Send a signal (buffered if the run is not waiting yet)")
def send_signal(request: HttpRequest, run_id: UUID, body: SignalIn):
    token = require_scope(request, "signals:send")
    return Status(202, _signal(run_id, body, token.actor))


@api.get("/approvals", response={200: list[ApprovalOut], **ERRORS}, tags=["approvals"],
         summary="Pending approvals, oldest first")
def list_approvals(request: HttpRequest, limit: int = 100):
    require_scope(request, "runs:read")
    limit = max(1, min(limit, 500))
    return Status(200, [_approval_out(a) for a in pending_approvals().prefetch_related("decisions")[:limit]])


@api.get("/approvals/{approval_id}", response={200: ApprovalOut, **ERRORS}, tags=["approvals"])
def approval_detail(request: HttpRequest, approval_id: UUID):
    require_scope(request, "runs:read")
    return Status(200, _approval_out(get_approval(approval_id)))


@api.post("/approvals/{approval_id}/decision", response={200: ApprovalOut, **ERRORS}, tags=["approvals"],
          summary="Approve or reject")
def decide(request: HttpRequest, approval_id: UUID, body: DecisionIn):
    token = require_scope(request, "approvals:decide")
    journal.decide(approval_id, approved=body.approved, actor=token.actor, actor_roles=set(token.roles),
                   comment=body.comment, edited=body.edited)
    return Status(200, _approval_out(get_approval(approval_id)))


@api.post("/webhooks/{endpoint}/signal", auth=None, response={202: SignalOut, **ERRORS},
          tags=["webhooks"], summary="Signal a run from an outside system (HMAC-signed)",
          openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
              "schema": WebhookSignalIn.model_json_schema()}}}})
def webhook_signal(request: HttpRequest, endpoint: str):
    """The signature is checked before the body is parsed, so a forged delivery learns nothing."""
    hook, delivery_id = verify_webhook(request, endpoint)
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body is not valid JSON") from None
    try:
        body = WebhookSignalIn.model_validate(data)
    except PydanticValidationError as exc:
        raise ApiError(422, validation_message(exc.errors())) from None
    if hook.signals and body.name not in hook.signals:
        raise ApiError(403, f"webhook {hook.name!r} may not send the signal {body.name!r}")
    try:
        with transaction.atomic():  # the delivery is remembered only if the signal is accepted
            WebhookDelivery.objects.create(endpoint=hook, delivery_id=delivery_id, run_id=body.run_id)
            result = _signal(body.run_id, body, hook.actor)
    except IntegrityError:
        raise ApiError(409, "this delivery was already received (replay refused)", "replayed") from None
    # Deliveries older than the timestamp window are refused as expired anyway: forget them.
    WebhookDelivery.objects.filter(received_at__lt=timezone.now() - timedelta(seconds=2 * TOLERANCE_SECONDS)).delete()
    return Status(202, result)



# -- what the dashboard does: list, read the journal, time travel, operator actions ---------------------------

INT_LIMIT = 2**63 - 1  # what both databases' 64-bit columns compare against
SORT_KEYS = tuple(f"{sign}{key}" for key in queries.SORTS for sign in ("-", ""))
RunStatusName = Enum("RunStatusName", {s: s for s in RunStatus.values}, type=str)  # the schema lists them
SortKey = Enum("SortKey", {s.replace("-", "desc_") if s.startswith("-") else s: s for s in SORT_KEYS}, type=str)


def _text_param(value: str, name: str) -> str:
    problem = unstorable_text(value)
    if problem:
        raise ApiError(422, f"query.{name}: {problem}", "invalid")
    return value


def _run_summary(run: Run) -> dict:
    return {"run_id": str(run.id), "agent": run.agent, "version": run.version, "status": run.status,
            "paused": run.paused, "steps": run.steps, "progress": run.progress, "tokens": run.tokens,
            "cost": float(run.cost), "created_at": run.created_at, "started_at": run.started_at,
            "finished_at": run.finished_at, "error": run.error, "attention_reason": run.attention_reason,
            "parent_id": str(run.parent_id) if run.parent_id else None,
            "forked_from": str(run.forked_from_id) if run.forked_from_id else None}


@api.get("/runs", response={200: RunPageOut, **ERRORS}, tags=["runs"], summary="List and search runs",
         description="The runs page's filters: status (repeatable), agent, version, since/until (a date "
                     "YYYY-MM-DD or a time, on created_at; until includes its whole day), q (text in the input, "
                     "output or error, or a run id), sort. Keyset pages: pass the answer's `next` as `cursor`.")
def list_runs(request: HttpRequest, status: list[RunStatusName] = Query(None), agent: str = Query("", max_length=200),
              version: str = Query("", max_length=64), since: str = Query("", max_length=40),
              until: str = Query("", max_length=40), q: str = Query("", max_length=200),
              sort: SortKey = Query(SortKey(queries.DEFAULT_SORT)), cursor: str = Query("", max_length=1000),
              limit: int = Query(50, ge=1, le=200)):
    require_scope(request, "runs:read")
    for name, value in (("agent", agent), ("version", version), ("since", since), ("until", until), ("q", q),
                        ("cursor", cursor)):
        _text_param(value, name)
    params = QueryDict(mutable=True)
    params.setlist("status", [s.value for s in status or ()])
    params.update({"agent": agent, "version": version, "since": since, "until": until, "q": q, "sort": sort.value})
    f = queries.RunFilter.from_query(params)
    if f.errors:
        raise ApiError(400, "; ".join(f.errors))
    try:
        page = queries.runs_page(f, after=cursor, size=limit)
    except queries.FilterError as exc:
        raise ApiError(400, f"cursor: {exc}") from None
    return Status(200, {"runs": [_run_summary(r) for r in page.runs], "next": page.next_cursor or None})


@api.get("/runs/{run_id}/events", response={200: EventPageOut, **ERRORS}, tags=["journal"],
         summary="A run's journal, page by page",
         description="Session events in order of seq, those after `after`; pass the answer's `next` as `after` "
                     "for the next page (null when there are no more yet: poll with the last seq you saw).")
def run_events(request: HttpRequest, run_id: UUID, after: int = Query(0, ge=0, le=INT_LIMIT),
               limit: int = Query(100, ge=1, le=500)):
    require_scope(request, "runs:read")
    run = journal.get_run(run_id)
    rows = list(SessionEvent.objects.filter(run_id=run.id, seq__gt=after).order_by("seq")
                .values("seq", "kind", "position", "step_name", "actor", "created_at", "payload")[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Status(200, {"run_id": str(run.id), "events": rows, "next": rows[-1]["seq"] if more else None})


def _require_steps(run: Run, what: str) -> None:
    """Forks, replay checks and the stepper need a journal: a run with none yet is in the wrong state (409)."""
    if not run.steps:
        raise RunStateError(f"run {run.id} is {run.status} and has no recorded steps yet: nothing to {what}")


@api.get("/runs/{run_id}/steps/{n}", response={200: StepStateOut, **ERRORS}, tags=["journal"],
         summary="The run as it stood after step n",
         description="What the stepper shows: the step's record, its result (or error), the explicit agent state "
                     "and sandbox files (path -> sha256) after it, and the diff against step n-1. 404 for a step "
                     "the run has not recorded; 409 for a run with no recorded steps yet.")
def step_state(request: HttpRequest, run_id: UUID, n: int = Path(..., ge=1, le=INT_LIMIT)):
    require_scope(request, "runs:read")
    run = journal.get_run(run_id)
    _require_steps(run, "show")
    try:
        s = journal.state_at(run.id, n)
    except BadArgumentsError as exc:  # past the last recorded step
        raise ApiError(404, str(exc)) from None
    record = {k: v for k, v in s.record.items() if k != "payload"}
    return Status(200, {"run_id": str(run.id), "position": s.position, "total": s.total, "record": record,
                        "result": record.get("result"), "error": record.get("error"), "state": s.state,
                        "files": s.files, "diff": s.diff})


def _audited(request: HttpRequest, scope: str, action: str, run_id: UUID, call, *, comment: str = "",
             describe=None):
    """Check the scope, find the run (404 before anything is recorded), call the engine, and write the same
    audit entry the dashboard writes (runs.views.common.perform), refused or not, with the token's actor."""
    token = require_scope(request, scope)
    run = journal.get_run(run_id)
    try:
        value = call(run, token.actor)
    except DurableError as exc:
        AuditEntry.objects.create(actor=token.actor, action=action, run_id=run.id, target="api", comment=comment,
                                  ok=False, result=str(exc)[:4000])
        raise
    message = describe(value) if describe else f"{action}: done"
    AuditEntry.objects.create(actor=token.actor, action=action, run_id=run.id, target="api", comment=comment,
                              ok=True, result=message[:4000])
    return value


def _reason(body: ReasonIn | None) -> str:
    return body.reason.strip() if body is not None else ""


def _operator_action(name: str, status: int, summary: str, message: str):
    """POST /runs/{run_id}/<name>: journal.<name>(run_id, actor=, reason=), scope runs:act."""

    def endpoint(request: HttpRequest, run_id: UUID, body: ReasonIn | None = None):
        reason = _reason(body) or ("cancelled through the API" if name == "cancel" else "")

        def call(run, actor):
            if name == "cancel":  # journal.cancel takes the reason positionally
                return journal.cancel(run.id, reason, actor=actor)
            return getattr(journal, name)(run.id, actor=actor, reason=reason)

        run = _audited(request, "runs:act", name, run_id, call, comment=reason, describe=lambda r: message)
        return Status(status, _run_out(run))

    endpoint.__name__ = f"{name}_run"
    api.post(f"/runs/{{run_id}}/{name}", response={status: RunOut, **ERRORS}, tags=["actions"], summary=summary,
             operation_id=f"{name}_run")(endpoint)


_operator_action("cancel", 202, "Cancel a run (at once if idle, else at its next step boundary)",
                 "cancel requested")
_operator_action("pause", 202, "Pause a run (a running one lets go at its next step boundary)",
                 "paused: no worker will advance it until unpaused")
_operator_action("unpause", 200, "Unpause a paused run", "unpaused")
_operator_action("retry", 202, "Retry a failed or needs_attention run from its failure point", "retry scheduled")
_operator_action("resume", 202, "Resume a needs_attention run as it stands", "resumed")
_operator_action("compensate", 202, "Undo a failed, cancelled or needs_attention run's effects (newest first)",
                 "compensation started")


@api.post("/runs/{run_id}/fork", response={201: RunOut, **ERRORS}, tags=["actions"],
          summary="Fork a run at a step: re-run from it, with an edited result, or with an edited state",
          description="A new run reuses the parent's results before at_step and continues live from there; with "
                      "`override`, step at_step's result is that value instead (a what-if); with `state`, the "
                      "workflow's explicit state is that object when step at_step begins. The parent is not "
                      "changed. 400 for a step the run has not recorded; 409 for a run with no steps yet.")
def fork_run(request: HttpRequest, run_id: UUID, body: ForkIn):
    def call(run, actor):
        _require_steps(run, "fork from")
        return journal.fork(run.id, body.at_step, override=body.override, state=body.state, actor=actor,
                            reason=body.reason)

    new_id = _audited(request, "runs:fork", "fork", run_id, call, comment=body.reason,
                      describe=lambda new: f"forked at step {body.at_step}: {new}")
    return Status(201, _run_out(journal.get_run(new_id)))


@api.post("/runs/{run_id}/replay-check", response={200: ReplayCheckOut, **ERRORS}, tags=["actions"],
          summary="Replay the run's journal against the current code; report the first divergence",
          description="Nothing executes and nothing is written to the run. 409 for a run with no steps yet.")
def replay_check_run(request: HttpRequest, run_id: UUID):
    def call(run, actor):
        _require_steps(run, "check")
        return journal.replay_check(run.id)

    def describe(check) -> str:
        if check.ok:
            return "replay check passed: the code reproduces every recorded step"
        return f"diverges at {check.divergence}" if check.divergence else f"replay check failed: {check.outcome}"

    check = _audited(request, "runs:fork", "replay_check", run_id, call, describe=describe)
    d = check.divergence
    return Status(200, {"run_id": str(check.run_id), "ok": check.ok, "checked": check.checked,
                        "recorded": check.recorded, "outcome": check.outcome,
                        "divergence": None if d is None else {"position": d.position, "expected": str(d.expected),
                                                              "got": str(d.got), "detail": d.detail}})


@api.post("/runs/{run_id}/effects/{position}/resolve", response={202: RunOut, **ERRORS}, tags=["actions"],
          summary="Resolve an in-doubt effect of a needs_attention run",
          description="done: it happened (`result` is recorded as its result); retry: execute it once more under "
                      "the same idempotency key; skip: it did not happen and must not. The run then goes on.")
def resolve_effect(request: HttpRequest, run_id: UUID, body: ResolveIn, position: int = Path(..., ge=1, le=INT_LIMIT)):
    if body.action != "done" and body.result is not None:
        raise ApiError(400, "a result can be given only with action=done")

    def call(run, actor):
        return journal.resolve_effect(run.id, position, action=body.action, result=body.result, actor=actor,
                                      comment=body.comment)

    run = _audited(request, "effects:resolve", "resolve_effect", run_id, call, comment=body.comment,
                   describe=lambda r: f"effect at step {position} resolved: {body.action}")
    return Status(202, _run_out(run))
