"""What Dad sees, in Debian's Chromium, against a real daphne and a real `runloop` process on
the test database file. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from loop.models import Effect, Step, Task

from .conftest import ROOT, kill, make_task, process_env, start_runloop, step, wait_for

# what a person sees: tried on the SQLite run
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.sqlite_only,
]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Receiver:
    """A webhook receiver: counts deliveries per Idempotency-Key; can hold a request open."""

    def __init__(self) -> None:
        self.deliveries: Counter[str] = Counter()
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.release.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.deliveries[self.headers.get("Idempotency-Key", "")] += 1
                receiver.arrived.set()
                receiver.release.wait(60)
                body = json.dumps({"ok": True}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pay"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def total(self) -> int:
        return sum(self.deliveries.values())


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.release.set()
    r.server.shutdown()


def start_daphne(port: int, log: Path) -> subprocess.Popen[bytes]:
    """A real daphne on `port`, on the test database, once it listens."""
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "pippa_site.asgi:application",
        ],
        cwd=ROOT,
        env=process_env(),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, timeout=30)
    return proc


@pytest.fixture
def site(transactional_db: None, processes: list[subprocess.Popen[bytes]], tmp_path: Path) -> str:
    """A real daphne on a free port, on the test database; static files collected first."""
    call_command("collectstatic", interactive=False, verbosity=0)
    port = free_port()
    processes.append(start_daphne(port, tmp_path / "daphne.log"))
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def worker_env(tmp_path: Path) -> dict[str, str]:
    return process_env(LOOP_IDLE_SLEEP_MS="50", LOOP_HEARTBEAT_SECONDS="1")


@pytest.fixture
def runloop(
    processes: list[subprocess.Popen[bytes]],
    worker_env: dict[str, str],
    tmp_path: Path,
    transactional_db: None,
) -> subprocess.Popen[bytes]:
    proc = start_runloop(env=worker_env, log=tmp_path / "runloop.log")
    processes.append(proc)
    return proc


@pytest.fixture(scope="module")
def launched_chromium() -> Iterator[Any]:
    """One real Chromium for a module's tests (starting Playwright and the browser costs about
    two seconds); each test's pages are in contexts of their own, closed after it (`browser`)."""
    with pytest.MonkeyPatch.context() as patch:
        # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
        # still plain synchronous calls.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield launched
            launched.close()


@pytest.fixture
def browser(launched_chromium: Any) -> Iterator[Any]:
    """The module's Chromium; whatever the test opened in it (pages, cookies) is closed after."""
    assert not launched_chromium.contexts, "a page of an earlier test is still open"
    yield launched_chromium
    for context in launched_chromium.contexts:
        context.close()


@pytest.fixture
def dad_user(transactional_db: None) -> User:
    from .conftest import DAD_PERMISSIONS, permission_objects

    user = User.objects.create_user("dad", password="dad-password-1", is_staff=True)
    user.user_permissions.add(*permission_objects(*DAD_PERMISSIONS))
    return user


@pytest.fixture
def guest_user(transactional_db: None) -> User:
    return User.objects.create_user("guest", password="guest-password-1")


def log_in(browser: Any, site: str, username: str, password: str) -> Any:
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1180, "height": 900})
    page.set_default_timeout(15000)
    expect.set_options(timeout=15000)
    page.goto(site + "/")
    assert "/accounts/login/" in page.url  # an anonymous visitor is sent to log in
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(site + "/")
    live_open(page)
    page.evaluate("window.__noReload = true")
    return page


def live_open(page: Any) -> None:
    """The page's live socket is open. (A selector, not wait_for_function: that evaluates a
    string, which the Content-Security-Policy forbids, as it should.)"""
    page.locator("body[data-live='open']").wait_for(state="attached")


def still_same_page(page: Any) -> bool:
    return bool(page.evaluate("window.__noReload === true"))


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def pay_step(url: str, **fields: Any) -> dict[str, Any]:
    return step(
        "pay",
        "http.post",
        args={"url": url, "json": {"amount": 120}},
        title="Pay the plumber",
        **fields,
    )


def test_may_i_appears_live_and_allow_once_runs_it(
    site: str, runloop: Any, browser: Any, dad_user: User, receiver: Receiver
) -> None:
    from playwright.sync_api import expect

    page = log_in(browser, site, "dad", "dad-password-1")
    expect(page.locator("#needs-you")).to_contain_text("Nothing needs you")
    task = make_task(
        step("quote", args={"value": {"amount": 120}}, title="Read the quote"),
        pay_step(receiver.url, confirm_before=True),
        title="Pay the plumber",
    )
    question = page.locator(f"#question-{task.steps.get(key='pay').pk}")
    expect(question).to_contain_text("May I do this?")
    expect(question).to_contain_text(f"POST {receiver.url}")
    expect(page).to_have_title("(1) Pippa Loop")
    expect(page.locator(f"#task-row-{task.pk}")).to_contain_text("1 of 2 steps done")
    shot(page, "home-may-i.png")
    assert receiver.total == 0

    question.get_by_role("button", name="Allow once").click()
    expect(page.locator("#flash")).to_contain_text("Allowed once")
    expect(page.locator("#needs-you")).to_contain_text("Nothing needs you")
    expect(page.locator(f"#recent-{task.pk}")).to_contain_text("Done")
    expect(page).to_have_title("Pippa Loop")
    assert still_same_page(page)
    assert receiver.total == 1

    page.goto(f"{site}/tasks/{task.pk}")
    expect(page.locator("#task-head")).to_contain_text("Done")
    expect(page.locator("#timeline rect.tl-done")).to_have_count(2)
    shot(page, "task-done.png")


def test_a_worker_killed_mid_effect_asks_did_it_happen_and_it_happened_settles_it(
    site: str,
    runloop: Any,
    browser: Any,
    dad_user: User,
    receiver: Receiver,
    worker_env: dict[str, str],
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    page = log_in(browser, site, "dad", "dad-password-1")
    receiver.release.clear()  # hold the delivery open: the worker is mid-effect
    task = make_task(pay_step(receiver.url), step("thank", title="Say thanks"), title="Webhook")
    assert receiver.arrived.wait(30)
    kill(runloop)
    receiver.release.set()
    assert receiver.total == 1
    expect(page.locator(f"#task-row-{task.pk}")).to_contain_text("Running")

    processes.append(start_runloop(env=worker_env, log=tmp_path / "runloop2.log"))
    pay = task.steps.get(key="pay")
    question = page.locator(f"#question-{pay.pk}")
    expect(question).to_contain_text("Did this happen?")
    expect(question).to_contain_text(f"POST {receiver.url}")
    expect(question).to_contain_text("http.post")
    expect(page).to_have_title("(1) Pippa Loop")
    question.locator("[name=note]").fill("the plumber confirmed by phone")
    shot(page, "home-did-it-happen.png")

    question.get_by_role("button", name="It happened").click()
    expect(page.locator("#needs-you")).to_contain_text("Nothing needs you")
    expect(page.locator(f"#recent-{task.pk}")).to_contain_text("Done")
    assert still_same_page(page)
    effect = Effect.objects.get(step=pay)
    assert (
        effect.state == "succeeded" and effect.response["note"] == "the plumber confirmed by phone"
    )
    assert receiver.total == 1  # settled without a second delivery

    page.goto(f"{site}/tasks/{task.pk}")
    expect(page.locator(f"#step-{pay.pk}")).to_contain_text("the plumber confirmed by phone")
    expect(page.locator("#timeline rect.tl-cut")).to_have_count(1)
    shot(page, "task-after-cut.png")


def test_deny_fails_the_step_and_pauses_the_task(
    site: str, runloop: Any, browser: Any, dad_user: User, receiver: Receiver
) -> None:
    from playwright.sync_api import expect

    page = log_in(browser, site, "dad", "dad-password-1")
    task = make_task(pay_step(receiver.url, confirm_before=True), step("after"), title="Maybe pay")
    pay = task.steps.get(key="pay")
    page.goto(f"{site}/tasks/{task.pk}")
    live_open(page)
    page.evaluate("window.__noReload = true")
    card = page.locator(f"#step-{pay.pk}")
    expect(card).to_contain_text("May I do this?")
    card.get_by_role("button", name="Deny").click()
    expect(page.locator("#task-head")).to_contain_text("Paused")
    expect(card).to_contain_text("denied by dad")
    expect(page.locator(f"#step-{pay.pk} .pill").first).to_have_text("Failed")
    expect(page.locator("#journal-rows")).to_contain_text("Your answer")
    assert still_same_page(page)
    assert receiver.total == 0
    assert Task.objects.get(pk=task.pk).state == "paused"


def test_a_reader_sees_no_buttons_and_forged_or_tokenless_posts_get_403(
    site: str, runloop: Any, browser: Any, guest_user: User, dad_user: User, receiver: Receiver
) -> None:
    from playwright.sync_api import expect

    task = make_task(
        step("xss", args={"value": "<script>alert(1)</script>"}),
        pay_step(receiver.url, confirm_before=True),
        title="<b>Not bold</b>",
    )
    pay = task.steps.get(key="pay")
    wait_for(lambda: Step.objects.get(pk=pay.pk).state == "blocked", timeout=30)
    page = log_in(browser, site, "guest", "guest-password-1")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    question = page.locator(f"#question-{pay.pk}")
    expect(question).to_contain_text("May I do this?")
    expect(question.get_by_role("button")).to_have_count(0)
    expect(question).to_contain_text("Only someone allowed to answer questions can decide this")

    token = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")
    forged = page.request.post(
        f"{site}/steps/{pay.pk}/decide", form={"decision": "allow"}, headers={"X-CSRFToken": token}
    )
    assert forged.status == 403
    assert Step.objects.get(pk=pay.pk).state == "blocked"
    assert task.steps.get(key="pay").pk == pay.pk

    page.goto(f"{site}/tasks/{task.pk}")
    expect(page.locator("#task-head h1")).to_contain_text("<b>Not bold</b>")
    xss = page.locator(f"#step-{task.steps.get(key='xss').pk}")
    expect(xss).to_contain_text("<script>alert(1)</script>")
    expect(page.locator("#journal-rows")).to_contain_text("Refused")
    assert dialogs == []
    assert page.locator("form[action$='/steps']").count() == 0  # no "add steps" for a reader

    dad = log_in(browser, site, "dad", "dad-password-1")
    tokenless = dad.request.post(f"{site}/steps/{pay.pk}/decide", form={"decision": "allow"})
    assert tokenless.status == 403
    assert Step.objects.get(pk=pay.pk).state == "blocked"


def test_may_i_shows_each_request_whole_and_a_long_body_expands_in_place(
    site: str, runloop: Any, browser: Any, dad_user: User
) -> None:
    from playwright.sync_api import expect

    from .test_question_shows_request import BODY, EMAIL, POST, WRITE

    page = log_in(browser, site, "dad", "dad-password-1")
    cards = {}
    for name, plan_step in (("email", EMAIL), ("http-post", POST), ("file-write", WRITE)):
        task = make_task({**plan_step, "title": f"The {name} step"}, title=f"Settle up: {name}")
        cards[name] = page.locator(f"#question-{task.steps.get().pk}")
        expect(cards[name]).to_contain_text("May I do this?")
    expect(page).to_have_title("(3) Pippa Loop")

    email = cards["email"]
    for text in ("plumber@example.com, office@example.com", "mum@example.com", "dad@example.com"):
        expect(email.locator(".request-fields")).to_contain_text(text)
    expect(email.locator(".request-fields")).to_contain_text("Your invoice <INV-7>")
    post = cards["http-post"]
    expect(post.locator(".request-fields")).to_contain_text('"notes": "ring twice & wait"')
    expect(post.locator(".request-fields")).to_contain_text("Authorization: Bearer s3cr3t-t0ken")
    expect(cards["file-write"].locator(".request-fields")).to_contain_text("notes/plumber.txt")
    for name, card in cards.items():
        card.screenshot(path=str(ARTIFACTS / f"question-{name}.png"))
    shot(page, "home-questions.png")

    # The body folds: a preview and "Show all"; the whole text opens in place.
    fold = email.locator("details.fold")
    full = fold.locator("pre.full")
    expect(full).to_be_hidden()
    fold.get_by_text("Show all 2,000 characters").click()
    expect(full).to_be_visible()
    assert full.evaluate("e => e.textContent") == BODY
    assert full.inner_text() == BODY  # as rendered: every line, nothing clipped
    assert full.evaluate("e => e.scrollHeight <= e.clientHeight + 1")
    email.screenshot(path=str(ARTIFACTS / "question-email-expanded.png"))

    # A live update of the list keeps what Dad opened open.
    other = make_task(step("other"), title="Something else")
    expect(page.locator(f"#recent-{other.pk}")).to_be_visible()
    expect(full).to_be_visible()
    fold.get_by_text("Show less").click()
    expect(full).to_be_hidden()
    assert still_same_page(page)


def test_a_live_update_keeps_the_field_dad_is_typing_in(
    site: str, runloop: Any, browser: Any, dad_user: User, receiver: Receiver
) -> None:
    """A new question re-renders the card Dad is editing: what he typed, the field he
    emptied, the focus and the caret stay, so his next key lands where the last one did."""
    from playwright.sync_api import expect

    page = log_in(browser, site, "dad", "dad-password-1")
    task = make_task(pay_step(receiver.url, confirm_before=True), title="Pay the plumber")
    pay = task.steps.get()
    card = page.locator(f"#question-{pay.pk}")
    expect(card).to_contain_text("May I do this?")
    card.locator("summary", has_text="Edit, then allow").click()
    body, url = card.locator(f"#arg-{pay.pk}-json"), card.locator(f"#arg-{pay.pk}-url")
    url.fill("")
    body.fill('{"amount": 9')
    body.press("End")
    body.evaluate("e => { e.dataset.typedIn = 'yes' }")
    # Another question: the section around Dad's card is rendered anew and replaced.
    other = make_task(pay_step(receiver.url, confirm_before=True), title="Pay the cleaner")
    expect(page.locator(f"#question-{other.steps.get().pk}")).to_be_visible()
    assert body.evaluate("e => e.dataset.typedIn") is None  # a new element, in the old's place
    page.keyboard.type("0}")
    expect(body).to_have_value('{"amount": 90}')
    expect(body).to_be_focused()
    expect(url).to_have_value("")
    assert still_same_page(page)


def test_the_pages_keep_to_the_content_security_policy(
    site: str, runloop: Any, browser: Any, dad_user: User
) -> None:
    """No inline script or style is blocked on any page, and the live socket still opens."""
    from playwright.sync_api import expect

    page = log_in(browser, site, "dad", "dad-password-1")
    blocked: list[str] = []
    page.on(
        "console",
        lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
    )
    done = make_task(step("a"), title="Finished")
    wait_for(lambda: Task.objects.get(pk=done.pk).state == "done", timeout=30)
    slow = make_task(step("a"), step("nap", "sleep", args={"seconds": 30}), title="Napping")
    page.reload()
    live_open(page)
    row = page.locator(f"#task-row-{slow.pk}")
    expect(row).to_contain_text("1 of 2 steps done")
    bar = row.locator("svg.progress rect.fill")
    expect(bar).to_have_attribute("width", "50")
    track = row.locator("svg.progress")

    def drawn_half_full() -> bool:
        # Read again until both are laid out: a live push may swap the row in between.
        box, whole = bar.bounding_box(), track.bounding_box()
        return bool(box and whole and abs(box["width"] - whole["width"] / 2) < 2)

    wait_for(drawn_half_full, timeout=10)
    for path in (f"/tasks/{done.pk}", "/tasks/new", "/admin/"):
        page.goto(site + path)
        if path.startswith("/tasks/") and path[7:].isdigit():
            live_open(page)  # the pages with a live socket: home and a task's
    expect(page.locator("#content")).to_contain_text("The loop's records")
    assert blocked == []


def test_a_signed_out_page_says_so_and_stops_reconnecting(
    site: str, browser: Any, guest_user: User
) -> None:
    from playwright.sync_api import expect

    page = log_in(browser, site, "guest", "guest-password-1")
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    # Signed out elsewhere in the same browser (its cookies); this page's socket is still open.
    token = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")
    out = page.request.post(f"{site}/accounts/logout/", headers={"X-CSRFToken": token})
    assert out.ok and "/accounts/login/" in out.url
    expect(page.locator("#live-refused")).to_be_hidden()
    page.evaluate("window.pippaLive.socket.close()")  # as a server restart or a network blip
    banner = page.locator("#live-refused")
    expect(banner).to_contain_text("Signed out — log in again")
    expect(banner.get_by_role("link", name="Log in")).to_have_attribute(
        "href", "/accounts/login/?next=%2F"
    )
    assert page.evaluate("document.body.dataset.live") == "refused"
    page.wait_for_timeout(3000)  # a reconnecting page would have tried ~4 more times by now
    assert len(sockets) == 1  # the one reconnect, refused with 4401; no more
    assert page.evaluate("window.pippaLive.attempts") == 2  # the first socket and that one
    shot(page, "signed-out-banner.png")
