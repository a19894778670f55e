"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``, whatever went wrong.

FastAPI's own 422 validation format never reaches a client: validation errors become 400s naming
the offending field, HTTP exceptions keep their status, and anything unexpected is a 500 that
leaves the server serving.
"""

import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from graphllm.server.protocol import LONE_SURROGATE_ERROR

logger = logging.getLogger("graphllm.server")
FIELD = re.compile(r"[a-z_][a-z0-9_]*")
UNION_TAGS = frozenset({"str", "int", "float", "bool", "none"})
CLIENT_CLOSED = 499  # nginx's "client closed request": only the metrics ever see it
JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}


class OpenAIError(Exception):
    """An error to answer with; raise it anywhere below a route."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers  # e.g. Retry-After on a 503


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param, code)


def error_type(status: int) -> str:
    """OpenAI's error types (client libraries dispatch on the status; `code` says what exactly)."""
    return "invalid_request_error" if status < 500 else "server_error"


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": utf8_safe(message), "type": error_type(status), "param": utf8_safe(param),
                      "code": code}}


def utf8_safe(text: str | None) -> str | None:
    """text with what UTF-8 cannot encode (a lone surrogate echoed from a request) as backslash escapes: an error
    that quotes the request must still render."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code), status_code=error.status,
                        headers=error.headers)


def validation_error(exc: RequestValidationError) -> OpenAIError:
    """The first pydantic error as a 400: 'messages.0.role: Input should be ...'."""
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    if first.get("type") == LONE_SURROGATE_ERROR:
        return bad_request(first["msg"], first["ctx"]["path"])
    # union members show up in loc ("str", "list[int]", "NamedToolChoice"): keep the field path
    param = ".".join(str(p) for p in first.get("loc", ())[1:] if isinstance(p, int) or FIELD.fullmatch(p)
                     and p not in UNION_TAGS)
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first.get("msg"))
        return bad_request(f"request body is not valid JSON: {detail}")
    if first.get("type") == "missing" and not param:
        return bad_request("request body is missing")
    if first.get("type") == "model_attributes_type" and not param:
        return bad_request(not_an_object(first.get("input")))
    return bad_request(f"{param or 'body'}: {first.get('msg')}", param or None)


def not_an_object(body) -> str:
    """What is wrong with a body that is not a JSON object: FastAPI hands over the raw bytes unless the request's
    Content-Type says JSON (curl -d sends application/x-www-form-urlencoded)."""
    if isinstance(body, bytes):
        return "request body is not JSON: send a JSON object with the header Content-Type: application/json"
    return f"request body must be a JSON object, got {JSON_TYPES.get(type(body), type(body).__name__)}"


def parse_error(exc: HTTPException) -> OpenAIError | None:
    """FastAPI's 400 'There was an error parsing the body' as what went wrong, when json.loads says."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return bad_request(f"request body is not valid JSON: it is not UTF-8 text ({cause})")
    if isinstance(cause, RecursionError):
        return bad_request("request body is not valid JSON: it is nested too deeply to parse")
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through error_response."""

    @app.exception_handler(OpenAIError)
    async def on_openai_error(request: Request, exc: OpenAIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        return error_response(validation_error(exc))

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException):
        if isinstance(exc.__cause__, ClientDisconnect):  # FastAPI's 400 for a body the client stopped sending
            return error_response(OpenAIError(CLIENT_CLOSED, "the client closed the request", code="client_closed"))
        if (error := parse_error(exc)) is not None:
            return error_response(error)
        message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        code = "request_too_large" if exc.status_code == 413 else None
        return error_response(OpenAIError(exc.status_code, message, code=code))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        logger.exception("unhandled error serving %s", request.url.path)
        return error_response(OpenAIError(500, f"internal server error: {type(exc).__name__}: {exc}"))
