"""Every page Dad sees, in Chromium, at a phone's 390 px and a desk's 1280 px, light and dark
(issue 28): no sideways scrolling, plain words, and colour contrast at WCAG AA as axe-core
measures it (installed from npm by `bin/install --test`, package-lock.json).

The pages are found, not listed by hand: every URL name of `loop.urls` that takes no argument,
the seeded tasks' and steps' pages, every link of the nav and of the pages reached from it (one
hop, so a page another change adds to the nav is checked once it is merged), the admin's
changelists and change forms, a 404 and the 500 page. The data is realistic: a task done, one
whose step failed on a refused connection, one asking "May I do this?", a long plan with long
words, a schedule and a message.

The screenshots the README shows (docs/img/) are made here: set UPDATE_README_SHOTS=1 to write
them there; otherwise they go to test-artifacts/ with the others.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any
from urllib.parse import urljoin, urlparse

import pytest
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.urls import URLPattern, reverse

from loop import actions, plans, schedules
from loop.models import Step, Task
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import ROOT, make_task, run_until_idle, step
from .test_browser import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    browser,
    launched_chromium,
    site,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.sqlite_only]

AXE = ROOT / "node_modules/axe-core/axe.min.js"
README_SHOTS = ROOT / "docs/img"
PHONE = {"width": 390, "height": 844}
DESK = {"width": 1280, "height": 900}

# Words a person should not meet on a page: the loop's own vocabulary.
GLOSSARY = [
    (re.compile(r"LOOP_[A-Z_]+"), "a setting's name"),
    (re.compile(r"\b\w+(?:Error|Exception)\b"), "a Python class name"),
    (re.compile(r"\[?Errno\b"), "an errno"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "a 64-character digest"),
    (re.compile(r"supersed", re.I), "'supersede'"),
    (re.compile(r"standing authori[sz]ation", re.I), "'standing authorization'"),
    (re.compile(r"\btick\b", re.I), "'tick'"),
    (re.compile(r"\b(?:cli|worker|boot|admin):\w+"), "an actor id"),
]
# The admin is Django's: its own words ("Django administration", model names) are allowed; the
# loop's words in it are not.
ADMIN_ALLOWED = re.compile(r"Django")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def seeded(transactional_db: None, settings: Any) -> dict[str, Any]:
    """Dad (an account with his full name), and the tasks, schedule and message of a week."""
    settings.LOOP_RETRY_BASE_SECONDS = 0
    User.objects.create_superuser("dad", password="dad-password-1", first_name="Dad")
    done = make_task(
        step(
            "quote",
            args={"value": {"amount": 120, "from": "Plumber Schmidt"}},
            title="Read the quote",
        ),
        step("note", args={"value": "Quote read: 120 EUR"}, title="Write it down"),
        title="Read the plumber's quote",
        actor="dad",
    )
    failed = make_task(
        step(
            "notify",
            "http.post",
            args={"url": f"http://127.0.0.1:{closed_port()}/hook", "json": {"text": "hello"}},
            title="Tell the family chat",
            max_attempts=1,
        ),
        title="Tell the family the quote",
        actor="cli:root",
    )
    asks = make_task(
        step("amount", args={"value": 120}, title="Work out the amount"),
        step(
            "pay",
            "http.post",
            args={"url": "http://127.0.0.1:9/pay", "json": {"amount": 120}},
            title="Pay the plumber",
            confirm_before=True,
        ),
        title="Pay the plumber",
        actor="dad",
    )
    word = "Donaudampfschifffahrtsgesellschaftskapitänsmützenabzeichen" * 3
    long = make_task(
        *[
            step(
                f"step_with_a_rather_long_key_{n:02d}",
                args={"value": f"{word} {n} " + "a very long line of output " * 12},
                title=f"Step {n}: {word}",
            )
            for n in range(14)
        ],
        step(
            "ask",
            "http.post",
            args={"url": f"http://127.0.0.1:9/{word}", "json": {"note": word}},
            title="Send the long note",
            confirm_before=True,
        ),
        step("after", title="Afterwards"),
        title=f"A long plan: {word}",
        actor="dad",
    )
    # A plan replaced by a new one (the old task's page and its state in words).
    old = make_task(step("draft"), title="Draft the letter", actor="dad")
    actions.supersede(
        task_id=old.pk,
        plan=plans.validate({"title": "Draft the letter again", "steps": [step("draft")]}),
        actor="dad",
        user=SYSTEM,
    )
    runner = Worker(label="pages")
    runner.boot()
    run_until_idle(runner)
    plan = {
        "title": "Water the plants",
        "schedule": "0 7 * * *",
        "timezone": "Europe/Berlin",
        "steps": [step("remind", args={"value": "Water the plants"}, title="Remind Dad")],
    }
    schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    assert Step.objects.get(task=failed, key="notify").state == "failed"
    assert Step.objects.get(task=asks, key="pay").state == "blocked"
    tasks = {"done": done, "failed": failed, "asks": asks, "long": long, "replaced": old}
    return {**tasks, "runner": runner}


# URLs a person never reads as a page: JSON for machines, a POST-only endpoint, a script.
NOT_PAGES = {"healthz", "push_key", "push_subscribe", "service_worker"}


def named_pages(tasks: dict[str, Task]) -> list[str]:
    """The one place pages are named: every `loop` URL that takes no argument and answers GET,
    and the pages of the seeded tasks and their steps."""
    from loop import urls

    found = []
    for pattern in urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        if pattern.name and not pattern.pattern.regex.groups and pattern.name not in NOT_PAGES:
            found.append(reverse(f"loop:{pattern.name}"))
    found += [reverse("loop:task", args=[t.pk]) for t in tasks.values() if isinstance(t, Task)]
    found += [reverse("admin:index")]
    found += [
        reverse("admin:loop_task_change", args=[t.pk]) for t in (tasks["long"], tasks["failed"])
    ]
    return found


def shape(path: str) -> str:
    """A page's kind: its path with numbers as N (two tasks' pages are one kind)."""
    return re.sub(r"\d+", "N", urlparse(path).path) + ("?" if urlparse(path).query else "")


def links(page: Any, base: str) -> list[str]:
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    found = []
    for href in hrefs:
        url = urlparse(urljoin(page.url, href))
        if url.netloc != urlparse(base).netloc or url.path.startswith(("/api/", "/static/")):
            continue
        if "logout" in url.path or "/delete/" in url.path or "/history/" in url.path:
            continue
        found.append(url.path + (f"?{url.query}" if url.query else ""))
    return found


def discover(page: Any, base: str, named: list[str]) -> list[str]:
    """The named pages, and every page one hop from the home page's nav and from them; each
    kind of page (its shape) found by a link twice at most."""
    seen: dict[str, int] = {}
    pages: list[str] = []

    def add(path: str, named: bool = False) -> None:
        kind = shape(path)
        if path in pages or (seen.get(kind, 0) >= 2 and not named):
            return
        seen[kind] = seen.get(kind, 0) + 1
        pages.append(path)

    for path in named:
        add(path, named=True)
    page.goto(base + "/")
    nav = [p for p in links(page, base) if not p.startswith("/admin/") or p == "/admin/"]
    for path in nav:
        add(path)
    for path in [*nav, "/admin/"]:
        page.goto(base + path)
        for found in links(page, base):
            # The admin: the loop's models' lists and the task's editor (the records' own pages
            # name them by their ids, the idempotency key among them), not every Django page.
            if found.startswith("/admin/") and not re.fullmatch(r"/admin/loop/\w+/(\?.*)?", found):
                continue
            add(found)
    return pages


def log_in(chromium: Any, base: str, viewport: dict[str, int], scheme: str) -> Any:
    context = chromium.new_context(viewport=viewport, color_scheme=scheme, bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(15000)
    page.goto(base + "/accounts/login/")
    page.fill("input[name=username]", "dad")
    page.fill("input[name=password]", "dad-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")
    return page


def visible_text(page: Any) -> str:
    return str(page.evaluate("document.body.innerText"))


def jargon(text: str, path: str) -> list[str]:
    if path.startswith("/admin/"):
        text = ADMIN_ALLOWED.sub("", text)
    said = []
    for pattern, what in GLOSSARY:
        for match in pattern.finditer(text):
            around = text[max(0, match.start() - 40) : match.end() + 40].replace("\n", " ")
            said.append(f"{path}: {what} {match.group(0)!r} in …{around}…")
    return said


def contrast(page: Any) -> list[str]:
    """axe-core's colour-contrast violations on the page as it is now (WCAG 2 AA)."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        "axe.run(document, {runOnly: {type: 'rule', values: ['color-contrast']}})"
        ".then(r => r.violations.flatMap(v => v.nodes.map(n => n.target.join(' ') + ': ' + n.failureSummary.split('\\n').slice(1).join(' '))))"
    )
    return [str(r) for r in result]


def widest(page: Any) -> str:
    """The deepest elements wider than the viewport, to say what to fix."""
    return str(
        page.evaluate(
            """() => { const wide = [];
            for (const e of document.querySelectorAll('body *')) {
              if (e.getBoundingClientRect().right > window.innerWidth + 1) {
                let depth = 0; for (let p = e; p; p = p.parentElement) depth++;
                const cls = typeof e.className === 'string' && e.className ? '.' + e.className.trim().split(/\\s+/).join('.') : '';
                wide.push([depth, e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + cls]);
              } }
            wide.sort((a, b) => b[0] - a[0]); return document.documentElement.scrollWidth + ' ' + document.body.scrollWidth + ' ' + wide.slice(0, 4).map(w => w[1]).join(', '); }"""
        )
    )


def overflow(page: Any) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth"))


def readme_shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=False)
    if os.environ.get("UPDATE_README_SHOTS"):
        README_SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(README_SHOTS / name), full_page=False)


def test_every_page_fits_a_phone_reads_plainly_and_has_aa_contrast_light_and_dark(
    request: pytest.FixtureRequest, seeded: dict[str, Any]
) -> None:
    # test_browser's fixtures, by name: a real daphne on the test database, Chromium.
    base: str = request.getfixturevalue("site")
    chromium: Any = request.getfixturevalue("browser")
    # handler500's page as Django's server_error renders it (no context), answered at a
    # made-up address of the base so its stylesheet loads.
    server_error_page = render_to_string("500.html")
    assert AXE.exists(), "axe-core is not installed: run bin/install --test (npm ci)"
    problems: list[str] = []
    phone = log_in(chromium, base, PHONE, "light")
    pages = discover(phone, base, named_pages(seeded))
    kinds = {shape(p) for p in pages}
    assert {
        "/",
        "/tasks/N",
        "/conversation",
        "/tasks/new",
        "/admin/",
        "/admin/loop/task/N/change/",
    } <= kinds, kinds
    pages.append("/no-such-page")
    phone.route(
        base + "/broken-on-purpose",
        lambda route: route.fulfill(status=500, body=server_error_page, content_type="text/html"),
    )
    pages.append("/broken-on-purpose")
    dark = log_in(chromium, base, PHONE, "dark")
    dark.route(
        base + "/broken-on-purpose",
        lambda route: route.fulfill(status=500, body=server_error_page, content_type="text/html"),
    )
    for path in pages:
        for page, scheme in ((phone, "light"), (dark, "dark")):
            answer = page.goto(base + path)
            assert answer is not None
            expected = {"/no-such-page": 404, "/broken-on-purpose": 500}.get(path, 200)
            assert answer.status == expected, (path, answer.status)
            width = overflow(page)
            if width > PHONE["width"]:
                problems.append(
                    f"{path} ({scheme}): {width} px wide on a 390 px phone: {widest(page)}"
                )
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(
                    path=str(
                        ARTIFACTS / f"too-wide-{shape(path).strip('/').replace('/', '-')}.png"
                    ),
                    full_page=True,
                )
            problems += [f"{path} ({scheme}) contrast: {c}" for c in contrast(page)]
            if scheme == "light":
                problems += jargon(visible_text(page), path)
    assert "There is no such page" in (phone.goto(base + "/no-such-page") and visible_text(phone))
    assert not problems, "\n".join(problems)
    print(f"{len(pages)} pages checked: {', '.join(pages)}")


def test_the_readme_tour_screenshots_at_both_sizes(
    request: pytest.FixtureRequest, seeded: dict[str, Any]
) -> None:
    """The first-five-minutes tour's pictures (README): home with its question, a task, a failed
    step, at 1280 and at 390 px; the task page fits the phone."""
    base: str = request.getfixturevalue("site")
    chromium: Any = request.getfixturevalue("browser")
    from playwright.sync_api import expect

    asks: Task = seeded["asks"]
    failed: Task = seeded["failed"]
    # The README's home page shows the plumber's question, not the long plan's stress test.
    seeded["long"].delete()
    runner: Worker = seeded["runner"]
    for size, viewport in (("desk", DESK), ("phone", PHONE)):
        runner.beat()  # the worker is alive (no "needs attention" banner in the README)
        for scheme in ("light", "dark") if size == "phone" else ("light",):
            page = log_in(chromium, base, viewport, scheme)
            suffix = f"{size}" if scheme == "light" else f"{size}-dark"
            expect(page.locator(f"#question-{asks.steps.get(key='pay').pk}")).to_be_visible()
            readme_shot(page, f"home-{suffix}.png")
            if scheme == "dark":
                page.context.close()
                continue
            runner.beat()
            page.goto(f"{base}/tasks/{asks.pk}")
            expect(page.locator("body")).to_contain_text("Pay the plumber")
            readme_shot(page, f"task-{suffix}.png")
            page.goto(f"{base}/tasks/{failed.pk}")
            expect(page.locator("body")).to_contain_text("connection refused")
            readme_shot(page, f"failed-{suffix}.png")
            page.goto(f"{base}/tasks/new")
            readme_shot(page, f"new-task-{suffix}.png")
            assert overflow(page) <= viewport["width"]
            # The admin's step editor: a card per step, its task's fields as text.
            page.goto(f"{base}/admin/loop/task/{asks.pk}/change/")
            expect(page.locator("#steps-group tr.form-row").first).to_be_visible()
            assert page.locator("textarea[name=instructions], select[name=origin]").count() == 0
            readme_shot(page, f"admin-steps-{suffix}.png")
            assert overflow(page) <= viewport["width"]
            page.context.close()
