"""What the proxy answers with when a request cannot be served, in the client's own dialect.

ProxyError (status, OpenAI type, code)
 ├── BadRequest            400 invalid_request_error: malformed JSON, wrong types, bad values
 ├── Unauthorized          401 authentication_error: no key, or a key of no rollout
 ├── Forbidden             403 permission_error: the key is revoked, or the rollout is finished
 │    │                      or out of budget
 │    └── StaleRollout       the rollout is further behind than its batch allows
 │                           (proxy/staleness.py)
 ├── NotFoundError         404 not_found_error: no such route or object
 ├── Conflict              409 conflict_error: the request clashes with the state it would change
 ├── PayloadTooLarge       413 invalid_request_error: body over the configured limit
 ├── Unprocessable         422 invalid_request_error: a parameter rolltap does not support
 ├── UpstreamUnavailable   503 service_unavailable: no healthy backend could take the call
 ├── StoreUnavailable      503 service_unavailable + Retry-After: the store cannot take another
 │                         call's record now (database unreachable, write queue full)
 └── UpstreamFailed        502 upstream_error: the backend failed after answering began
"""

from __future__ import annotations


class ProxyError(Exception):
    status = 500
    type = "server_error"
    anthropic_type = "api_error"
    retry_after: int | None = None
    """Seconds for a Retry-After header, for errors that pass with time."""

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    anthropic_type = "authentication_error"


class Forbidden(ProxyError):
    status = 403
    type = "permission_error"
    anthropic_type = "permission_error"


class StaleRollout(Forbidden):
    """A call refused because its rollout is further behind than its batch allows."""


class NotFoundError(ProxyError):
    status = 404
    type = "not_found_error"
    anthropic_type = "not_found_error"


class Conflict(ProxyError):
    status = 409
    type = "conflict_error"
    anthropic_type = "invalid_request_error"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    anthropic_type = "request_too_large"


class Unprocessable(ProxyError):
    status = 422
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class UpstreamUnavailable(ProxyError):
    status = 503
    type = "service_unavailable"
    anthropic_type = "overloaded_error"


class StoreUnavailable(ProxyError):
    status = 503
    type = "service_unavailable"
    anthropic_type = "overloaded_error"

    def __init__(self, message: str, *, retry_after: int, code: str = "store_unavailable"):
        super().__init__(message, code=code)
        self.retry_after = retry_after


class UpstreamFailed(ProxyError):
    status = 502
    type = "upstream_error"
    anthropic_type = "api_error"
