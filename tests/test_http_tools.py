"""The http tools on `http.client` (`loop.tools.http`): what goes out, how every framing of an
answer reads, what the outbox makes of an answer that does not read, and where `http.get`
follows a redirect — against real sockets, and a real TLS server with a certificate made here."""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from loop.models import Effect, Step
from loop.outcomes import EffectNotSent, EffectRejected, EffectUncertainError
from loop.tools import ToolError, TransientError, exchange, get
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step

KEY = "k" * 64
Answer = bytes | Callable[[bytes], bytes]


@contextmanager
def canned(answer: Answer, tls: ssl.SSLContext | None = None) -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on 127.0.0.1 that reads each request whole and answers `answer` (or what
    `answer(request)` gives), then closes; its port, and the requests it read."""
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
                request = head + b"\r\n\r\n" + body
                requests.append(request)
                conn.sendall(answer(request) if callable(answer) else answer)
            except (OSError, ssl.SSLError):
                pass  # a client that gave up on the handshake
            finally:
                conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield listener.getsockname()[1], requests
    finally:
        # Wake the accept first, then close. Closed under a blocked accept, the number of the
        # listening socket was given to the next test's server while this thread's accept,
        # restarted after a signal, waited on that number: it took the next test's request
        # (a model server's, in tests/test_model_judge.py) and left its server hanging.
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        server.join(timeout=10)
        listener.close()


def path_of(request: bytes) -> str:
    return request.split(b" ", 2)[1].decode()


def redirecting(routes: dict[str, tuple[int, str]]) -> Callable[[bytes], bytes]:
    """Answers `status` with `Location: where` for each path routed; 200 `{"at": path}` else."""

    def answer(request: bytes) -> bytes:
        path = path_of(request)
        if path in routes:
            status, where = routes[path]
            return f"HTTP/1.1 {status} Moved\r\nLocation: {where}\r\nContent-Length: 0\r\n\r\n".encode()
        body = f'{{"at": "{path}"}}'.encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)  # fmt: skip

    return answer


def post(args: dict[str, Any]) -> dict[str, Any]:
    return get("http.post").run(args, KEY)


def fetch(url: str, **args: Any) -> dict[str, Any]:
    return get("http.get").run({"url": url, **args})


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


# ---- the request -----------------------------------------------------------------------------


def test_a_request_says_host_length_and_close_and_carries_the_plans_headers() -> None:
    with canned(OK) as (port, requests):
        post({"url": f"http://127.0.0.1:{port}/hook?x=1", "json": [1], "headers": {"X-Order": 42}})
        fetch(f"http://127.0.0.1:{port}/", headers={"Host": "h"})
    assert (
        requests[0]
        == (
            f"POST /hook?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept-Encoding: identity\r\n"
            f"Content-Length: 3\r\nX-Order: 42\r\nIdempotency-Key: {KEY}\r\n"
            "Content-Type: application/json\r\nConnection: close\r\n\r\n[1]"
        ).encode()
    )
    assert requests[1] == (
        b"GET / HTTP/1.1\r\nAccept-Encoding: identity\r\nHost: h\r\nConnection: close\r\n\r\n"
    )


def test_a_post_without_a_body_says_its_length_and_a_path_beyond_ascii_is_encoded() -> None:
    with canned(OK) as (port, requests):
        post({"url": f"http://127.0.0.1:{port}/café?q=ü"})
    assert requests[0].startswith(b"POST /caf%C3%A9?q=%C3%BC HTTP/1.1\r\n")
    assert b"\r\nContent-Length: 0\r\n" in requests[0]


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"Bad Name": "x"}, "'Bad Name'"),
        ({"X-Split": "a\r\nInjected: yes"}, "'X-Split'"),
        ({"Content-Length": "9"}, "'Content-Length'"),
        ({"transfer-encoding": "chunked"}, "'transfer-encoding'"),
        ({"Connection": "keep-alive"}, "'Connection'"),
        ({"X-Name": "€"}, "'X-Name' is not latin-1"),
    ],
)
def test_a_header_that_cannot_go_out_as_given_is_refused_by_name_and_nothing_is_sent(
    headers: dict[str, str], named: str
) -> None:
    with canned(OK) as (port, requests):
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(ToolError, match=named):
            post({"url": url, "headers": headers})
        with pytest.raises(ToolError, match=named):
            fetch(url, headers=headers)
    assert requests == []


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.test/",
        "http:///nohost",
        "http://example.test:99999/",
        "mailto:a@b",
        "http://example.test/a b",
        "http://example.test/a\tb",
    ],
)
def test_a_url_that_is_not_http_is_refused_naming_url(url: str) -> None:
    with pytest.raises(ToolError, match="'url'"):
        fetch(url)
    with pytest.raises(ToolError, match="'url'"):
        post({"url": url})


# ---- the answer ------------------------------------------------------------------------------


def test_a_body_framed_by_content_length() -> None:
    with canned(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello") as (port, _):
        answer = fetch(f"http://127.0.0.1:{port}/")
    assert (answer["status"], answer["body"]) == (201, "hello")
    assert answer["headers"] == {"Content-Length": "5", "X-A": "1"} and "truncated" not in answer


def test_a_chunked_body_with_extensions_and_trailers() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n"
    )
    with canned(chunked) as (port, _):
        assert fetch(f"http://127.0.0.1:{port}/")["body"] == "hello world"


def test_a_body_to_the_close_and_a_folded_header() -> None:
    with canned(b"HTTP/1.0 200 OK\r\nX-Long: one\r\n two\r\n\r\nall of it") as (port, _):
        answer = fetch(f"http://127.0.0.1:{port}/")
    assert answer["body"] == "all of it" and answer["headers"]["X-Long"] == "one two"


def test_informational_answers_are_skipped() -> None:
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 204 No Content\r\n\r\n"
    )
    with canned(answer) as (port, _):
        got = fetch(f"http://127.0.0.1:{port}/")
        posted = post({"url": f"http://127.0.0.1:{port}/"})
    assert (got["status"], got["body"], got["headers"]) == (204, "", {})
    assert posted == {"status": 204, "body": ""}


LONG = b"x" * (exchange.MAX_BODY + 50)
FRAMINGS = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(LONG), LONG),
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
    % (len(LONG), LONG),
    "to the close": b"HTTP/1.1 200 OK\r\n\r\n" + LONG,
}


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_body_is_cut_at_one_megabyte_in_every_framing_and_says_so(framing: str) -> None:
    with canned(FRAMINGS[framing]) as (port, _):
        got = fetch(f"http://127.0.0.1:{port}/")
        posted = post({"url": f"http://127.0.0.1:{port}/"})
    for output in (got, posted):
        assert output["body"] == "x" * exchange.MAX_BODY
        assert output["truncated"] == (
            "the body was longer than 1000000 bytes: only those are kept"
        )


def test_a_body_of_exactly_one_megabyte_is_whole() -> None:
    whole = b"y" * exchange.MAX_BODY
    with canned(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(whole), whole)) as (
        port,
        _,
    ):
        got = fetch(f"http://127.0.0.1:{port}/")
    assert len(got["body"]) == exchange.MAX_BODY and "truncated" not in got


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"", "connection closed before the status line"),
        (b"SMTP ready\r\n", "not an HTTP/1.x status line: 'SMTP ready'"),
        (b"HTTP/1.1 2xx what\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/2.0 200 OK\r\n\r\n", "not HTTP/1.x but 'HTTP/2.0'"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "not a header line"),
        (b"HTTP/1.1 200 OK\r\nA: 1\r\nno colon\r\nB: 2\r\n\r\n", "not a header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "after 5 of 10 body bytes"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "bad Content-Length 'ten'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length '-1'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "body broke off"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", "header line longer than"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", "more than 100 headers"),
        (b"HTTP/1.1 200 " + b"y" * 70_000 + b"\r\n\r\n", "status line longer than"),
    ],
)
def test_an_answer_that_does_not_read_whole_is_uncertain_for_a_post_and_transient_for_a_get(
    answer: bytes, why: str
) -> None:
    with canned(answer) as (port, requests):
        url = f"http://127.0.0.1:{port}/h"
        with pytest.raises(EffectUncertainError, match=f"{why}.* after the request was written"):
            post({"url": url})
        with pytest.raises(TransientError, match=why):
            fetch(url)
    assert len(requests) == 2  # both arrived: what the receiver did with the POST, who knows


def status(code: int, *headers: str) -> bytes:
    return (f"HTTP/1.1 {code} X\r\n" + "".join(f"{h}\r\n" for h in headers)).encode() + (
        b"Content-Length: 4\r\n\r\nnope"
    )


def test_what_each_status_means_for_a_post() -> None:
    """DESIGN.md §6: 4xx rejected, except 408 uncertain and 429 not sent (retry after
    Retry-After); 5xx uncertain; a 3xx, never followed by a side effect, uncertain."""
    for code, raised in [
        (400, EffectRejected),
        (404, EffectRejected),
        (408, EffectUncertainError),
        (500, EffectUncertainError),
        (503, EffectUncertainError),
    ]:
        with canned(status(code)) as (port, _):
            with pytest.raises(raised, match=f"HTTP {code}"):
                post({"url": f"http://127.0.0.1:{port}/"})
    with canned(status(429, "Retry-After: 7")) as (port, _):
        with pytest.raises(EffectNotSent, match="HTTP 429") as limited:
            post({"url": f"http://127.0.0.1:{port}/"})
    assert limited.value.retry_after == 7.0


def test_a_refused_connection_is_not_sent_and_a_silent_receiver_is_uncertain(
    settings: Any,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    with pytest.raises(EffectNotSent, match="refused"):
        post({"url": f"http://127.0.0.1:{port}/"})

    def silent(request: bytes) -> bytes:
        time.sleep(1.0)
        return b""

    settings.LOOP_HTTP_TIMEOUT = 0.2
    with canned(silent) as (port, requests):
        with pytest.raises(EffectUncertainError, match="timed out after the request was written"):
            post({"url": f"http://127.0.0.1:{port}/"})
    assert len(requests) == 1


# ---- redirects -------------------------------------------------------------------------------


def test_a_get_follows_every_kind_of_redirect_up_to_five_and_shows_each_hop() -> None:
    with canned(lambda r: answers(r)) as (port, requests):
        base = f"http://127.0.0.1:{port}"
        answers = redirecting(
            {
                "/0": (301, "/1"),
                "/1": (302, f"{base}/2"),  # absolute
                "/2": (303, "3"),  # relative to /2
                "/3": (307, "/4?q=1"),
                "/4?q=1": (308, f"//127.0.0.1:{port}/5"),  # scheme-relative
            }
        )
        got = fetch(f"{base}/0")
    assert got["status"] == 200 and got["body"] == {"at": "/5"}
    assert got["url"] == f"{base}/5"
    assert got["redirects"] == [
        {"status": 301, "url": f"{base}/1"},
        {"status": 302, "url": f"{base}/2"},
        {"status": 303, "url": f"{base}/3"},
        {"status": 307, "url": f"{base}/4?q=1"},
        {"status": 308, "url": f"{base}/5"},
    ]
    assert [path_of(r) for r in requests] == ["/0", "/1", "/2", "/3", "/4?q=1", "/5"]


def test_a_get_without_redirects_says_where_its_answer_came_from() -> None:
    with canned(OK) as (port, _):
        got = fetch(f"http://127.0.0.1:{port}/x")
    assert got["url"] == f"http://127.0.0.1:{port}/x" and got["redirects"] == []


def test_a_sixth_redirect_fails_naming_the_url() -> None:
    with canned(lambda r: answers(r)) as (port, requests):
        answers = redirecting({f"/{n}": (302, f"/{n + 1}") for n in range(6)})
        with pytest.raises(ToolError, match=f"more than 5 redirects .*127.0.0.1:{port}/6"):
            fetch(f"http://127.0.0.1:{port}/0")
    assert len(requests) == 6  # /0 … /5; /6 is never asked for


def test_a_redirect_loop_fails_naming_the_url() -> None:
    with canned(lambda r: answers(r)) as (port, requests):
        answers = redirecting({"/a": (301, "/b"), "/b": (302, "/a")})
        with pytest.raises(ToolError, match=f"redirect loop, back to http://127.0.0.1:{port}/a"):
            fetch(f"http://127.0.0.1:{port}/a")
    assert [path_of(r) for r in requests] == ["/a", "/b"]


@pytest.mark.parametrize(
    "where", ["ftp://example.test/f", "file:///etc/passwd", "javascript:alert(1)"]
)
def test_a_redirect_to_anything_but_http_is_refused_naming_it(where: str) -> None:
    with canned(redirecting({"/": (302, where)})) as (port, requests):
        with pytest.raises(
            ToolError, match=re.escape(f"redirected to '{where}', which must be an http(s) URL")
        ):
            fetch(f"http://127.0.0.1:{port}/")
    assert len(requests) == 1


def test_a_redirect_to_another_origin_drops_the_credentials() -> None:
    with canned(OK) as (other, elsewhere):
        with canned(redirecting({"/": (307, f"http://127.0.0.1:{other}/")})) as (port, here):
            fetch(
                f"http://127.0.0.1:{port}/",
                headers={"Authorization": "Bearer s3cret", "Cookie": "a=1", "X-Trace": "t"},
            )
    assert b"Authorization: Bearer s3cret" in here[0] and b"Cookie: a=1" in here[0]
    assert b"s3cret" not in elsewhere[0] and b"Cookie" not in elsewhere[0]
    assert b"X-Trace: t" in elsewhere[0]


def test_a_redirect_without_location_is_the_answer() -> None:
    with canned(b"HTTP/1.1 304 Not Modified\r\n\r\n") as (port, _):
        got = fetch(f"http://127.0.0.1:{port}/")
    assert got["status"] == 304 and got["redirects"] == []


def test_a_post_or_put_never_follows_a_redirect() -> None:
    with canned(redirecting({"/pay": (307, "/elsewhere")})) as (port, requests):
        for tool in ("http.post", "http.put"):
            with pytest.raises(EffectUncertainError, match="unexpected HTTP 307"):
                get(tool).run({"url": f"http://127.0.0.1:{port}/pay", "json": {}}, KEY)
    assert [path_of(r) for r in requests] == ["/pay", "/pay"]


def test_the_probe_follows_redirects_too(settings: Any) -> None:
    with canned(lambda r: answers(r)) as (port, requests):
        answers = redirecting({f"/keys/{KEY}": (302, f"/v2/keys/{KEY}")})
        settings.LOOP_HTTP_PROBE_URL = f"http://127.0.0.1:{port}/keys/{{key}}"
        probe = get("http.post").probe
        assert probe is not None
        found = probe({"url": f"http://127.0.0.1:{port}/pay"}, KEY)
    assert found.found is True and found.response == {"status": 200, "body": {"at": f"/v2/keys/{KEY}"}}  # fmt: skip
    assert [path_of(r) for r in requests] == [f"/keys/{KEY}", f"/v2/keys/{KEY}"]


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
    with canned(OK) as (port, requests):
        # From an earlier output: a header named in the plan itself is refused there.
        args = {"url": f"http://127.0.0.1:{port}/h", "headers": "${given.value}"}
        given = step("given", args={"value": {"Content-Length": "1"}})
        task = make_task(given, step("hook", "http.post", args=args))
        run_until_idle(worker)
    hook = Step.objects.get(task=task, key="hook")
    assert hook.state == "failed" and "'Content-Length' is set by the tool" in hook.error
    assert requests == [] and not Effect.objects.filter(task=task).exists()  # refused before


def test_a_redirected_get_step_keeps_where_it_went(worker: Worker) -> None:
    with canned(lambda r: answers(r)) as (port, _):
        answers = redirecting({"/old": (301, "/new")})
        task = make_task(step("read", "http.get", args={"url": f"http://127.0.0.1:{port}/old"}))
        run_until_idle(worker)
    read = Step.objects.get(task=task)
    assert read.state == "done" and read.output["body"] == {"at": "/new"}
    assert read.output["redirects"] == [{"status": 301, "url": f"http://127.0.0.1:{port}/new"}]


def test_a_redirect_loop_fails_the_get_step_naming_the_url(worker: Worker) -> None:
    with canned(redirecting({"/a": (302, "/a")})) as (port, _):
        task = make_task(step("read", "http.get", args={"url": f"http://127.0.0.1:{port}/a"}))
        run_until_idle(worker)
    read = Step.objects.get(task=task)
    assert read.state == "failed" and f"redirect loop, back to http://127.0.0.1:{port}/a" in (
        read.error
    )


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
    exchange.tls_context.cache_clear()
    try:
        result = fetch(f"https://127.0.0.1:{tls_server}/")
        posted = post({"url": f"https://127.0.0.1:{tls_server}/"})
    finally:
        exchange.tls_context.cache_clear()
    assert result["status"] == 200 and result["body"] == {}
    assert posted == {"status": 200, "body": {}}


def test_https_refuses_a_certificate_it_cannot_verify_before_sending(
    tls_server: int, worker: Worker
) -> None:
    exchange.tls_context.cache_clear()
    with pytest.raises(TransientError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(f"https://127.0.0.1:{tls_server}/")
    task = make_task(step("hook", "http.post", args={"url": f"https://127.0.0.1:{tls_server}/"}))
    worker.tick()
    effect = Effect.objects.get(task=task)  # certainly not sent: back to pending, to retry
    assert effect.state == "pending" and "CERTIFICATE_VERIFY_FAILED" in effect.error


def test_a_bad_url_is_a_tool_error_naming_url() -> None:
    with pytest.raises(ToolError, match="'url'"):
        fetch("gopher://example.test/")
