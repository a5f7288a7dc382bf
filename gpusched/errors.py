"""One error hierarchy for the whole project; the edges (API, CLI) translate it."""

from __future__ import annotations


class GpuschedError(Exception):
    """Base of every error gpusched raises on purpose.

    ``exit_code`` is what a CLI exits with, ``http_status`` what the API answers.
    """

    exit_code = 1
    http_status = 500
    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(GpuschedError):
    """Bad input: a malformed flag, script, config or request."""

    exit_code = 2
    http_status = 400
    code = "invalid"


class ConfigError(UsageError):
    """A configuration file is missing, malformed, or has a bad value."""

    code = "config"


class NotFound(GpuschedError):
    """The named job, node or partition does not exist."""

    exit_code = 1
    http_status = 404
    code = "not_found"


class PermissionDenied(GpuschedError):
    """The caller may not do this (for example cancel another user's job)."""

    exit_code = 1
    http_status = 403
    code = "forbidden"


class AuthError(GpuschedError):
    """A credential is missing, malformed, forged, replayed or expired."""

    exit_code = 1
    http_status = 401
    code = "auth"


class Conflict(GpuschedError):
    """The object is not in a state that allows the operation."""

    exit_code = 1
    http_status = 409
    code = "conflict"


class StepBusy(Conflict):
    """A job step fits its job, but not beside the job's steps running now: it may be
    asked for again later (gsrun retries)."""

    code = "step_busy"


class LimitReached(GpuschedError):
    """A limit the site set would be passed (MaxSubmitJobs, a connection cap)."""

    exit_code = 1
    http_status = 429
    code = "limit"


class Unavailable(GpuschedError):
    """A service (controller, database) cannot be reached."""

    exit_code = 1
    http_status = 503
    code = "unavailable"


_BY_CODE = {cls.code: cls for cls in (GpuschedError, UsageError, ConfigError, NotFound,
                                     PermissionDenied, AuthError, Conflict, StepBusy,
                                     LimitReached, Unavailable)}


def from_code(code: str, message: str) -> GpuschedError:
    """Rebuild an error from the ``code`` of an API error body."""
    return _BY_CODE.get(code, GpuschedError)(message)
