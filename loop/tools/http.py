"""http.get (read-only), http.post and http.put (side effects).

Outcomes follow DESIGN.md §6: a failure before the request was written (refused, DNS, TLS,
connect timeout) is not sent; 2xx succeeded; 4xx rejected except 408 (uncertain) and 429 (not
sent, retry after Retry-After); 5xx, or a timeout or reset after the request was written, is
uncertain. The effect id goes out as `Idempotency-Key`.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import socket
import ssl
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from ..effects import EffectNotSent, EffectRejected, EffectUncertainError
from . import Arg, ProbeResult, ToolError, TransientError, tool

MAX_BODY = 1_000_000


def _connection(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ToolError(f"'url' must be an http(s) URL, not {url!r}")
    timeout = settings.LOOP_HTTP_TIMEOUT
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return conn, path


def _read(response: http.client.HTTPResponse) -> Any:
    raw = response.read(MAX_BODY + 1)[:MAX_BODY]
    text = raw.decode("utf-8", errors="replace")
    if "json" in (response.getheader("Content-Type") or ""):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


@tool("http.get", args={"url": Arg("string"), "headers": Arg("object", required=False)})
def http_get(args: dict[str, Any]) -> dict[str, Any]:
    conn, path = _connection(args["url"])
    try:
        conn.request("GET", path, headers=args.get("headers") or {})
        response = conn.getresponse()
        body = _read(response)
    except (OSError, http.client.HTTPException) as exc:
        raise TransientError(f"GET {args['url']}: {exc}") from exc
    finally:
        conn.close()
    if response.status >= 500 or response.status in (408, 429):
        raise TransientError(f"GET {args['url']}: HTTP {response.status}")
    return {"status": response.status, "headers": dict(response.getheaders()), "body": body}


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


def _start(method: str, args: dict[str, Any], effect_id: str) -> Callable[[], dict[str, Any]]:
    """Connect and write the request; what reads and judges the answer."""
    if "json" in args and "body" in args:
        raise ToolError("give 'json' or 'body', not both")
    # Ours, whatever the plan says: a caller's own Idempotency-Key (any spelling) would
    # let two different effects look alike to the receiver.
    headers = {
        str(k): str(v)
        for k, v in (args.get("headers") or {}).items()
        if str(k).lower() != "idempotency-key"
    }
    headers["Idempotency-Key"] = effect_id
    if "json" in args:
        payload = json.dumps(args["json"]).encode()
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    else:
        payload = str(args.get("body", "")).encode()
    conn, path = _connection(args["url"])
    try:
        try:
            conn.connect()
        except (OSError, ssl.SSLError, socket.gaierror) as exc:
            raise EffectNotSent(f"{method} {args['url']}: {exc}") from exc
        try:
            conn.request(method, path, body=payload, headers=headers)
        except ValueError as exc:
            # A header http.client refuses (it checks them all before writing a byte).
            raise EffectRejected(f"{method} {args['url']}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise EffectUncertainError(
                f"{method} {args['url']}: {exc} while the request was written"
            ) from exc
    except BaseException:
        conn.close()
        raise

    def finish() -> dict[str, Any]:
        try:
            response = conn.getresponse()
            body = _read(response)
        except (OSError, http.client.HTTPException) as exc:
            raise EffectUncertainError(
                f"{method} {args['url']}: {exc} after the request was written"
            ) from exc
        finally:
            conn.close()
        return _judge(method, args["url"], response, body)

    return finish


def _judge(method: str, url: str, response: http.client.HTTPResponse, body: Any) -> dict[str, Any]:
    status = response.status
    if 200 <= status < 300:
        return {"status": status, "body": body}
    if status == 429:
        delay = retry_after_seconds(response.getheader("Retry-After") or "")
        raise EffectNotSent(f"{method} {url}: HTTP 429", retry_after=delay)
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
        probe=_probe,
        start=start,
    )(run)


_writer("POST")
_writer("PUT")
