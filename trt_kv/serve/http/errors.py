"""Errors as OpenAI answers them: a status and ``{"error": {"message", "type", "param",
"code"}}``. :class:`ApiError` is raised by the handlers; :func:`install_error_handlers` makes
FastAPI answer it, and a request that fails validation (FastAPI's 422), with that body:
validation answers 400 naming the field (``param``: ``"temperature"``, ``"messages.0.role"``).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from trt_kv.serve.http.protocol import ErrorBody, ErrorDetail


class ApiError(Exception):
    """An answer other than 200: ``status``, OpenAI's error ``type`` and ``code``, the
    request field it is about (``param``) and headers (``Retry-After``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        """The JSON body: ``{"error": {...}}``."""
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorBody(error=detail).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(param: str | None, message: str, code: str | None = None) -> ApiError:
    """400 ``invalid_request_error`` about ``param``."""
    return ApiError(400, message, param=param, code=code)


def server_error(message: str) -> ApiError:
    """500 ``server_error``: one request failed (the server and the others go on)."""
    return ApiError(500, message, type="server_error", code="internal_error")


def _field(loc: tuple) -> str | None:
    """``("body", "messages", 0, "role")`` -> ``"messages.0.role"`` (None for the body)."""
    parts = [str(p) for p in loc[1:] if isinstance(p, int) or _is_name(p)]
    return ".".join(parts) or None


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}  # pydantic's union tags


def _is_name(part: object) -> bool:
    """A field name, not one of pydantic's union or validator tags (``list[int]``)."""
    return isinstance(part, str) and part.isidentifier() and part not in _TYPE_TAGS


def validation_error(exc: RequestValidationError) -> ApiError:
    """A request's validation failure as a 400 naming its first field; each way the field
    could have been valid is said (a union: ``stop`` a string, or a list of at most 4)."""
    errors = exc.errors()
    if errors[0].get("type") == "json_invalid":
        return bad_request(None, f"the body is not valid JSON: {errors[0].get('msg')}")
    param = _field(tuple(errors[0].get("loc", ())))
    same = [e for e in errors if _field(tuple(e.get("loc", ()))) == param]
    said = " or ".join(dict.fromkeys(e.get("msg", "invalid") for e in same))
    given = errors[0].get("input")
    missing = errors[0].get("type") == "missing"
    shown = "" if missing or isinstance(given, dict) else f", got {given!r}"
    return bad_request(param, f"{param or 'body'}: {said}{shown}")


def install_error_handlers(app: FastAPI) -> None:
    """Answer :class:`ApiError`, validation failures, routing errors (404, 405) and any
    other exception (500) with OpenAI's error body."""

    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return ApiError(exc.status_code, str(exc.detail), code=code).response()

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        return server_error(f"{type(exc).__name__}: {exc}").response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)  # no such route, method not allowed
    app.add_exception_handler(Exception, unexpected)
