"""Receivers listed in LOOP_IDEMPOTENT_RECEIVERS deduplicate on `Idempotency-Key`, so a POST or
PUT to one is safe to repeat: a cut sends it again with the same key instead of asking, boot
reconciliation puts it back to `pending`, and its 5xx or 409 is retried, not doubted. A URL
matches a listed prefix by scheme, host, port and whole path segments, nothing looser."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from loop import tools
from loop.models import Effect, Event, Step, Task
from loop.tools import receivers
from loop.worker import Worker

from .conftest import (
    ROOT,
    kill,
    make_task,
    process_env,
    run_until_idle,
    start_runloop,
    step,
    wait_for,
)
from .support.cuts import claimed_not_sent, cut, next_worker, sent_not_recorded
from .support.sinks import Receiver

PAY = "https://pay.example.com/v1"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def pay(url: str, **fields: Any) -> dict[str, Any]:
    return step("pay", "http.post", args={"url": url, "json": {"amount": 5}}, **fields)


@pytest.mark.parametrize(
    "url",
    [
        "https://pay.example.com/v1",
        "https://pay.example.com/v1/",
        "https://pay.example.com/v1/charges?x=1",
        "https://PAY.example.com:443/v1/charges",  # the host's case and the default port
        "HTTPS://pay.example.com/v1/charges",
    ],
)
def test_a_url_under_a_listed_prefix_matches(url: str) -> None:
    assert receivers.honours_key(url, [PAY])


@pytest.mark.parametrize(
    "url",
    [
        "https://pay.example.com.evil.net/v1/charges",  # another host that starts alike
        "https://pay.example.com@evil.net/v1/charges",  # a user name, then another host
        "https://evil.net/https://pay.example.com/v1",
        "http://pay.example.com/v1/charges",  # another scheme
        "https://pay.example.com:8443/v1/charges",  # another port
        "https://pay.example.com/v10/charges",  # a path that only starts alike
        "https://pay.example.com/",
        "https://pay.example.com/v1/../admin",  # dot segments: the receiver may resolve them
        "https://pay.example.com/v1/%2e%2e/admin",
        "https://pay.example.com/v1%2f..%2fadmin",
        "not a url",
    ],
)
def test_a_url_outside_every_listed_prefix_does_not_match(url: str) -> None:
    assert not receivers.honours_key(url, [PAY])


def test_a_plan_that_sets_its_own_host_header_is_not_treated_as_the_listed_receiver(
    settings: Any,
) -> None:
    settings.LOOP_IDEMPOTENT_RECEIVERS = [PAY]
    post = tools.get("http.post")
    assert post.repeatable({"url": f"{PAY}/charges"})
    assert not post.repeatable({"url": f"{PAY}/charges", "headers": {"host": "other.example"}})
    assert not tools.get("email.send").repeatable({"to": ["a@b"], "subject": "", "body": ""})
    assert tools.get("sql.execute").repeatable({"sql": "SELECT 1"})  # its own table dedupes


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("https://x:y@pay.example.com/", "user name or password"),
        ("https://pay.example.com/v1?a=1", "scheme, host, port and path only"),
        ("ftp://pay.example.com/", "http(s) URL"),
        ("https://pay.example.com/v1/../x", "'..' segment"),
    ],
)
def test_the_setting_refuses_an_entry_that_is_not_a_plain_url_prefix(entry: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"{re.escape(repr(entry))}.*{re.escape(why)}"):
        receivers.parse(entry)


def test_a_worker_will_not_start_with_a_bad_entry_in_the_setting() -> None:
    env = process_env(LOOP_IDEMPOTENT_RECEIVERS="https://pay.example.com/, https://u@evil.net/")
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "runloop", "--once"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode != 0
    assert "LOOP_IDEMPOTENT_RECEIVERS: 'https://u@evil.net/'" in result.stderr


@pytest.mark.parametrize("partway", [sent_not_recorded, claimed_not_sent])
def test_a_cut_post_to_a_listed_receiver_is_sent_again_with_the_same_key(
    db: None, receiver: Receiver, settings: Any, partway: Any
) -> None:
    settings.LOOP_IDEMPOTENT_RECEIVERS = [receiver.url("/")]
    task = make_task(pay(receiver.url("/pay")))
    cut(task, partway)
    run_until_idle(next_worker())
    done, effect = Step.objects.get(task=task), Effect.objects.get(task=task)
    assert done.state == "done" and not done.question_kind
    assert effect.safe_to_repeat and (effect.state, effect.sends) == ("succeeded", 2)
    assert not Event.objects.filter(kind="step_blocked").exists()
    sent = 2 if partway is sent_not_recorded else 1
    assert [r.key for r in receiver.posts] == [effect.pk] * sent  # the same key each time


def test_a_cut_post_to_a_receiver_not_listed_still_asks(
    db: None, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_IDEMPOTENT_RECEIVERS = [receiver.url("/listed")]
    task = make_task(pay(receiver.url("/pay")))
    cut(task, sent_not_recorded)
    run_until_idle(next_worker())
    assert Step.objects.get(task=task).question_kind == "did_it_happen"
    assert Effect.objects.get(task=task).state == "uncertain"
    assert len(receiver.posts) == 1


@pytest.mark.parametrize("status", ["500", "409"])
def test_a_listed_receivers_5xx_or_409_is_retried_with_the_same_key_without_asking(
    worker: Worker, receiver: Receiver, settings: Any, status: str
) -> None:
    settings.LOOP_IDEMPOTENT_RECEIVERS = [receiver.url("/")]
    settings.LOOP_RETRY_BASE_SECONDS = 0
    receiver.behave(status)
    task = make_task(pay(receiver.url("/pay")))
    run_until_idle(worker)
    done, effect = Step.objects.get(task=task), Effect.objects.get(task=task)
    assert done.state == "done" and done.attempts == 2 and not done.question_kind
    assert (effect.state, effect.sends) == ("succeeded", 2)
    assert [r.key for r in receiver.posts] == [effect.pk, effect.pk]


def test_a_409_from_a_receiver_not_listed_is_a_refusal(worker: Worker, receiver: Receiver) -> None:
    receiver.behave("409")
    task = make_task(pay(receiver.url("/pay")))
    run_until_idle(worker)
    assert Step.objects.get(task=task).state == "failed"
    assert Effect.objects.get(task=task).state == "failed"


@pytest.mark.slow
def test_boot_puts_a_killed_workers_post_to_a_listed_receiver_back_and_sends_it_again(
    transactional_db: None, receiver: Receiver, processes: list[subprocess.Popen[bytes]]
) -> None:
    env = process_env(
        LOOP_IDEMPOTENT_RECEIVERS=receiver.url("/"),
        LOOP_HTTP_TIMEOUT="300",
        LOOP_IDLE_SLEEP_MS="50",
    )
    receiver.behave("hang")  # the first POST is held: the worker is killed mid-effect
    task = make_task(pay(receiver.url("/pay")))
    doomed = start_runloop("--worker-id", "doomed", env=env)
    processes.append(doomed)
    wait_for(lambda: len(receiver.posts) == 1)
    kill(doomed)
    processes.append(start_runloop("--worker-id", "fresh", env=env))
    wait_for(lambda: Step.objects.filter(task=task, state="done").exists())
    effect = Effect.objects.get(task=task)
    requeued = Event.objects.get(
        kind="effect_state", effect=effect, data__old="running", data__new="pending"
    )
    assert requeued.actor.startswith("boot:")  # the fresh worker's boot, before any claim
    assert (effect.state, effect.sends) == ("succeeded", 2)
    assert [r.key for r in receiver.posts] == [effect.pk, effect.pk]
    assert not Event.objects.filter(kind="step_blocked").exists()
    assert Task.objects.get(pk=task.pk).state == "done"
