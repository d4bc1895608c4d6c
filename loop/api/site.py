"""The API as django-ninja serves it: its routers, the strict JSON parser, the answers for
refusals and bad input (every one JSON with a `detail` naming the field, never a 500), the
OpenAPI document ninja writes from the schemas, and the URL patterns mounted at /api/."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.core.exceptions import DisallowedHost
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, path, re_path
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Router
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from .core import (
    MAX_ID,
    NEEDS_BEARER,
    REFUSALS,
    Call,
    NoAgent,
    Replayed,
    error,
    parse_body,
    refusal,
    replay,
)

PREFIX = "api/"


class JsonBody(Parser):
    """Bodies are read as `core.parse_body` reads them (strict JSON, a JSON object)."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        return parse_body(request)


class Api(NinjaAPI):
    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> Any:
        # The prefix is ours (ninja would reverse its root URL, which is not mounted).
        return document(dict(super().get_openapi_schema(path_prefix=PREFIX)))


api = Api(
    title="Pippa Loop API",
    version="1",
    urls_namespace="api",
    openapi_url=None,  # served by the `openapi` operation below, like any other
    docs_url=None,
    parser=JsonBody(),
)


# ---- the document -------------------------------------------------------------------------------

ABOUT = (
    "Agents create and steer tasks, or drive them step by step (`next` … work … `commit`). "
    "Every POST carries an `Idempotency-Key`: the same key and body again answer what the first "
    'did, and nothing is done twice. Every error is JSON, `{"detail": ...}` naming the field '
    "(also as `error`). Bodies are JSON objects in UTF-8 (else 415), at most "
    "DATA_UPLOAD_MAX_MEMORY_SIZE bytes (else 413), holding JSON values only: no NaN or "
    "Infinity, integers within ±2**63, nested at most LOOP_PLAN_MAX_DEPTH levels (else 400). "
    "The server (daphne) answers two requests itself: a header over 64 KB has its connection "
    "closed without an answer, and a multipart body it cannot parse gets a bare 400."
)
SAID = {
    400: "a bad body or field, or a missing, blank or too long Idempotency-Key: `detail` names it",
    401: "no valid bearer token",
    403: "not permitted: the token's user lacks a permission the act needs (`action` and "
    "`missing` name the act and the permissions), or a lease token not this agent's",
    404: "no such task or step",
    409: "refused in the current state, a lease that moved on, or an Idempotency-Key reused "
    "with another body or path",
    413: "the body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB by default)",
    415: "a non-empty body that is not `application/json` in UTF-8 (a form, multipart, text)",
    422: "the world said no (the effect failed definitively)",
    429: "too many wrong tokens from this address: wait `retry_after` seconds (Retry-After)",
    503: "not sent; try again (see `retry_after` and the Retry-After header)",
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "the command id, required on every POST: missing, blank or over 255 "
    "characters is a 400. The same key with the same body on the same path answers the stored "
    "response again (`Idempotent-Replayed: true`); the same key with another body, or on "
    "another path, is a 409.",
}


def document(doc: dict[str, Any]) -> dict[str, Any]:
    """ninja's document with what its schemas can't say: the rules every request shares, the
    Idempotency-Key header, and what each error status means here."""
    doc["info"]["description"] = ABOUT
    doc.pop("servers", None)
    components = doc["components"]
    components["parameters"] = {"IdempotencyKey": IDEMPOTENCY_KEY}
    for operations in doc["paths"].values():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                answer["description"] = SAID.get(int(status), answer["description"])
            if method == "post":
                key = {"$ref": "#/components/parameters/IdempotencyKey"}
                operation["parameters"] = [*operation.get("parameters", []), key]
            if "security" not in operation:
                operation["security"] = []
    return doc


# ---- answers -----------------------------------------------------------------------------------


def _refused(request: HttpRequest, exc: Exception | type[Exception]) -> HttpResponse:
    assert isinstance(exc, Exception)
    return refusal(exc) or error(400, str(exc))


for _refusal in REFUSALS:
    api.add_exception_handler(_refusal, _refused)


@api.exception_handler(NoAgent)
def _no_agent(request: HttpRequest, exc: NoAgent) -> HttpResponse:
    return exc.response()


@api.exception_handler(AuthenticationError)
def _no_token(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return NoAgent(401, NEEDS_BEARER).response()


@api.exception_handler(Replayed)
def _replayed(request: HttpRequest, exc: Replayed) -> HttpResponse:
    return exc.response


def _kept(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """A command refused for its body before its view ran: the refusal is its answer, kept
    as its receipt like any other (DESIGN.md §7), so the same key can't run another body."""
    call = getattr(request, "auth", None)
    if not isinstance(call, Call) or not call.command_id:
        return response
    try:
        with transaction.atomic():
            return call.keep(response)
    except IntegrityError:  # the same command id, stored meanwhile by a concurrent request
        return replay(call) or response


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps what the parser raised ("Cannot parse request body"): answer the cause.
    cause = exc.__cause__
    refused = refusal(cause) if isinstance(cause, Exception) else None
    return _kept(request, refused or error(exc.status_code, f"body: {exc}"))


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    """ninja's 422 list of pydantic errors, as one 400 naming the first field (and `errors`
    naming each)."""
    said = [f"{_where(e['loc'])}: {_problem(e)}" for e in exc.errors]
    return _kept(request, error(400, said[0], errors=said))


def _where(loc: tuple[Any, ...] | list[Any]) -> str:
    """("body", "body", "steps", 0, "tool") → "steps[0].tool"; ("query", "after") → "after"."""
    source, *rest = loc
    if source == "body" and len(rest) > 1:
        rest = rest[1:]  # the view's parameter that holds the body
    where = ""
    for part in rest:
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    return where or "body"


MESSAGES = {
    "missing": "required",
    "extra_forbidden": "unknown field",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "list_type": "must be a list",
}


def _problem(e: dict[str, Any]) -> str:
    kind, ctx = e.get("type", ""), e.get("ctx") or {}
    if kind in MESSAGES:
        return MESSAGES[kind]
    if kind == "literal_error":
        return f"one of {ctx.get('expected', '').replace(' or ', ', ')}".replace("'", "")
    if kind == "greater_than_equal":
        return f"must be {ctx.get('ge')} or more"
    if kind == "less_than_equal":
        return f"must be {ctx.get('le')} or less"
    if kind in ("string_too_short", "string_too_long"):
        n = ctx.get("min_length", ctx.get("max_length"))
        bound = "at least" if kind == "string_too_short" else "at most"
        return f"must be {bound} {n} character{'s' * (n != 1)} long"
    return str(e.get("msg", "invalid"))


# ---- routes ------------------------------------------------------------------------------------

public = Router()


@public.get("/openapi.json", auth=None, url_name="api_openapi", response=dict[str, Any])
def openapi(request: HttpRequest) -> HttpResponse:
    """The API's description; public, like any documentation."""
    return JsonResponse(api.get_openapi_schema())


def _mount() -> None:
    from . import agent, talk, views

    api.add_router("", public)
    for module in (views, agent, talk):
        api.add_router("", module.router)


_mount()


def serve(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A ninja URL's view, answering in JSON what ninja answers in text: another method (405),
    and an id past the database's range (404; the database would refuse the number itself)."""

    @csrf_exempt
    @wraps(view)
    def served(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        for name, value in kwargs.items():
            if isinstance(value, int) and value > MAX_ID:
                what = name.removesuffix("_id")
                return error(404, f"{what}: no {what} {value}")
        response = view(request, **kwargs)
        if response.status_code == 405 and not response.get("Content-Type", "").endswith("json"):
            allowed = ", ".join(sorted(m.strip() for m in response["Allow"].split(",")))
            response = error(405, f"method: {request.method} is not allowed here; use {allowed}")
            response["Allow"] = allowed
        return response

    return served


@csrf_exempt
def not_found(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    """Any other path under /api/: a JSON 404 (Django's own is an HTML page)."""
    return error(404, f"path: no API endpoint {request.path} (see /api/openapi.json)")


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's answer to a request it refuses before any view runs (a Host header that is not
    allowed, a malformed cookie): JSON under /api/, as every other API answer; the usual page
    elsewhere."""
    if not request.path.startswith("/" + PREFIX):
        return defaults.bad_request(request, exception)
    if isinstance(exception, DisallowedHost):
        return error(400, "Host: not a host this server answers to (ALLOWED_HOSTS)")
    return error(400, "request: refused before it reached the API")


def routes() -> list[tuple[str, str, str]]:
    """(path, method, URL name) of every operation, e.g. ("/api/tasks", "POST", "api_tasks")."""
    found = []
    for bound in api._get_bound_routers():
        for route, view in bound.path_operations.items():
            shown = "/" + PREFIX.rstrip("/") + route.replace("{int:", "{")
            for op in view.operations:
                found += [(shown, method, op.url_name or "") for method in op.methods]
    return found


def urlpatterns() -> list[Any]:
    """ninja's patterns under /api/ (its root, a docs page, is left out), then the JSON 404."""
    patterns: list[Any] = []
    for pattern in api.urls[0]:
        if isinstance(pattern, URLPattern) and pattern.name and pattern.name != "api-root":
            route = PREFIX + str(pattern.pattern)
            patterns.append(path(route, serve(pattern.callback), name=pattern.name))
    patterns.append(re_path(r"^api(?:/|$)", not_found))
    return patterns
