"""The API's endpoints: thin wrappers that check the caller, then call journal's public functions."""

from __future__ import annotations

import json
from datetime import timedelta
from uuid import UUID

from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from ninja import NinjaAPI
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
from journal.models import Approval, Run
from journal.operations.approvals import (
    ApprovalClosedError,
    ApprovalError,
    ApprovalNotFoundError,
    ApprovalPermissionError,
    DuplicateVoteError,
    get_approval,
    pending_approvals,
)
from runs.api.auth import TOLERANCE_SECONDS, ApiError, TokenAuth, require_scope, verify_webhook
from runs.api.schemas import (
    ApprovalOut,
    DecisionIn,
    ErrorOut,
    RunOut,
    SignalIn,
    SignalOut,
    StartRunIn,
    WebhookSignalIn,
)
from runs.models import WebhookDelivery

api = NinjaAPI(title="durable-ui API", version="1", urls_namespace="api", auth=TokenAuth(),
               description="Start runs, read their status, send signals and decide approvals. Bearer tokens "
                           "carry scopes (runs:start, runs:read, signals:send, approvals:decide); outside "
                           "systems send signals through HMAC-signed webhooks.")

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
    list in "detail", a shape the schema never declared; here it is the documented one."""
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
            "parent_id": str(run.parent_id) if run.parent_id else None, "steps": run.steps}


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

