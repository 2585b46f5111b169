"""The engine's error tree; HTTP-facing errors carry the OpenAI error body they become.

EngineError
├── ModelLoadError          the model cannot be found or loaded (a user's fix: install, a path)
├── EngineStartError        a child engine process died or hung during startup (launch.py)
└── RequestError            a request the server answers with an OpenAI-style 4xx
    ├── BadRequest          400: malformed JSON, wrong types, bad values, unsupported features
    ├── NotFound            404: unknown route or model
    ├── PayloadTooLarge     413
    └── Unavailable         503: the model is still loading or the engine is shutting down
"""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class ModelLoadError(EngineError):
    """The model cannot be found or loaded; the message says what to do about it."""


class EngineStartError(EngineError):
    """A child engine process died or did not become ready; the message has its stderr tail."""


class RequestError(EngineError):
    """An error answered to the client with an OpenAI-style error body."""

    status = 400
    error_type = "BadRequestError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        # vLLM puts the HTTP status in `code`; the SDKs read `message` and `type`.
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status,
            }
        }


class BadRequest(RequestError):
    status = 400
    error_type = "BadRequestError"


class NotFound(RequestError):
    status = 404
    error_type = "NotFoundError"


class PayloadTooLarge(RequestError):
    status = 413
    error_type = "RequestEntityTooLargeError"


class Unavailable(RequestError):
    status = 503
    error_type = "ServiceUnavailableError"
