"""The one small family of errors every part of gatewayscope raises.

Each carries a human sentence (``str(err)``) that says what went wrong and, where
there is one, what to do about it. Views print that sentence; they never print a
traceback for one of these.
"""

from __future__ import annotations


class GatewayscopeError(Exception):
    """Base class: ``str(err)`` is a complete sentence for the user."""

    #: short machine-readable category, used in JSON output and metrics-free logs
    kind = "error"


class ConfigError(GatewayscopeError):
    """The configuration (file, flags or env) is wrong. ``problems`` holds one line each."""

    kind = "config"

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class SourceError(GatewayscopeError):
    """A gateway or store could not be read (or written)."""

    kind = "source"


class UnreachableError(SourceError):
    """Nothing answered: connection refused, DNS failure, reset before an answer."""

    kind = "unreachable"


class GatewayTimeoutError(SourceError):
    """The gateway did not answer within its timeout."""

    kind = "timeout"


class BadResponseError(SourceError):
    """The gateway answered, but with something that is not what its API returns (garbage JSON, wrong shape)."""

    kind = "bad_response"


class HTTPStatusError(SourceError):
    """The gateway answered with an error status. ``status`` and ``message`` come from its error envelope."""

    kind = "http_status"

    def __init__(self, status: int, message: str, *, url: str = "") -> None:
        self.status = status
        self.message = message
        self.url = url
        where = f" from {url}" if url else ""
        super().__init__(f"HTTP {status}{where}: {message}")


class AuthError(HTTPStatusError):
    """401/403: the credentials are missing or wrong."""

    kind = "auth"


class NotFoundError(HTTPStatusError):
    """404: the subject does not exist."""

    kind = "not_found"


class StoreError(SourceError):
    """A SQLite trace store file could not be used (missing, not a trace store, locked)."""

    kind = "store"


class PlanError(GatewayscopeError):
    """A plan file is unreadable, tampered with, or cannot be applied as asked."""

    kind = "plan"


class RedirectError(BadResponseError):
    """The gateway answered with a redirect (3xx). gatewayscope follows none: a target's URL is the API itself.

    ``status`` is the answer's status and ``location`` its ``Location`` header made safe to print (control
    characters removed), or None when it had none.
    """

    kind = "redirect"

    def __init__(self, message: str, *, status: int, location: str | None) -> None:
        self.status = status
        self.location = location
        super().__init__(message)


class BodyTooLargeError(BadResponseError):
    """The gateway's answer is larger than the target's ``max_body_bytes``; reading stopped at the cap.

    ``limit`` is that cap in bytes.
    """

    kind = "too_large"

    def __init__(self, message: str, *, limit: int) -> None:
        self.limit = limit
        super().__init__(message)


class UnaddressableSessionError(SourceError):
    """A session id no request to the rLLM gateway's REST API can name (it holds a ``/``).

    The gateway decodes ``%2F`` back to ``/`` before it routes a request, so ``/sessions/{id}`` never
    matches such an id; it can be read and deleted only in the SQLite store itself.
    """

    kind = "unaddressable"
