"""Tools stay out of the house (issue 24, item 6; DESIGN.md §19): the http tools refuse the loop's
own site, what LOOP_HTTP_DENY names and this host unless LOOP_HTTP_ALLOW lists the receiver,
decided on the address they connect to, at the moment they connect (`loop/tools/room.py`).

The attack: `http.post` steps to the site's own `/accounts/login/`, with a CSRF pair made up,
guessed Dad's password. The tests' receivers run on 127.0.0.1, which the suite allows
(tests/conftest.py); these tests take that away, or name the receiver as the site."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loop import plans, tools
from loop.models import Effect, Step, Task
from loop.tools import room
from loop.worker import Worker

from .conftest import ROOT, make_task, process_env, run_until_idle, step


@contextmanager
def server(host: str = "127.0.0.1", port: int = 0) -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on `host` that answers 200 to anything; its port and the paths it got."""
    got: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append(f"{self.command} {self.path}")
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_GET = do_POST = _answer  # noqa: N815

    httpd = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1], got
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def site(settings: Any) -> Iterator[tuple[int, list[str]]]:
    """A server standing for the loop's own site: where daphne listens (LOOP_SITE_ADDRESSES)."""
    with server() as (port, got):
        settings.LOOP_SITE_ADDRESSES = [f"127.0.0.1:{port}"]
        yield port, got


LOGIN = {"username": "dad", "password": "guess-1", "csrfmiddlewaretoken": "x" * 64}


def login_post(url: str) -> dict[str, Any]:
    return step(
        "guess",
        "http.post",
        args={"url": url, "body": "&".join(f"{k}={v}" for k, v in LOGIN.items()),
              "headers": {"Cookie": "csrftoken=" + "x" * 64, "Referer": url}},
    )  # fmt: skip


# ---- the site ---------------------------------------------------------------------------------


def test_a_post_to_the_sites_own_login_is_refused_when_written(
    db: None, site: tuple[int, list[str]]
) -> None:
    port, got = site
    for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]"):
        with pytest.raises(plans.PlanError) as refused:
            make_task(login_post(f"http://{host}:{port}/accounts/login/"))
        [error] = refused.value.errors
        assert error.startswith("step 'guess': args.url: the http tools may not go there: ")
        assert f"port {port} of " in error and "the loop's own site (LOOP_SITE_ADDRESSES)" in error
    assert got == [] and not Task.objects.exists()


def test_a_site_address_hidden_behind_a_reference_fails_its_step_and_sends_nothing(
    worker: Worker, site: tuple[int, list[str]]
) -> None:
    port, got = site
    task = make_task(
        step("where", args={"value": f"http://localhost:{port}/accounts/login/"}),
        login_post("${where.value}"),
    )
    run_until_idle(worker)
    guess = Step.objects.get(task=task, key="guess")
    assert guess.state == "failed"  # the call, its reference filled in, is checked again
    assert guess.error.endswith(
        f"port {port} of 127.0.0.1 is the loop's own site (LOOP_SITE_ADDRESSES)"
    )
    assert not Effect.objects.filter(step=guess).exists()
    # 2130706433 is 127.0.0.1 written as one number: only resolving it tells, when it connects.
    task = make_task(
        step("where", args={"value": f"http://2130706433:{port}/accounts/login/"}),
        login_post("${where.value}"),
    )
    run_until_idle(worker)
    guess = Step.objects.get(task=task, key="guess")
    assert guess.state == "failed"
    assert guess.error.endswith("the loop's own site (LOOP_SITE_ADDRESSES); nothing was sent")
    assert Effect.objects.get(step=guess).state == "failed"
    assert got == []


def test_a_wildcard_site_covers_every_address_of_this_host_on_its_port(
    db: None, settings: Any
) -> None:
    with server("0.0.0.0") as (port, got):  # noqa: S104 - a site that listens everywhere
        settings.LOOP_SITE_ADDRESSES = [f"0.0.0.0:{port}"]
        mine = [a for a in ("127.0.0.1", "127.0.0.2", primary_address()) if a]
        for address in mine:
            with pytest.raises(tools.ToolError, match="the loop's own site"):
                tools.get("http.get").run({"url": f"http://{address}:{port}/"})
        assert got == []
        # Another port of this host is no site: the suite lets receivers on 127.0.0.1 be.
        with server() as (other, seen):
            assert tools.get("http.get").run({"url": f"http://127.0.0.1:{other}/"})["status"] == 200
            assert seen == ["GET /"]


def primary_address() -> str | None:
    """This host's address on its default route (no packet is sent), if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else str(address)


def test_the_names_the_site_answers_to_are_refused_on_any_port(db: None, settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["pippa.example", ".pippa.example", "*"]
    for url in ("https://pippa.example/accounts/login/", "http://api.pippa.example:8443/x"):
        with pytest.raises(plans.PlanError, match=r"is the loop's own site \(ALLOWED_HOSTS\)"):
            make_task(login_post(url))
    assert room.problem("example.com", 443) is None  # "*" names everything, so nothing here


# ---- this host, and what the operator allows or denies ----------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "127.9.9.9", "0.0.0.0", "[::1]", "[::ffff:127.0.0.1]"]
)
def test_this_host_is_refused_unless_the_receiver_is_listed(
    db: None, settings: Any, host: str
) -> None:
    settings.LOOP_HTTP_ALLOW = []
    with pytest.raises(plans.PlanError, match="this host's own address; a receiver here must be"):
        make_task(step("look", "http.get", args={"url": f"http://{host}:9/"}))


def test_a_name_that_resolves_to_this_host_is_refused_when_it_connects(
    db: None, settings: Any
) -> None:
    settings.LOOP_HTTP_ALLOW = []
    with server() as (port, got):
        # 2130706433 is 127.0.0.1 written as one number: nothing tells until it is resolved.
        url = f"http://2130706433:{port}/"
        assert room.problem("2130706433", port) is None
        with pytest.raises(tools.ToolError, match="127.0.0.1 is this host's own address"):
            tools.get("http.get").run({"url": url})
        settings.LOOP_HTTP_ALLOW = [f"127.0.0.1:{port}"]  # the operator lists that receiver
        assert tools.get("http.get").run({"url": url})["status"] == 200
        settings.LOOP_HTTP_ALLOW = [f"127.0.0.1:{port + 1}"]  # another port of it is not it
        with pytest.raises(tools.ToolError, match="this host's own address"):
            tools.get("http.get").run({"url": url})
    assert got == ["GET /"]


@pytest.mark.parametrize(
    ("deny", "url"),
    [
        ("10.0.0.0/8", "http://10.20.30.40/hook"),
        ("169.254.169.254", "http://169.254.169.254/latest/meta-data/"),
        (".internal.example", "https://vault.internal.example/v1/secret"),
        ("internal.example", "https://internal.example/"),
        ("pay.example:8443", "https://pay.example:8443/charge"),
        ("fd00::/8", "http://[fd12::1]/"),
    ],
)
def test_what_the_operator_denies_is_refused_by_network_name_and_port(
    db: None, settings: Any, deny: str, url: str
) -> None:
    settings.LOOP_HTTP_DENY = [deny]
    with pytest.raises(plans.PlanError, match=r"is denied \(LOOP_HTTP_DENY"):
        make_task(step("look", "http.get", args={"url": url}))
    settings.LOOP_HTTP_DENY = []
    make_task(step("look", "http.get", args={"url": url}))  # allowed when not denied


def test_a_denial_or_the_site_beats_an_allowance(db: None, settings: Any) -> None:
    settings.LOOP_HTTP_ALLOW = ["127.0.0.0/8"]
    settings.LOOP_HTTP_DENY = ["127.0.0.5"]
    settings.LOOP_SITE_ADDRESSES = ["127.0.0.1:8000"]
    assert "LOOP_HTTP_DENY" in str(room.problem("127.0.0.5", 80))
    assert "LOOP_SITE_ADDRESSES" in str(room.problem("127.0.0.1", 8000))
    assert room.problem("127.0.0.1", 8001) is None


# ---- decided at connect time, on the address connected to -------------------------------------


def test_the_address_judged_is_the_address_connected_to(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that answers an allowed address, then a denied one (DNS rebinding): it is
    resolved once per connection, and the socket goes to the address that was judged."""
    settings.LOOP_HTTP_ALLOW = ["127.0.0.2"]
    settings.LOOP_HTTP_DENY = ["127.0.0.3"]
    with server("127.0.0.2") as (port, allowed), server("127.0.0.3", port) as (_, denied):
        answers = iter(["127.0.0.2", "127.0.0.3", "127.0.0.3", "127.0.0.2"])
        asked: list[str] = []
        real = socket.getaddrinfo

        def rebinding(host: Any, *rest: Any, **kw: Any) -> Any:
            if host != "rebind.test":
                return real(host, *rest, **kw)
            asked.append(host)
            return real(next(answers), *rest, **kw)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        url = f"http://rebind.test:{port}/x"
        assert room.problem("rebind.test", port) is None  # a name: judged when it connects
        assert tools.get("http.get").run({"url": url})["status"] == 200
        assert len(asked) == 1 and allowed == ["GET /x"]
        with pytest.raises(tools.ToolError, match=r"127.0.0.3 port \d+ is denied"):
            tools.get("http.get").run({"url": url})
        assert len(asked) == 2 and denied == []
        with pytest.raises(tools.ToolError, match="is denied"):
            tools.get("http.post").run({"url": url, "body": "x"}, "k" * 64)
        assert denied == []


def test_a_redirect_to_the_site_is_refused_at_its_hop(
    db: None, site: tuple[int, list[str]]
) -> None:
    port, got = site
    target = f"http://127.0.0.1:{port}/accounts/login/"

    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(tools.ToolError, match="the loop's own site"):
            tools.get("http.get").run({"url": f"http://127.0.0.1:{httpd.server_address[1]}/"})
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert got == []


# ---- the settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("LOOP_HTTP_DENY", "10.0.0.0/33", "LOOP_HTTP_DENY: '10.0.0.0/33': not a network"),
        ("LOOP_HTTP_ALLOW", "127.0.0.1:http", "LOOP_HTTP_ALLOW: '127.0.0.1:http': port: must be"),
        ("LOOP_HTTP_ALLOW", "bad host!", "LOOP_HTTP_ALLOW: 'bad host!': not an address"),
        ("LOOP_SITE_ADDRESSES", "127.0.0.1", "LOOP_SITE_ADDRESSES: '127.0.0.1': give the address"),
    ],
)
def test_an_entry_that_does_not_read_stops_the_process_naming_it(
    db: None, name: str, value: str, says: str
) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks"],
        capture_output=True,
        text=True,
        env=process_env(**{name: value}),
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.startswith(f"settings: {says}"), result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_the_site_defaults_to_where_bin_up_serves_it(db: None) -> None:
    code = "from django.conf import settings; print(settings.LOOP_SITE_ADDRESSES)"
    for env, said in [
        ({}, "['127.0.0.1:8000']"),
        ({"HOST": "0.0.0.0", "PORT": "9000"}, "['0.0.0.0:9000']"),
    ]:  # noqa: S104
        environment = process_env(**env)
        environment.pop("LOOP_SITE_ADDRESSES", None)
        if not env:
            environment.pop("HOST", None)
            environment.pop("PORT", None)
        result = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {code}"],
            capture_output=True,
            text=True,
            env={**environment, "DJANGO_SETTINGS_MODULE": "pippa_site.settings"},
            cwd=ROOT,
            timeout=60,
        )
        assert result.stdout.strip() == said, result.stderr
