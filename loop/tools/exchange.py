"""One HTTP/1.1 exchange on `http.client`, on a connection of its own, as the http tools make
it: `connection(where)`, then `connect()`, `request(...)` and `receive(conn)`. The phases stay
apart because what the outbox records depends on how far a call got (`loop.tools.http`).

`http.client` reads the answer; this adds what it lets pass and the outbox must not take for an
answer: a header line that is not one, a Content-Length that is not a number, a body shorter
than its Content-Length, a Transfer-Encoding other than chunked (ProtocolError). It also skips
every 1xx answer (`http.client` skips only 100 Continue), cuts a body at MAX_BODY and says so,
and unfolds an obsolete folded header. Its own limits stay: a line of at most 65536 bytes, at
most 100 headers.
"""

from __future__ import annotations

import email.errors
import http.client
import re
import ssl
from dataclasses import dataclass
from functools import cache

from django.conf import settings

from . import room
from .receivers import Target

MAX_BODY = 1_000_000  # bytes of a response body kept; a longer one is cut, and says so
FAILURES = (OSError, http.client.HTTPException)  # with ProtocolError: no whole answer
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")  # a header name (RFC 9110 §5.6.2)
_FOLD = re.compile(r"\r?\n[ \t]+")
# Headers a request gets from this module alone: what frames the message on the wire.
OWN_HEADERS = {"content-length", "transfer-encoding", "connection"}


class ProtocolError(Exception):
    """The response read as HTTP to `http.client`, but not to us (a header line that is not
    one, a Content-Length that is not a number, a body shorter than it said)."""


@cache
def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()  # the system's CAs (and SSL_CERT_FILE), verified


class _Response(http.client.HTTPResponse):
    def _read_status(self) -> tuple[str, int, str]:
        """The first final status line: every 1xx answer before it (100 Continue, 103 Early
        Hints) is skipped with its headers (`http.client` itself skips only 100)."""
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if status >= 200:
                return version, status, reason
            http.client._read_headers(self.fp)  # type: ignore[attr-defined]


def connection(where: Target) -> http.client.HTTPConnection:
    """A connection to `where`, not yet connected; its `connect()` raises room.Refused (a
    ToolError: nothing was sent) where the http tools may not go."""
    timeout = settings.LOOP_HTTP_TIMEOUT
    conn: http.client.HTTPConnection
    if where.scheme == "https":
        conn = http.client.HTTPSConnection(
            where.host, where.port, timeout=timeout, context=tls_context()
        )
    else:
        conn = http.client.HTTPConnection(where.host, where.port, timeout=timeout)
    conn.response_class = _Response
    # Connect only where the tools may (loop/tools/room.py), to the address judged: the Host
    # header and the certificate's name stay the URL's.
    conn._create_connection = room.connect  # type: ignore[attr-defined]
    return conn


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes  # at most MAX_BODY bytes
    cut: bool  # the body was longer than MAX_BODY

    def header(self, name: str) -> str | None:
        """The first header of this name (any case), or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), None)


_HEADER_DEFECTS = (
    email.errors.HeaderDefect,
    email.errors.MissingHeaderBodySeparatorDefect,
    email.errors.FirstHeaderLineIsContinuationDefect,
)


def receive(conn: http.client.HTTPConnection) -> Answer:
    """The answer to the request written on `conn`, its body cut at MAX_BODY. OSError (a
    timeout included), http.client.HTTPException or ProtocolError if it cannot be read whole."""
    response = conn.getresponse()
    message = response.msg
    if any(isinstance(d, _HEADER_DEFECTS) for d in message.defects) or message.get_payload():
        raise ProtocolError(f"not a header line in the answer: {str(message.get_payload())[:80]!r}")
    framing = response.getheader("Transfer-Encoding")
    if framing is not None and not response.chunked:
        raise ProtocolError(f"unsupported Transfer-Encoding {framing[:40]!r}")
    length = response.getheader("Content-Length")
    if length is not None and not response.chunked and not length.strip().isdigit():
        raise ProtocolError(f"bad Content-Length {length[:40]!r}")
    body = response.read(MAX_BODY + 1)
    if response.length and len(body) <= MAX_BODY:  # Content-Length said more
        raise ProtocolError(
            f"connection closed after {len(body)} of {len(body) + response.length} body bytes"
        )
    headers = [(name, _FOLD.sub(" ", value)) for name, value in response.getheaders()]
    return Answer(response.status, headers, body[:MAX_BODY], len(body) > MAX_BODY)


def why(exc: Exception) -> str:
    """What went wrong, in one line of words (`http.client` often gives only the bytes)."""
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed before the status line"
    if isinstance(exc, http.client.BadStatusLine):
        return f"not an HTTP/1.x status line: {str(exc.args[0]).strip()[:80]!r}"
    if isinstance(exc, http.client.UnknownProtocol):
        return f"not HTTP/1.x but {str(exc.args[0])[:20]!r}"
    if isinstance(exc, http.client.LineTooLong):
        return f"a {str(exc).rpartition('reading ')[2]} longer than 65536 bytes"
    if isinstance(exc, http.client.IncompleteRead):
        return f"the body broke off after {len(exc.partial)} bytes (bad framing or closed)"
    return str(exc) or type(exc).__name__


def header_problem(name: str, value: str | None) -> str | None:
    """Why this header cannot go out as given (naming it), or None; a value of None is not
    known yet and only the name is checked."""
    if not _TOKEN.match(name):
        return f"header name {name!r} is not a valid HTTP header name"
    if name.lower() in OWN_HEADERS:
        return f"header {name!r} is set by the tool, not by the plan"
    if value is not None and any(c in value for c in "\r\n\0"):
        return f"header {name!r} has a line break or NUL in its value"
    if value is not None and not value.isascii():
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            return f"header {name!r} is not latin-1 text"
    return None


def exchange(method: str, where: Target, headers: dict[str, str], body: bytes | None) -> Answer:
    """One read-only exchange: OSError, http.client.HTTPException or ProtocolError if it
    failed anywhere."""
    conn = connection(where)
    try:
        conn.connect()
        conn.request(method, where.path, body=body, headers=headers)
        return receive(conn)
    finally:
        conn.close()
