"""Branded 404 and 500 pages (issue 28), rendered by Django's own handlers with DEBUG off: the
site's look, a way home, no traceback and no machine words."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory

from loop.web.unavailable import server_error

pytestmark = pytest.mark.sqlite_only


def test_an_unknown_address_gets_the_branded_404(db: None) -> None:
    answer = Client().get("/no/such/page")
    page = answer.content.decode()
    assert answer.status_code == 404
    assert "There is no such page" in page and 'href="/"' in page and "loop/app.css" in page


def test_an_error_gets_the_branded_500_without_a_traceback() -> None:
    request = RequestFactory().get("/tasks/1")
    try:
        raise ZeroDivisionError("a bug")
    except ZeroDivisionError:
        answer = server_error(request)  # handler500, as Django calls it inside the except
    page = answer.content.decode()
    assert answer.status_code == 500
    assert "Something went wrong on our side" in page and "loop/app.css" in page
    assert "ZeroDivisionError" not in page and "Traceback" not in page
