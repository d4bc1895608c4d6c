"""http.get (read-only), http.post and http.put (side effects), on `http.client`.

Outcomes follow DESIGN.md §6, by how far a call got:

    connect()      a failure here sent nothing (refused, DNS, TLS, connect timeout): not sent
    request()      the request is written; a failure while writing may have reached the server
    getresponse()  2xx succeeded; 4xx rejected except 408 (uncertain) and 429 (not sent, retry
                   after Retry-After); 5xx, a timeout or reset, or an answer that does not read
                   as HTTP: uncertain

The effect id goes out as `Idempotency-Key`. Each call is one exchange on a connection of its
own (`exchange`; `Connection: close`, never reused), so a request is never written into a
connection the server may already have dropped. `http.get` follows redirects (at most MAX_REDIRECTS, to
http(s) URLs only); a POST or PUT never does: its 3xx is its answer.

A receiver listed in LOOP_IDEMPOTENT_RECEIVERS deduplicates on that key (`receivers`): a call
to it is safe to repeat, and its 409 (still working on this key) is not sent, retried.

Every connection goes only where the tools may (`room`: not the loop's own site, not what
LOOP_HTTP_DENY names, not this host unless LOOP_HTTP_ALLOW lists the receiver), judged on the
address it connects to; a URL that names such a place is refused when the plan is written.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from .. import safe_input
from ..outcomes import EffectNotSent, EffectRejected, EffectUncertainError
from . import exchange, receivers, room
from .base import Arg, ProbeResult, ToolError, TransientError, fixed, storable, tool
from .exchange import FAILURES, MAX_BODY, Answer, ProtocolError, header_problem, why
from .receivers import Target
from .shown import Field, json_text

MAX_REDIRECTS = 5
REDIRECTS = {301, 302, 303, 307, 308}
OUTPUT_DEPTH = 100
# Sent to the URL the plan names; not to another origin a redirect points to.
ORIGIN_HEADERS = {"authorization", "proxy-authorization", "cookie", "host"}


def _target(url: Any) -> Target:
    try:
        return receivers.target(str(url))
    except ValueError as exc:
        raise ToolError(str(exc)) from None


def _checked(method: str, where: Target, headers: dict[str, str]) -> dict[str, str]:
    """The headers to send (with `Connection: close`), or ToolError naming the one that
    cannot be sent as given: before anything is connected."""
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem:
            raise ToolError(f"{method} {where.url}: {problem}")
    return {**headers, "Connection": "close"}


def _body(answer: Answer) -> Any:
    """A JSON body as its value, if it holds JSON values only (no NaN, nothing nested past
    OUTPUT_DEPTH, …) and so can be stored; else, like any other body, as text."""
    if "json" in (answer.header("Content-Type") or "") and not answer.cut:
        try:
            return safe_input.load_json(answer.body, "body", depth=OUTPUT_DEPTH)
        except safe_input.PlanError:
            pass
    return storable(answer.body.decode("utf-8", errors="replace"))


def _output(answer: Answer, **fields: Any) -> dict[str, Any]:
    """What a step keeps of an answer; a body cut at MAX_BODY says so (`truncated`)."""
    output = {"status": answer.status, **fields, "body": _body(answer)}
    if answer.cut:
        output["truncated"] = f"the body was longer than {MAX_BODY} bytes: only those are kept"
    return output


def _headers(given: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (given or {}).items()}


def _check(args: dict[str, Any]) -> list[str]:
    """The URL and the headers, as far as they are known at plan time."""
    problems = []
    if fixed(args["url"]):
        try:
            where = receivers.target(args["url"])
        except ValueError as exc:
            problems.append("args.url: " + str(exc).removeprefix("'url' "))
        else:
            refused = room.problem(where.host, where.port)
            if refused:
                problems.append(f"args.url: the http tools may not go there: {refused}")
    headers = args.get("headers")
    for name, value in headers.items() if isinstance(headers, dict) else []:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            problems.append(f"args.headers: header {name!r} must be a string")
            continue
        problem = header_problem(name, str(value) if fixed(value) else None)
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
    """GET, following up to MAX_REDIRECTS redirects; `url` is where the answer came from and
    `redirects` each hop (`{"status", "url"}`, the URL it pointed to)."""
    where = _target(args["url"])
    headers = _checked("GET", where, _headers(args.get("headers")))
    first = where
    hops: list[dict[str, Any]] = []
    while True:
        try:
            answer = exchange.exchange("GET", where, headers, None)
        except room.Refused as exc:
            raise ToolError(f"GET {where.url}: {exc}; nothing was sent") from None
        except (*FAILURES, ProtocolError) as exc:
            raise TransientError(f"GET {where.url}: {why(exc)}") from exc
        location = answer.header("Location")
        if answer.status not in REDIRECTS or location is None:
            break
        where, headers = _redirected(where, location, headers, first, hops)
        hops.append({"status": answer.status, "url": where.url})
    if answer.status >= 500 or answer.status in (408, 429):
        raise TransientError(f"GET {where.url}: HTTP {answer.status}")
    return _output(answer, headers=dict(answer.headers), url=where.url, redirects=hops)


def _redirected(
    where: Target, location: str, headers: dict[str, str], first: Target, hops: list[Any]
) -> tuple[Target, dict[str, str]]:
    """Where a redirect from `where` points, and the headers to send there (no credentials
    or Host for another origin); ToolError naming the URL for a loop, a hop past
    MAX_REDIRECTS, or a place that is not an http(s) URL."""
    url = urllib.parse.urljoin(where.url, location.strip())
    try:
        following = receivers.target(url)
    except ValueError as exc:
        why = str(exc).removeprefix("'url' ")
        raise ToolError(f"GET {where.url}: redirected to {location!r}, which {why}") from None
    if following.url in {first.url, *(hop["url"] for hop in hops)}:
        raise ToolError(f"GET {first.url}: a redirect loop, back to {following.url}")
    if len(hops) >= MAX_REDIRECTS:
        raise ToolError(
            f"GET {first.url}: more than {MAX_REDIRECTS} redirects (the next to {following.url})"
        )
    if (following.scheme, following.host, following.port) != (where.scheme, where.host, where.port):
        headers = {k: v for k, v in headers.items() if k.lower() not in ORIGIN_HEADERS}
    return following, headers


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


def _show(method: str) -> Callable[[dict[str, Any]], list[Field]]:
    def show(args: dict[str, Any]) -> list[Field]:
        """The request line, the headers as they will go out (the Idempotency-Key aside: it is
        ours), and the body: JSON pretty-printed, text as written. Every value in full: only a
        secret (`${secret:NAME}`) is not shown, by its name (`Tool.request_view`)."""
        fields = [Field("Request", f"{method} {args.get('url', '')}", "code")]
        headers = {
            k: v for k, v in _headers(args.get("headers")).items() if k.lower() != "idempotency-key"
        }
        if "json" in args and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        if headers:
            lines = [f"{name}: {value}" for name, value in headers.items()]
            fields.append(Field("Headers", "\n".join(lines), "code"))
        if "json" in args:
            fields.append(Field("JSON body", json_text(args["json"]), "json"))
        else:
            fields.append(Field("Body", str(args.get("body", ""))))
        return fields

    return show


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
    sending = _checked(method, where, headers)  # checked whole before connecting
    conn = exchange.connection(where)
    try:
        conn.connect()
    except room.Refused as exc:  # a place the tools may not go: nothing was connected
        conn.close()
        raise ToolError(f"{method} {url}: {exc}; nothing was sent") from None
    except (OSError, ValueError) as exc:  # refused, DNS, TLS, connect timeout: nothing written
        conn.close()
        raise EffectNotSent(f"{method} {url}: {exc}") from exc
    try:
        conn.request(method, where.path, body=payload, headers=sending)
    except OSError as exc:
        conn.close()
        raise EffectUncertainError(f"{method} {url}: {exc} while the request was written") from exc
    except (ValueError, http.client.HTTPException) as exc:  # refused by http.client, unsent
        conn.close()
        raise ToolError(f"{method} {url}: {exc}; nothing was sent") from exc

    def finish() -> dict[str, Any]:
        try:
            answer = exchange.receive(conn)
        except (*FAILURES, ProtocolError) as exc:
            raise EffectUncertainError(
                f"{method} {url}: {why(exc)} after the request was written"
            ) from exc
        finally:
            conn.close()
        return _judge(method, url, answer, deduplicated=honours_key(args))

    return finish


def honours_key(args: dict[str, Any]) -> bool:
    """The call goes to a receiver listed in LOOP_IDEMPOTENT_RECEIVERS, as the URL says (a
    plan's own `Host` header could send it to another site on that server: then not)."""
    if any(str(name).lower() == "host" for name in args.get("headers") or {}):
        return False
    return receivers.honours_key(str(args.get("url", "")), settings.LOOP_IDEMPOTENT_RECEIVERS)


def _judge(method: str, url: str, answer: Answer, *, deduplicated: bool) -> dict[str, Any]:
    status, body = answer.status, _body(answer)
    if 200 <= status < 300:
        return _output(answer)
    if status == 429 or (status == 409 and deduplicated):
        # 409 from a receiver that deduplicates: it is still working on this key (a request
        # sent before a cut); the same key again later gets that request's answer.
        delay = retry_after_seconds(answer.header("Retry-After") or "")
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
