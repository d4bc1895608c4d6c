"""Plain words at display (loop/web/words.py, issue 28): the loop's errors and actor ids as a
person reads them. The pages' glossary test (test_every_page.py) checks them rendered."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from loop.web.words import person, plain_error

pytestmark = pytest.mark.sqlite_only


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        (
            "TransientError: [Errno 111] Connection refused",
            "connection refused (nothing answers at that address)",
        ),
        (
            "step 'notify': ConnectionRefusedError: [Errno 111] Connection refused",
            "step 'notify': connection refused (nothing answers at that address)",
        ),
        ("socket.gaierror: [Errno -2] Name or service not known", "no such host name"),
        ("TimeoutError", "no answer in time"),
        ("host not in LOOP_HTTP_ALLOW", "host not in the hosts the loop may call"),
        ("LOOP_SOMETHING_NEW is off", "a site setting is off"),
        ("key " + "ab" * 32, "key abababab…"),
        ("runs on the next tick", "runs on the next pass of the loop"),
        ("superseded by task 4", "replaced by task 4"),
        ("", ""),
    ],
)
def test_errors_in_plain_words(stored: str, shown: str) -> None:
    assert plain_error(stored) == shown


def test_people_by_their_display_names(db: None) -> None:
    User.objects.create_user("dad", first_name="Dad")
    User.objects.create_user("mum")
    assert person("dad") == "Dad"
    assert person("admin:dad") == "Dad"
    assert person("cli:dad") == "Dad (command line)"
    assert person("cli:root") == "the operator (command line)"
    assert person("mum") == "mum"
    assert person("worker:3") == person("boot:host:12") == person("system") == "the loop"
    assert person("agent:pippa") == "agent pippa"
    assert person("pippa") == "Pippa"
    assert (
        plain_error("asked by cli:dad, then worker:2")
        == "asked by Dad (command line), then the loop"
    )


def test_a_setting_with_its_value() -> None:
    said = plain_error("no heartbeat for 10 s (LOOP_WORKER_LATE_AFTER=8.5): frozen")
    assert said == "no heartbeat for 10 s (late after, in seconds: 8.5): frozen"
