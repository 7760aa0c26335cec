"""The engine's errors.

Every ordinary engine error derives from DurableError and says what to do about it.
Control-flow signals (Cancelled, and the internal Suspend/LeaseLost) derive from
BaseException so workflow code that catches Exception cannot swallow them.
"""


class DurableError(Exception):
    """Base class of every engine error a caller may catch."""


class WorkflowDefinitionError(DurableError):
    """A decorator was used in a way the engine cannot make durable (raised at import time)."""


class UnknownAgentError(DurableError, LookupError):
    def __init__(self, name: str, known: list[str] | None = None):
        self.name = name
        hint = f"; registered agents: {', '.join(sorted(known))}" if known else ""
        super().__init__(
            f"no agent named {name!r} is registered{hint}. Agents are discovered from each installed app's "
            "agents.py and from DURABLE_AGENT_MODULES."
        )


class BadArgumentsError(DurableError, TypeError):
    """The arguments do not fit the workflow's signature."""


class SerializationError(DurableError, TypeError):
    """A value the journal must record is not JSON (arguments, results, signal payloads, outputs)."""


class PayloadTooLargeError(DurableError, ValueError):
    """A payload exceeds DURABLE_MAX_PAYLOAD_BYTES."""


class RunNotFoundError(DurableError, LookupError):
    pass


class RunStateError(DurableError):
    """An action that the run's current state does not allow (it changes nothing)."""


class SignalError(DurableError, ValueError):
    """A signal was refused: unknown name, finished run, malformed payload."""


class NondeterminismError(DurableError):
    """The workflow's code no longer makes the calls its journal recorded.

    The run is put in needs_attention instead of being mis-replayed; deploy code that makes
    the same calls (or branch with ctx.patched()) and resume it.
    """

    def __init__(self, position: int, expected: str, got: str, detail: str = ""):
        self.position = position
        self.expected = expected
        self.got = got
        msg = f"non-determinism at step {position}: the journal recorded {expected}, the code now calls {got}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class StepError(DurableError):
    """A step failed past its retries. Raised the same way live and on replay, so replay stays deterministic."""

    def __init__(self, step_name: str, error_type: str, message: str, attempts: int = 1):
        self.step_name = step_name
        self.error_type = error_type
        self.message = message
        self.attempts = attempts
        super().__init__(f"step {step_name} failed after {attempts} attempt(s): {error_type}: {message}")


class EffectInDoubtError(DurableError):
    """An effect started but its outcome was never recorded; an operator must decide."""


class WaitTimeout(DurableError, TimeoutError):
    """A wait for a signal or approval reached its timeout without an answer."""


class Cancelled(BaseException):  # noqa: N818 - a control-flow signal, like KeyboardInterrupt
    """The run was cancelled; raised at the next step boundary."""


class Suspend(BaseException):  # noqa: N818
    """Internal: unwinds the workflow so the run can wait without holding a thread."""

    def __init__(self, waiting_for: dict, wake_at=None):
        self.waiting_for = waiting_for
        self.wake_at = wake_at
        super().__init__(waiting_for)


class LeaseLost(BaseException):  # noqa: N818
    """Internal: this worker no longer holds the run (another claimed it); stop without writing."""


class DatabaseUnavailable(BaseException):  # noqa: N818
    """Internal: the engine's own database calls failed past their retries (a restart, a lost connection).

    Not the workflow's failure: the driving thread gives the run back without recording anything and the
    worker waits for the database (see ``journal.store.outage``). A BaseException so that workflow code
    catching ``Exception`` around a step cannot swallow it.
    """


class Released(BaseException):  # noqa: N818
    """Internal: the worker gives the run back (shutdown or pause) at a step boundary."""

    def __init__(self, reason: str = ""):
        self.reason = reason
        super().__init__(reason)


class NeedsAttention(BaseException):  # noqa: N818
    """Internal: stop the run and hand it to an operator, with the reason they will read."""

    def __init__(self, reason: str, **details):
        self.reason = reason
        self.details = details
        super().__init__(reason)


class ApprovalError(DurableError):
    """A decision was refused (closed approval, second vote, wrong role); nothing was recorded."""


class ApprovalNotFoundError(ApprovalError, LookupError):
    pass


class ApprovalClosedError(ApprovalError):
    """The approval was already decided or expired."""


class DuplicateVoteError(ApprovalError):
    """This person already voted on this approval."""


class ApprovalPermissionError(ApprovalError, PermissionError):
    """The actor does not hold the role the approval asks for."""
