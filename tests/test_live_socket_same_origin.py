"""The live socket opens only for this site's own pages: a page on another port of the same
host (or another host) is refused at the handshake, before the session is read, though its
browser would send Dad's cookies (the host matches ALLOWED_HOSTS; the port does not)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from pippa_site.asgi import application

# the socket's origin check: database-independent, tried on the SQLite run
pytestmark = pytest.mark.sqlite_only

HOST = (b"host", b"127.0.0.1:8000")


def handshake(origin: bytes | None, *, cookie: str = "") -> tuple[bool, Any]:
    headers = [HOST] + ([(b"origin", origin)] if origin is not None else [])
    if cookie:
        headers.append((b"cookie", cookie.encode()))

    async def scenario() -> tuple[bool, Any]:
        communicator = WebsocketCommunicator(application, "/ws/live?topic=home&after=0", headers)
        connected, code = await communicator.connect(timeout=5)
        if connected:
            closing = await communicator.receive_output(timeout=5)
            await communicator.disconnect()
            return True, closing.get("code")
        return False, code

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    "origin",
    [b"http://127.0.0.1:3000", b"http://127.0.0.1", b"http://localhost:8000", b"null", b"x", None],
)
def test_a_page_of_another_origin_is_refused_at_the_handshake(
    transactional_db: None, dad: User, origin: bytes | None
) -> None:
    client = Client()
    client.force_login(dad)
    session = f"sessionid={client.cookies['sessionid'].value}"
    assert handshake(origin, cookie=session)[0] is False


@pytest.mark.parametrize("origin", [b"http://127.0.0.1:8000", b"https://127.0.0.1:8000"])
def test_its_own_pages_reach_the_login_check(transactional_db: None, origin: bytes) -> None:
    assert handshake(origin) == (True, 4401)  # accepted, then refused: not logged in


def test_a_trusted_origin_is_let_in(transactional_db: None, settings: Any) -> None:
    """A proxy that rewrites Host: the page's origin is named in CSRF_TRUSTED_ORIGINS (its host
    must be in ALLOWED_HOSTS too)."""
    settings.CSRF_TRUSTED_ORIGINS = ["http://localhost:8000"]
    assert handshake(b"http://localhost:8000") == (True, 4401)
