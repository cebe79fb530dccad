"""OpenAI-style errors: every failure a client can cause is a JSON body naming what was wrong."""

from __future__ import annotations

from typing import Any

from ..engine.states import LOADING_STATES, EngineError


class APIError(Exception):
    """An error that becomes `{"error": {"message", "type", "param", "code"}}` with a status."""

    status = 400
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.details = details or {}  # more fields of the error object (llama.cpp's n_ctx)
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        body = error_body(self.message, self.type, self.param, self.code)
        body["error"].update(self.details)
        return body


class InvalidRequest(APIError):
    status = 400


class FieldError(ValueError):
    """A request model's rule that pydantic's types cannot state. Raised in a validator, it
    reaches the client with this message, param and code (parsing.validate unwraps it)."""

    def __init__(self, message: str, param: str, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class AuthenticationError(APIError):
    status = 401
    type = "authentication_error"


class NotFound(APIError):
    status = 404
    type = "not_found_error"


class ServerError(APIError):
    status = 500
    type = "server_error"


class NotSupported(APIError):
    """A route or action this server does not offer, with what it does instead (501)."""

    status = 501
    type = "not_supported_error"


class ServiceUnavailable(APIError):
    status = 503
    type = "service_unavailable"


def engine_unavailable(error: EngineError) -> ServiceUnavailable:
    """A model not ready for a request (loading, unloaded, failed): a 503 that says to retry."""
    code = "model_loading" if error.state in LOADING_STATES else "model_unavailable"
    return ServiceUnavailable(str(error), code=code, headers={"Retry-After": "1"})


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
