"""Every response carries a Content-Security-Policy that the pages keep to (no inline script or
style anywhere in templates/); TLS settings come from the environment."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from .conftest import ROOT, make_task, process_env, step

CSP = "Content-Security-Policy"


def directives(header: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in header.split(";"))


def test_every_page_carries_the_policy(dad: User) -> None:
    task = make_task(step("a"))
    dad.is_staff = True
    dad.save(update_fields=["is_staff"])
    anonymous = Client()
    assert directives(anonymous.get("/accounts/login/")[CSP])["script-src"] == "'self'"
    client = Client()
    client.force_login(dad)
    for path in ("/", f"/tasks/{task.pk}", "/tasks/new", "/admin/", "/healthz", "/api/tasks"):
        response = client.get(path)
        assert response.status_code in (200, 401, 503), path
        policy = directives(response[CSP])
        assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'", path
        assert policy["connect-src"] == "'self' ws://testserver", path
        assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'", path


def test_behind_a_tls_proxy_the_socket_is_wss(dad: User, settings: Any) -> None:
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client(HTTP_X_FORWARDED_PROTO="https", HTTP_HOST="localhost")
    client.force_login(dad)
    assert directives(client.get("/")[CSP])["connect-src"] == "'self' wss://localhost"


def test_the_policy_setting_replaces_the_default(db: None, settings: Any) -> None:
    settings.CONTENT_SECURITY_POLICY = "default-src 'none'"
    assert Client().get("/accounts/login/")[CSP] == "default-src 'none'"


def test_templates_have_no_inline_script_style_or_handler() -> None:
    """What the policy would block in a browser, found before it gets there."""
    inline = re.compile(
        r"<script(?![^>]*\bsrc=)[^>]*>|<style\b|\sstyle=|\son[a-z]+=|\shx-on[:-]|javascript:", re.I
    )
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
        for path in (ROOT / "templates").rglob("*.html")
        for match in inline.finditer(path.read_text())
    ]
    assert found == []


def settings_under(env: dict[str, str]) -> dict[str, Any]:
    names = [
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SECURE_HSTS_SECONDS",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS",
        "SECURE_SSL_REDIRECT",
        "SECURE_PROXY_SSL_HEADER",
    ]
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n) for n in {names!r}}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**process_env(), "DJANGO_SETTINGS_MODULE": "pippa_site.settings", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


@pytest.mark.django_db
def test_tls_settings_come_from_the_environment() -> None:
    assert settings_under({}) == {
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_PROXY_SSL_HEADER": None,
    }
    assert settings_under(
        {
            "SESSION_COOKIE_SECURE": "true",
            "CSRF_COOKIE_SECURE": "true",
            "SECURE_HSTS_SECONDS": "31536000",
            "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
            "SECURE_SSL_REDIRECT": "true",
            "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
        }
    ) == {
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
    }


def test_secure_cookies_and_hsts_when_set(dad: User, settings: Any) -> None:
    settings.SESSION_COOKIE_SECURE = True
    settings.CSRF_COOKIE_SECURE = True
    settings.SECURE_HSTS_SECONDS = 3600
    client = Client()
    page = client.get("/accounts/login/", secure=True)
    assert page["Strict-Transport-Security"] == "max-age=3600"
    assert page.cookies["csrftoken"]["secure"]
    token = page.cookies["csrftoken"].value
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = token
    login = client.post(
        "/accounts/login/",
        {"username": "dad", "password": "dad-password-1", "csrfmiddlewaretoken": token},
        secure=True,
        headers={"Referer": "https://testserver/accounts/login/"},
    )
    assert login.status_code == 302
    assert login.cookies["sessionid"]["secure"]
