"""Browsers ask every page's icon, the admin's too: it is there, so no page logs a 404 in the
console (which hid real errors, such as a CSP refusal, among expected ones)."""

from __future__ import annotations

from typing import Any

from django.contrib.staticfiles import finders
from django.test import Client


def test_favicon_ico_leads_to_an_icon_that_exists(db: None) -> None:
    answer = Client().get("/favicon.ico")
    assert answer.status_code == 301
    assert answer["Location"] == "/static/loop/favicon.svg"
    found = finders.find("loop/favicon.svg")
    assert found and "<svg" in open(str(found), encoding="utf-8").read()


def test_the_pages_link_their_icon(dad: Any) -> None:
    client = Client()
    client.force_login(dad)
    pages = [client.get("/"), client.get("/tasks/new")]
    client.logout()
    pages.append(client.get("/accounts/login/"))
    for page in pages:
        assert page.status_code == 200
        assert '<link rel="icon" href="/static/loop/favicon.svg"' in page.content.decode()
