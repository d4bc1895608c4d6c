"""Guessing is throttled (loop/throttle.py): failed logins per (username, address) and per
address, wrong agent tokens per address. While locked, the right password or token is refused
too, and the answer says how long to wait."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from loop.api.core import issue

LOGIN = "/accounts/login/"


def log_in(client: Client, username: str, password: str, path: str = LOGIN) -> Any:
    return client.post(path, {"username": username, "password": password})


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def staff_dad(dad: User) -> User:
    dad.is_staff = True
    dad.save(update_fields=["is_staff"])
    return dad


def test_forty_wrong_passwords_and_then_the_right_one_is_refused(dad: User) -> None:
    client = Client()
    answers = [log_in(client, "dad", f"guess-{i}").status_code for i in range(40)]
    assert answers[:5] == [200] * 5  # the form again, "didn't match"
    assert set(answers[5:]) == {429}
    right = log_in(client, "dad", "dad-password-1")
    assert right.status_code == 429 and not logged_in(client)
    assert "Too many failed logins: try again in 15 minutes." in right.content.decode()
    assert 0 < int(right["Retry-After"]) <= 15 * 60
    # Dad, from another address, is not locked out by a guesser.
    elsewhere = Client(REMOTE_ADDR="10.1.2.3")
    assert log_in(elsewhere, "dad", "dad-password-1").status_code == 302
    assert logged_in(elsewhere)


def test_guesses_from_dads_own_address_never_lock_out_the_browser_he_logged_in_with(
    dad: User,
) -> None:
    """Issue 24: a task's `http.post` guessed Dad's password on the login form, from this very
    host; Dad's right password then got 429 for 15 minutes. The browser that logged in before
    carries a device cookie: its failures count apart, and nobody else's count against it."""
    browser = Client()
    assert log_in(browser, "dad", "dad-password-1").status_code == 302
    device = browser.cookies["pippa_device"].value

    def log_out() -> None:  # a browser's logout ends its session, not its other cookies
        browser.logout()  # (the test client's drops every cookie)
        browser.cookies["pippa_device"] = device

    log_out()
    task = Client()  # the same address (127.0.0.1), no cookie
    answers = [log_in(task, "dad", f"guess-{i}").status_code for i in range(40)]
    assert answers[:5] == [200] * 5 and set(answers[5:]) == {429}
    assert log_in(browser, "dad", "dad-password-1").status_code == 302 and logged_in(browser)
    log_out()
    # The browser's own slips are its own to count: five, and it too waits.
    assert [log_in(browser, "dad", f"slip-{i}").status_code for i in range(6)] == [200] * 5 + [429]
    # A cookie is no pass: another account's, or a forged one, counts as no cookie at all.
    stranger = Client()
    stranger.cookies["pippa_device"] = device[:-2] + "xx"
    assert log_in(stranger, "dad", "dad-password-1").status_code == 429


def test_an_address_guessing_many_usernames_is_locked(dad: User, settings: Any) -> None:
    settings.PIPPA_LOGIN_IP_LIMIT = 6
    client = Client()
    for name in ("mum", "pippa", "root", "admin", "guest", "nobody"):
        assert log_in(client, name, "secret").status_code == 200
    assert log_in(client, "dad", "dad-password-1").status_code == 429
    assert not logged_in(client)


def test_the_admin_login_is_throttled_too(staff_dad: User) -> None:
    client = Client()
    for i in range(5):
        log_in(client, "dad", f"guess-{i}", path="/admin/login/")
    right = log_in(client, "dad", "dad-password-1", path="/admin/login/")
    assert not logged_in(client)
    assert "Too many failed logins" in right.content.decode()


def test_the_lock_ends_with_its_window_and_a_login_clears_the_count(dad: User) -> None:
    client = Client()
    with time_machine.travel(timezone.now(), tick=False) as clock:
        for i in range(5):
            log_in(client, "dad", f"guess-{i}")
        clock.shift(timedelta(minutes=14))
        assert log_in(client, "dad", "dad-password-1").status_code == 429
        clock.shift(timedelta(minutes=1, seconds=1))
        assert log_in(client, "dad", "dad-password-1").status_code == 302
        client.logout()
        # The count started again from the login: four slips and the right one still works.
        for i in range(4):
            assert log_in(client, "dad", f"slip-{i}").status_code == 200
        assert log_in(client, "dad", "dad-password-1").status_code == 302


# ---- agent tokens --------------------------------------------------------------------------


def api(token: str, address: str = "127.0.0.1") -> Any:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}", REMOTE_ADDR=address).get("/api/tasks")


def test_wrong_tokens_lock_the_address_even_against_the_right_token(
    dad: User, settings: Any
) -> None:
    settings.PIPPA_TOKEN_IP_LIMIT = 3
    _, token = issue(name="pippa", user=dad)
    for _ in range(5):  # no header at all is no guess
        assert Client().get("/api/tasks").status_code == 401
    assert api(token).status_code == 200
    assert [api(f"guess-{i}").status_code for i in range(3)] == [401] * 3
    refused = api(token)
    assert refused.status_code == 429
    body = refused.json()
    assert body["error"].startswith("Authorization: too many wrong tokens from this address")
    assert body["retry_after"] == int(refused["Retry-After"]) > 0
    assert api(token, address="10.9.8.7").status_code == 200  # the agent elsewhere is not


def test_an_expired_or_revoked_token_is_not_counted_as_a_guess(dad: User, settings: Any) -> None:
    settings.PIPPA_TOKEN_IP_LIMIT = 2
    _, old = issue(name="old", user=dad, expires_at=timezone.now() - timedelta(seconds=1))
    out = io.StringIO()
    call_command("agent_token", "gone", user="dad", stdout=out)
    call_command("agent_token", "--revoke", "gone", stdout=io.StringIO())
    for _ in range(4):
        assert api(old).status_code == 401
        assert api(out.getvalue().strip()).status_code == 401
    _, token = issue(name="pippa", user=dad)
    assert api(token).status_code == 200
