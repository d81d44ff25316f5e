"""titoflow's one error hierarchy: what went wrong, in domain terms, for the library, the
workers and the ingress alike.

Invariant: an error says what failed (``code``, machine-readable), which input it concerns
(``param``), whether trying again may help (``retryable``) and any further facts
(:meth:`TitoflowError.details`), and nothing about transport: no class carries an HTTP status.
The ingress maps classes to statuses and error bodies in ``ingress/wire/errors.py``, so an engine or
template error raised in a worker means the same thing there as in a request.
"""

from __future__ import annotations

from typing import Any


class TitoflowError(Exception):
    code = "internal_error"
    retryable = False
    retry_after_s = 1  # when retryable: how long a client should wait before trying again

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def details(self) -> dict[str, Any]:
        """Fields beyond the message that the error body carries (machine-readable)."""
        return {}

    @property
    def reason(self) -> str:
        """What the refusal metrics count it under: its code, or finer where a code covers
        several causes."""
        return self.code


class InvalidRequest(TitoflowError):
    code = "invalid_request"


class MissingSession(InvalidRequest):
    code = "missing_session"


class TemplateError(InvalidRequest):
    code = "template_error"


class NotAppendOnly(TemplateError):
    """The template renders the history differently once the new messages follow (e.g. it
    moves a later system message to the top): no continuation of the chain exists."""


class ContextOverflow(InvalidRequest):
    code = "context_length_exceeded"

    def __init__(self, message: str, prompt_tokens: int = 0, limit: int = 0) -> None:
        super().__init__(message, "messages")
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class SessionStepLimit(InvalidRequest):
    code = "session_step_limit"


class UnknownModel(TitoflowError):
    code = "model_not_found"


class PayloadTooLarge(TitoflowError):
    code = "request_too_large"


class NotFound(TitoflowError):
    code = "not_found"


class EngineError(TitoflowError):
    """The engine answered, but not with a generation (a bug or a config mismatch)."""

    code = "engine_error"


class Unavailable(TitoflowError):
    """A dependency is down: the client should retry."""

    code = "unavailable"
    retryable = True


class EngineUnavailable(Unavailable):
    code = "engine_unavailable"


class PublishFailed(Unavailable):
    code = "broker_unavailable"


class ImageStoreUnavailable(Unavailable):
    """An image's bytes could not be written to the image store: its step is not published."""

    code = "image_store_unavailable"


class TrajectoryVersionChanged(TitoflowError):
    """Partial rollout is off and the weights changed since the session's first step: its next
    step would mix versions in one trajectory. Not retryable: start a new session."""

    code = "trajectory_version_changed"

    def __init__(self, message: str, first_version: str, current_version: str) -> None:
        super().__init__(message, "weight_version")
        self.first_version = first_version
        self.current_version = current_version


class SessionAlreadyEnded(TitoflowError):
    """A finalize, discard, reopening or model call of a session that already ended: the
    first end stands."""

    code = "session_ended"

    def __init__(self, message: str, how: str, ended_at: float) -> None:
        super().__init__(message)
        self.how = how
        self.ended_at = ended_at

    def details(self) -> dict[str, Any]:
        return {"ended": {"how": self.how, "at": self.ended_at}}


class Overloaded(Unavailable):
    """More generations in flight than this replica (``what="replica"``) or every engine that
    could take the call (``what="engine"``) is bounded to: refused before any engine work, to be
    retried after ``retry_after_s``."""

    code = "overloaded"

    def __init__(self, message: str, what: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.what = what
        self.retry_after_s = retry_after_s

    @property
    def reason(self) -> str:
        return f"overloaded_{self.what}"


class Paused(Unavailable):
    """Generation is paused (a weight update) and did not resume within the hold time."""

    code = "paused"


class Unauthorized(TitoflowError):
    code = "unauthorized"


class Forbidden(TitoflowError):
    """A valid credential used beyond what it covers (another session's routes)."""

    code = "forbidden"


class SessionBudgetExceeded(Forbidden):
    """The session used up a budget the rollout driver set when it opened it (turns, tokens,
    wall time): its credential covers no more calls. Not retryable: no retry of the same call
    can fit; the driver ends the session."""

    code = "session_budget_exceeded"

    def __init__(self, message: str, budget: str, limit: float, used: float) -> None:
        super().__init__(message, f"budget.{budget}")
        self.budget = budget
        self.limit = limit
        self.used = used

    def details(self) -> dict[str, Any]:
        return {"budget": {"name": self.budget, "limit": self.limit, "used": self.used}}

    @property
    def reason(self) -> str:
        return f"budget_{self.budget}"
