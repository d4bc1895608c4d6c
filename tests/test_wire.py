"""The http tools' HTTP/1.1 exchange (`loop.tools.wire`): what goes out, how every framing of
a response reads, and what the outbox makes of a response that does not read — against real
sockets, and a real TLS server with a certificate made here."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loop.models import Effect, Step
from loop.tools import ToolError, TransientError, get, wire
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step


def received(answer: bytes, method: str = "POST", limit: int = 1000) -> wire.Response:
    """`wire.receive` of these bytes, as a server would send them before closing."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(answer)
        theirs.close()
        return wire.receive(ours, method, limit)


@contextmanager
def canned(answer: bytes, tls: ssl.SSLContext | None = None) -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that reads each request whole and answers `answer`, then
    closes; its port, and the requests it read."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                if tls is not None:
                    conn = tls.wrap_socket(conn, server_side=True)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length:
                    body += conn.recv(65536)
                requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(answer)
            except (OSError, ssl.SSLError):
                pass  # a client that gave up on the handshake
            finally:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], requests
    finally:
        listener.close()


# ---- the request -----------------------------------------------------------------------------


def test_a_request_says_host_length_and_close_and_carries_the_plans_headers() -> None:
    where = wire.target("http://example.test:8080/hook?x=1")
    sent = wire.request_bytes("POST", where, {"X-Order": "42"}, b"[1]")
    assert sent == (
        b"POST /hook?x=1 HTTP/1.1\r\nHost: example.test:8080\r\nAccept-Encoding: identity\r\n"
        b"X-Order: 42\r\nContent-Length: 3\r\nConnection: close\r\n\r\n[1]"
    )
    get_ = wire.request_bytes("GET", wire.target("https://example.test"), {"Host": "h"}, b"")
    assert get_ == (
        b"GET / HTTP/1.1\r\nAccept-Encoding: identity\r\nHost: h\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"Bad Name": "x"}, "'Bad Name'"),
        ({"X-Split": "a\r\nInjected: yes"}, "'X-Split'"),
        ({"Content-Length": "9"}, "'Content-Length'"),
        ({"Connection": "keep-alive"}, "'Connection'"),
    ],
)
def test_a_header_that_cannot_go_out_as_given_is_refused_by_name(
    headers: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        wire.request_bytes("POST", wire.target("http://example.test/"), headers, b"")


@pytest.mark.parametrize(
    "url", ["ftp://example.test/", "http:///nohost", "http://example.test:99999/", "mailto:a@b"]
)
def test_a_url_that_is_not_http_is_refused_naming_url(url: str) -> None:
    with pytest.raises(ValueError, match="'url'"):
        wire.target(url)


# ---- the response ----------------------------------------------------------------------------


def test_a_body_framed_by_content_length() -> None:
    answer = received(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
    assert (answer.status, answer.reason, answer.body) == (201, "Created", b"hello")
    assert answer.header("x-a") == "1" and answer.header("missing") is None


def test_a_chunked_body_with_extensions_and_trailers() -> None:
    answer = received(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n"
    )
    assert answer.body == b"hello world"


def test_a_body_to_the_close_and_a_folded_header() -> None:
    answer = received(b"HTTP/1.0 200 OK\r\nX-Long: one\r\n two\r\n\r\nall of it")
    assert answer.body == b"all of it" and answer.header("X-Long") == "one two"


def test_informational_answers_are_skipped() -> None:
    answer = received(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 204 No Content\r\n\r\n"
    )
    assert (answer.status, answer.body) == (204, b"")


def test_a_body_is_cut_at_the_limit_in_every_framing() -> None:
    long = b"x" * 50
    assert received(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n" + long, limit=10).body == (
        b"x" * 10
    )
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n32\r\n" + long + b"\r\n0\r\n"
    assert received(chunked, limit=10).body == b"x" * 10
    assert received(b"HTTP/1.1 200 OK\r\n\r\n" + long, limit=10).body == b"x" * 10


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"", "closed before the status line"),
        (b"SMTP ready\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "not a header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "after 5 of 10 body bytes"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", "longer than"),
    ],
)
def test_a_response_that_does_not_read_whole_is_a_protocol_error(answer: bytes, why: str) -> None:
    with pytest.raises(wire.ProtocolError, match=why):
        received(answer)


# ---- what the outbox makes of it -------------------------------------------------------------


def test_a_chunked_json_answer_is_the_steps_output(worker: Worker) -> None:
    body = b'{"ok": true}'
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}".encode()
        + b"\r\n"
        + body
        + b"\r\n0\r\n\r\n"
    )
    with canned(answer) as (port, requests):
        task = make_task(step("hook", "http.post", args={"url": f"http://127.0.0.1:{port}/h"}))
        run_until_idle(worker)
    hook = Step.objects.get(task=task)
    assert hook.state == "done" and hook.output == {"status": 200, "body": {"ok": True}}
    assert len(requests) == 1 and b"Idempotency-Key: " in requests[0]


def test_an_answer_that_does_not_read_as_http_leaves_the_effect_uncertain(worker: Worker) -> None:
    with canned(b"HTTP/1.1 2xx what\r\n\r\n") as (port, requests):
        task = make_task(step("hook", "http.post", args={"url": f"http://127.0.0.1:{port}/h"}))
        run_until_idle(worker)
    hook, effect = Step.objects.get(task=task), Effect.objects.get(task=task)
    assert len(requests) == 1  # it arrived; what the receiver did with it, nobody can tell
    assert effect.state == "uncertain" and "not an HTTP/1.x status line" in effect.error
    assert hook.state == "blocked" and hook.question_kind == "did_it_happen"


def test_a_header_the_tool_sets_itself_fails_the_step_and_sends_nothing(worker: Worker) -> None:
    with canned(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") as (port, requests):
        # From an earlier output: a header named in the plan itself is refused there.
        args = {"url": f"http://127.0.0.1:{port}/h", "headers": "${given.value}"}
        given = step("given", args={"value": {"Content-Length": "1"}})
        task = make_task(given, step("hook", "http.post", args=args))
        run_until_idle(worker)
    hook = Step.objects.get(task=task, key="hook")
    assert hook.state == "failed" and "'Content-Length' is set by the tool" in hook.error
    assert requests == [] and not Effect.objects.filter(task=task).exists()  # refused before


# ---- TLS -------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificate (bin/install installs it)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_server(certificate: tuple[Path, Path]) -> Iterator[int]:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(*certificate)
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    with canned(answer, tls=server) as (port, _):
        yield port


def test_https_with_a_trusted_certificate(
    tls_server: int, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    wire._tls.cache_clear()
    try:
        result = get("http.get").run({"url": f"https://127.0.0.1:{tls_server}/"})
    finally:
        wire._tls.cache_clear()
    assert result["status"] == 200 and result["body"] == {}


def test_https_refuses_a_certificate_it_cannot_verify_before_sending(
    tls_server: int, worker: Worker
) -> None:
    wire._tls.cache_clear()
    with pytest.raises(TransientError, match="CERTIFICATE_VERIFY_FAILED"):
        get("http.get").run({"url": f"https://127.0.0.1:{tls_server}/"})
    task = make_task(step("hook", "http.post", args={"url": f"https://127.0.0.1:{tls_server}/"}))
    worker.tick()
    effect = Effect.objects.get(task=task)  # certainly not sent: back to pending, to retry
    assert effect.state == "pending" and "CERTIFICATE_VERIFY_FAILED" in effect.error


def test_a_bad_url_is_a_tool_error_naming_url() -> None:
    with pytest.raises(ToolError, match="'url'"):
        get("http.get").run({"url": "gopher://example.test/"})
