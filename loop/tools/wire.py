"""One HTTP/1.1 exchange on a connection of its own: the request out, then the response in.

The http tools use this rather than `http.client`, which parses every response's headers with
the `email` package: that was half the CPU time of a POST, and a side-effect step's largest
single cost (`bench/effect_overhead.py --explain`). The phases stay apart, because what the
outbox records depends on how far a call got:

    connect()  -> a failure here sent nothing (refused, DNS, TLS, connect timeout)
    send()     -> the request is written; a failure while writing may have reached the server
    receive()  -> the status, the headers, the body (Content-Length, chunked, or to the close)

Every request says `Connection: close`: a connection is never reused, so a request is never
written into a connection the server may already have dropped.
"""

from __future__ import annotations

import re
import socket
import ssl
import urllib.parse
from dataclasses import dataclass
from functools import cache
from typing import BinaryIO

MAX_LINE = 65_536  # bytes in a status line, a header line or a chunk-size line
MAX_HEADERS = 100
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")  # a header name (RFC 9110 §5.6.2)
_STATUS = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: ([^\r\n]*))?\r?\n\Z")
# Headers a request gets from this module alone: what frames the message on the wire.
OWN_HEADERS = {"content-length", "transfer-encoding", "connection"}


class ProtocolError(Exception):
    """The response did not read as HTTP/1.1 (or broke off before it was whole)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # with the query

    @property
    def authority(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def target(url: str) -> Target:
    """ValueError, naming the url, unless it is an http(s) URL with a host."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"'url' is not a valid URL: {url!r} ({exc})") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"'url' must be an http(s) URL, not {url!r}")
    if parts.username is not None or parts.password is not None:
        # Not sent (a request line has no place for it), yet it would be shown as the
        # request and kept in the journal: refused, without repeating it.
        raise ValueError(
            "'url' carries a user name or password (user:pass@host), which is never sent; "
            "give credentials in an Authorization header"
        )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    if any(c in path for c in " \r\n\0"):
        raise ValueError(f"'url' has a space or control character in its path: {url!r}")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return Target(parts.scheme, parts.hostname, port, path)


def request_bytes(method: str, where: Target, headers: dict[str, str], body: bytes) -> bytes:
    """The whole request, or ValueError naming the header that cannot be sent as given."""
    lines = [f"{method} {where.path} HTTP/1.1"]
    given = {name.lower() for name in headers}
    if "host" not in given:
        lines.append(f"Host: {where.authority}")
    if "accept-encoding" not in given:
        lines.append("Accept-Encoding: identity")
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem:
            raise ValueError(problem)
        lines.append(f"{name}: {value}")
    if body or method in {"POST", "PUT", "PATCH"}:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError(f"a header is not latin-1 text: {exc}") from None
    return head + body


def header_problem(name: str, value: str | None) -> str | None:
    """Why this header cannot go out as given (naming it), or None; a value of None is not
    known yet and only the name is checked."""
    if not _TOKEN.match(name):
        return f"header name {name!r} is not a valid HTTP header name"
    if name.lower() in OWN_HEADERS:
        return f"header {name!r} is set by the tool, not by the plan"
    if value is not None and any(c in value for c in "\r\n\0"):
        return f"header {name!r} has a line break or NUL in its value"
    return None


@cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()  # the system's CAs (and SSL_CERT_FILE), verified


def connect(where: Target, timeout: float) -> socket.socket:
    """A connection to the target, TLS set up for https. OSError (ssl.SSLError included) if
    none could be made: then nothing was sent."""
    sock = socket.create_connection((where.host, where.port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if where.scheme == "https":
            sock = _tls().wrap_socket(sock, server_hostname=where.host)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes  # at most the `limit` receive() was given

    def header(self, name: str) -> str | None:
        """The first header of this name (any case), or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), None)


def receive(sock: socket.socket, method: str, limit: int) -> Response:
    """Read the response (skipping any 1xx); its body cut at `limit` bytes. OSError (a timeout
    included) or ProtocolError if it cannot be read whole."""
    with sock.makefile("rb") as stream:
        while True:
            status, reason = _status_line(stream)
            headers = _headers(stream)
            if status >= 200:
                break
        return Response(status, reason, headers, _body(stream, method, status, headers, limit))


def _line(stream: BinaryIO, what: str) -> bytes:
    line = stream.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ProtocolError(f"{what} longer than {MAX_LINE} bytes")
    if not line:
        raise ProtocolError(f"connection closed before the {what}")
    return line


def _status_line(stream: BinaryIO) -> tuple[int, str]:
    line = _line(stream, "status line")
    found = _STATUS.match(line)
    if not found:
        raise ProtocolError(f"not an HTTP/1.x status line: {line[:80]!r}")
    return int(found[1]), (found[2] or b"").decode("latin-1")


def _headers(stream: BinaryIO) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    while True:
        line = _line(stream, "header line")
        if line in (b"\r\n", b"\n"):
            return headers
        if len(headers) >= MAX_HEADERS:
            raise ProtocolError(f"more than {MAX_HEADERS} headers")
        text = line.decode("latin-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and headers:  # an obsolete folded continuation
            name, value = headers.pop()
            headers.append((name, f"{value} {text.strip()}"))
            continue
        name, colon, value = text.partition(":")
        if not colon or not _TOKEN.match(name):
            raise ProtocolError(f"not a header line: {text[:80]!r}")
        headers.append((name, value.strip()))


def _body(
    stream: BinaryIO, method: str, status: int, headers: list[tuple[str, str]], limit: int
) -> bytes:
    if method == "HEAD" or status in (204, 304):
        return b""
    framing = {name.lower(): value for name, value in headers}
    if "chunked" in framing.get("transfer-encoding", "").lower():
        return _chunks(stream, limit)
    if "content-length" in framing:
        try:
            length = int(framing["content-length"])
        except ValueError:
            raise ProtocolError(f"bad Content-Length {framing['content-length']!r}") from None
        if length < 0:
            raise ProtocolError(f"bad Content-Length {length}")
        return _exactly(stream, min(length, limit))
    return stream.read(limit)  # to the close


def _exactly(stream: BinaryIO, count: int) -> bytes:
    data = stream.read(count)
    if len(data) < count:
        raise ProtocolError(f"connection closed after {len(data)} of {count} body bytes")
    return data


def _chunks(stream: BinaryIO, limit: int) -> bytes:
    body = bytearray()
    while len(body) < limit:
        size_line = _line(stream, "chunk size").split(b";")[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {size_line[:20]!r}") from None
        if size == 0:
            break  # trailers may follow; the connection closes anyway
        body += _exactly(stream, min(size, limit - len(body)))
        if len(body) < limit:
            _exactly(stream, 2)  # the chunk's CRLF
    return bytes(body[:limit])
