"""http.get (read-only), http.post and http.put (side effects).

Outcomes follow DESIGN.md §6: a failure before the request was written (refused, DNS, TLS,
connect timeout) is not sent; 2xx succeeded; 4xx rejected except 408 (uncertain) and 429 (not
sent, retry after Retry-After); 5xx, or a timeout or reset after the request was written, is
uncertain. The effect id goes out as `Idempotency-Key`. Each call is one exchange on a
connection of its own (`wire`).

A receiver listed in LOOP_IDEMPOTENT_RECEIVERS deduplicates on that key (`receivers`): a call
to it is safe to repeat, and its 409 (still working on this key) is not sent, retried.
"""

from __future__ import annotations

import email.utils
import json
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from .. import plans
from ..outcomes import EffectNotSent, EffectRejected, EffectUncertainError
from . import Arg, ProbeResult, ToolError, TransientError, fixed, receivers, storable, tool, wire
from .shown import Field, json_text

MAX_BODY = 1_000_000
OUTPUT_DEPTH = 100


def _target(url: Any) -> wire.Target:
    try:
        return wire.target(str(url))
    except ValueError as exc:
        raise ToolError(str(exc)) from None


def _request(method: str, where: wire.Target, headers: dict[str, str], body: bytes) -> bytes:
    try:
        return wire.request_bytes(method, where, headers, body)
    except ValueError as exc:
        raise ToolError(f"{method} {where.scheme}://{where.authority}{where.path}: {exc}") from None


def _body(response: wire.Response) -> Any:
    """A JSON body as its value, if it holds JSON values only (no NaN, nothing nested past
    OUTPUT_DEPTH, …) and so can be stored; else, like any other body, as text."""
    if "json" in (response.header("Content-Type") or ""):
        try:
            return plans.load_json(response.body, "body", depth=OUTPUT_DEPTH)
        except plans.PlanError:
            pass
    return storable(response.body.decode("utf-8", errors="replace"))


def _headers(given: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (given or {}).items()}


def _check(args: dict[str, Any]) -> list[str]:
    """The URL and the headers, as far as they are known at plan time."""
    problems = []
    if fixed(args["url"]):
        try:
            wire.target(args["url"])
        except ValueError as exc:
            problems.append("args.url: " + str(exc).removeprefix("'url' "))
    headers = args.get("headers")
    for name, value in headers.items() if isinstance(headers, dict) else []:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            problems.append(f"args.headers: header {name!r} must be a string")
            continue
        problem = wire.header_problem(name, str(value) if fixed(value) else None)
        if problem:
            problems.append(f"args.headers: {problem}")
    if "json" in args and "body" in args:
        problems.append("args: give 'json' or 'body', not both")
    return problems


@tool(
    "http.get",
    args={"url": Arg("string"), "headers": Arg("object", required=False)},
    check=_check,
)
def http_get(args: dict[str, Any]) -> dict[str, Any]:
    where = _target(args["url"])
    request = _request("GET", where, _headers(args.get("headers")), b"")
    try:
        with wire.connect(where, settings.LOOP_HTTP_TIMEOUT) as sock:
            sock.sendall(request)
            response = wire.receive(sock, "GET", MAX_BODY)
    except (OSError, wire.ProtocolError) as exc:
        raise TransientError(f"GET {args['url']}: {exc}") from exc
    if response.status >= 500 or response.status in (408, 429):
        raise TransientError(f"GET {args['url']}: HTTP {response.status}")
    return {"status": response.status, "headers": dict(response.headers), "body": _body(response)}


WRITE_ARGS = {
    "url": Arg("string"),
    "json": Arg("any", required=False),
    "body": Arg("string", required=False),
    "headers": Arg("object", required=False),
}


def _describe(method: str) -> Any:
    def describe(args: dict[str, Any]) -> tuple[str, str]:
        payload = args.get("json", args.get("body", ""))
        text = json.dumps(payload, sort_keys=True) if "json" in args else str(payload)
        return f"{method} {args.get('url', '')}", (text if len(text) <= 200 else text[:199] + "…")

    return describe


# Header values a person approving a call need not read: credentials. Their presence is shown.
SECRET_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}
SECRET_WORDS = ("token", "secret", "password", "apikey")


def _show(method: str) -> Callable[[dict[str, Any]], list[Field]]:
    def show(args: dict[str, Any]) -> list[Field]:
        """The request line, the headers as they will go out (the Idempotency-Key aside: it is
        ours), and the body: JSON pretty-printed, text as written."""
        fields = [Field("Request", f"{method} {args.get('url', '')}", "code")]
        headers = {
            k: v for k, v in _headers(args.get("headers")).items() if k.lower() != "idempotency-key"
        }
        if "json" in args and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        if headers:
            lines = [f"{name}: {_shown_value(name, value)}" for name, value in headers.items()]
            fields.append(Field("Headers", "\n".join(lines), "code"))
        if "json" in args:
            fields.append(Field("JSON body", json_text(args["json"]), "json"))
        else:
            fields.append(Field("Body", str(args.get("body", ""))))
        return fields

    return show


def _shown_value(name: str, value: str) -> str:
    lowered = name.lower()
    if lowered in SECRET_HEADERS or any(word in lowered for word in SECRET_WORDS):
        return f"(a credential, {len(value)} characters, not shown)"
    return value


def _start(method: str, args: dict[str, Any], effect_id: str) -> Callable[[], dict[str, Any]]:
    """Connect and write the request; what reads and judges the answer."""
    if "json" in args and "body" in args:
        raise ToolError("give 'json' or 'body', not both")
    # Ours, whatever the plan says: a caller's own Idempotency-Key (any spelling) would
    # let two different effects look alike to the receiver.
    headers = {
        k: v for k, v in _headers(args.get("headers")).items() if k.lower() != "idempotency-key"
    }
    headers["Idempotency-Key"] = effect_id
    if "json" in args:
        payload = json.dumps(args["json"]).encode()
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    else:
        payload = str(args.get("body", "")).encode()
    url = args["url"]
    where = _target(url)
    request = _request(method, where, headers, payload)  # checked whole before connecting
    try:
        sock = wire.connect(where, settings.LOOP_HTTP_TIMEOUT)
    except OSError as exc:  # refused, DNS, TLS, connect timeout: nothing was written
        raise EffectNotSent(f"{method} {url}: {exc}") from exc
    try:
        sock.sendall(request)
    except OSError as exc:
        sock.close()
        raise EffectUncertainError(f"{method} {url}: {exc} while the request was written") from exc

    def finish() -> dict[str, Any]:
        try:
            with sock:
                response = wire.receive(sock, method, MAX_BODY)
        except (OSError, wire.ProtocolError) as exc:
            raise EffectUncertainError(
                f"{method} {url}: {exc} after the request was written"
            ) from exc
        return _judge(method, url, response, deduplicated=honours_key(args))

    return finish


def honours_key(args: dict[str, Any]) -> bool:
    """The call goes to a receiver listed in LOOP_IDEMPOTENT_RECEIVERS, as the URL says (a
    plan's own `Host` header could send it to another site on that server: then not)."""
    if any(str(name).lower() == "host" for name in args.get("headers") or {}):
        return False
    return receivers.honours_key(str(args.get("url", "")), settings.LOOP_IDEMPOTENT_RECEIVERS)


def _judge(method: str, url: str, response: wire.Response, *, deduplicated: bool) -> dict[str, Any]:
    status, body = response.status, _body(response)
    if 200 <= status < 300:
        return {"status": status, "body": body}
    if status == 429 or (status == 409 and deduplicated):
        # 409 from a receiver that deduplicates: it is still working on this key (a request
        # sent before a cut); the same key again later gets that request's answer.
        delay = retry_after_seconds(response.header("Retry-After") or "")
        raise EffectNotSent(f"{method} {url}: HTTP {status}", retry_after=delay)
    if status == 408 or status >= 500:
        raise EffectUncertainError(f"{method} {url}: HTTP {status}")
    if 400 <= status < 500:
        raise EffectRejected(f"{method} {url}: HTTP {status}: {str(body)[:500]}")
    raise EffectUncertainError(f"{method} {url}: unexpected HTTP {status}")


def retry_after_seconds(value: str) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP-date; None if absent or
    unreadable (the backoff decides)."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _probe(args: dict[str, Any], effect_id: str) -> ProbeResult:
    """Ask LOOP_HTTP_PROBE_URL (with {key}) whether the receiver knows this Idempotency-Key."""
    template = settings.LOOP_HTTP_PROBE_URL
    if not template:
        return ProbeResult(None, "no LOOP_HTTP_PROBE_URL is configured to ask the receiver")
    url = template.replace("{key}", urllib.parse.quote(effect_id))
    try:
        result = http_get({"url": url})
    except (ToolError, TransientError) as exc:
        return ProbeResult(None, f"probe {url} failed: {exc}")
    if result["status"] == 200:
        body = result["body"]
        return ProbeResult(
            True, f"the receiver knows key {effect_id[:12]}", {"status": 200, "body": body}
        )
    if result["status"] == 404:
        return ProbeResult(False, f"the receiver does not know key {effect_id[:12]}")
    return ProbeResult(None, f"probe {url} answered HTTP {result['status']}")


def _writer(method: str) -> None:
    """Register http.post or http.put: `start` sends, the answer is judged when awaited."""

    def start(args: dict[str, Any], effect_id: str) -> Callable[[], dict[str, Any]]:
        return _start(method, args, effect_id)

    def run(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
        return start(args, effect_id)()

    tool(
        f"http.{method.lower()}",
        args=WRITE_ARGS,
        side_effect=True,
        describe=_describe(method),
        show=_show(method),
        probe=_probe,
        start=start,
        dedupes=honours_key,
        check=_check,
    )(run)


_writer("POST")
_writer("PUT")
