"""Runtime models, one module per concern (harness, session, sandbox, checkpoint, trace) plus runs and effects."""

from journal.models.approvals import OPEN_APPROVAL_STATUSES, Approval, ApprovalDecision, ApprovalStatus
from journal.models.checkpoint import Blob, Checkpoint, CheckpointDecision
from journal.models.effects import EffectStatus, SideEffect
from journal.models.erasure import MARKER_TEXT, Erasure, run_erased
from journal.models.harness import AgentPause, Harness, Worker, WorkerKind
from journal.models.langgraph import LangGraphChannel, LangGraphCheckpoint, LangGraphWrite
from journal.models.retention import RetentionRule
from journal.models.run import LIVE_STATUSES, TERMINAL_STATUSES, Run, RunStatus
from journal.models.sandbox import Sandbox, SandboxCommand
from journal.models.search import RunStep, step_name_keys
from journal.models.session import AppendOnlyError, EventKind, SessionEvent
from journal.models.signals import Signal
from journal.models.trace import SpanKind, TraceSpan

__all__ = [
    "AgentPause",
    "Approval",
    "ApprovalDecision",
    "ApprovalStatus",
    "OPEN_APPROVAL_STATUSES",
    "AppendOnlyError",
    "Blob",
    "Checkpoint",
    "CheckpointDecision",
    "EffectStatus",
    "Erasure",
    "EventKind",
    "Harness",
    "LIVE_STATUSES",
    "MARKER_TEXT",
    "LangGraphChannel",
    "LangGraphCheckpoint",
    "LangGraphWrite",
    "RetentionRule",
    "Run",
    "RunStatus",
    "RunStep",
    "Sandbox",
    "SandboxCommand",
    "SessionEvent",
    "SideEffect",
    "Signal",
    "SpanKind",
    "TERMINAL_STATUSES",
    "TraceSpan",
    "Worker",
    "WorkerKind",
    "run_erased",
    "step_name_keys",
]
