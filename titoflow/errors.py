"""titoflow's one error hierarchy. Wire adapters map each to their API's status and body."""

from __future__ import annotations

from typing import Any


class IngressError(Exception):
    status = 500
    code = "internal_error"
    retryable = False

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def details(self) -> dict[str, Any]:
        """Fields beyond the message that the error body carries (machine-readable)."""
        return {}


class InvalidRequest(IngressError):
    status = 400
    code = "invalid_request"


class MissingSession(InvalidRequest):
    code = "missing_session"


class TemplateError(InvalidRequest):
    code = "template_error"


class ContextOverflow(InvalidRequest):
    code = "context_length_exceeded"

    def __init__(self, message: str, prompt_tokens: int = 0, limit: int = 0) -> None:
        super().__init__(message, "messages")
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class SessionStepLimit(InvalidRequest):
    code = "session_step_limit"


class UnknownModel(IngressError):
    status = 404
    code = "model_not_found"


class PayloadTooLarge(IngressError):
    status = 413
    code = "request_too_large"


class NotFound(IngressError):
    status = 404
    code = "not_found"


class EngineError(IngressError):
    """The engine answered, but not with a generation (a bug or a config mismatch)."""

    status = 502
    code = "engine_error"


class Unavailable(IngressError):
    """A dependency is down: the client should retry."""

    status = 503
    code = "unavailable"
    retryable = True


class EngineUnavailable(Unavailable):
    code = "engine_unavailable"


class PublishFailed(Unavailable):
    code = "broker_unavailable"


class TrajectoryVersionChanged(IngressError):
    """Partial rollout is off and the weights changed since the session's first step: its next
    step would mix versions in one trajectory. Not retryable: start a new session."""

    status = 409
    code = "trajectory_version_changed"

    def __init__(self, message: str, first_version: str, current_version: str) -> None:
        super().__init__(message, "weight_version")
        self.first_version = first_version
        self.current_version = current_version


class SessionAlreadyEnded(IngressError):
    """A finalize or discard of a session that already ended: the first end stands."""

    status = 409
    code = "session_ended"

    def __init__(self, message: str, how: str, ended_at: float) -> None:
        super().__init__(message)
        self.how = how
        self.ended_at = ended_at

    def details(self) -> dict[str, Any]:
        return {"ended": {"how": self.how, "at": self.ended_at}}


class Paused(Unavailable):
    """Generation is paused (a weight update) and did not resume within the hold time."""

    code = "paused"


class Unauthorized(IngressError):
    status = 401
    code = "unauthorized"


class Forbidden(IngressError):
    """A valid credential used beyond what it covers (another session's routes)."""

    status = 403
    code = "forbidden"
