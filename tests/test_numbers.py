"""Numbers from outside (issue 24, item 7): a query string, a form, the live socket's parameters
and the API's are read by one helper, `loop.numbers`, in ASCII digits only. `str.isdigit()`
takes '²' (then `int()` refuses it: it was a 500 with a traceback), and `int()` takes '١٢' and
'１２'; each door now answers such a number with a 400 naming the parameter (the socket: a close
with 4400), never a 500 or a 1011."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from loop import numbers
from loop.api.core import issue
from loop.models import Step
from loop.web import live
from loop.web.consumers import BAD_REQUEST, LiveConsumer

from .conftest import make_task, step
from .test_admin_plan_edits import admin_client, form_index, open_form

# the number reader: database-independent, tried on the SQLite run
pytestmark = pytest.mark.sqlite_only

HOSTILE = ["²", "١٢", "１２", "12²", " 12", "12 ", "+12", "1_2", "0x1f", "1e3", "", "-", "9" * 40]


@pytest.mark.parametrize("text", HOSTILE)
def test_the_helper_reads_ascii_digits_only_and_names_the_field(text: str) -> None:
    with pytest.raises(numbers.NotANumber, match=r"^page: must be a whole number"):
        numbers.whole(text, "page")
    assert "²".isdigit() and int("١٢") == 12  # what the standard library would have taken


def test_the_helper_reads_what_a_person_means_within_its_bounds() -> None:
    assert numbers.whole("0012", "n") == 12
    assert numbers.whole("-3", "n") == -3
    assert numbers.number("0.05", "n") == 0.05 and numbers.number(".5", "n") == 0.5
    with pytest.raises(numbers.NotANumber, match="n: must be a whole number from 1 to 9, not '10'"):
        numbers.whole("10", "n", low=1, high=9)
    for text in ("nan", "inf", "1e3", "١.٥", "1.5.1"):
        with pytest.raises(numbers.NotANumber, match="n: must be a number of 0 or more"):
            numbers.number(text, "n", low=0)


@pytest.fixture
def dad_client(dad: User) -> Client:
    client = Client()
    client.force_login(dad)
    return client


@pytest.mark.parametrize("start", ["²", "١", "１", "-1", "9" * 30, "1.0"])
def test_the_task_page_answers_a_bad_from_with_400_naming_it(
    dad_client: Client, start: str
) -> None:
    task = make_task(step("a"), step("b"))
    response = dad_client.get(f"/tasks/{task.pk}", {"from": start})
    assert response.status_code == 400
    assert response.content.decode().startswith("from: must be a whole number")
    assert dad_client.get(f"/tasks/{task.pk}", {"from": "1"}).status_code == 200


@pytest.mark.parametrize("start", ["²", "١٢", "-1", "9" * 30])
def test_the_admin_answers_a_bad_steps_from_with_400_naming_it(db: None, start: str) -> None:
    task = make_task(step("a"), step("b"))
    client = admin_client(None)
    response = client.get(f"/admin/loop/task/{task.pk}/change/", {"steps_from": start})
    assert response.status_code == 400
    assert response.content.decode().startswith("steps_from: must be a whole number")
    assert client.get(f"/admin/loop/task/{task.pk}/change/", {"steps_from": "1"}).status_code == 200


def test_the_admin_form_refuses_a_position_in_other_digits_and_its_counts_do_not_500(
    db: None,
) -> None:
    task = make_task(step("a"), step("b"))
    client = admin_client(None)
    data = open_form(client, task)
    a = Step.objects.get(task=task, key="a")
    index = form_index(data, a)
    url = f"/admin/loop/task/{task.pk}/change/"
    # '١' is a 1 to int(): Django's own IntegerField would have moved the step.
    response = client.post(url, {**data, f"steps-{index}-position": "١"})
    assert response.status_code == 200 and "Enter a whole number." in response.content.decode()
    a.refresh_from_db()
    assert a.position == 0
    # The management form's count and the steps' ids, as a hostile form posts them.
    for hostile in ({"steps-TOTAL_FORMS": "²"}, {f"steps-{index}-id": "²"}):
        response = client.post(url, {**data, **hostile})
        assert response.status_code in (200, 302), response.status_code
    assert [s.position for s in Step.objects.filter(task=task).order_by("key")] == [0, 1]


@pytest.mark.parametrize("after", ["²", "١٢", "１２", " 1", "+1", "1_0", "1.0"])
def test_the_api_answers_a_bad_after_with_400_naming_it(dad: User, after: str) -> None:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {issue(name='pippa', user=dad)[1]}")
    for path in ("/api/events", "/api/messages"):
        response = client.get(path, {"after": after})
        assert response.status_code == 400, (path, response.content)
        assert response.json()["error"] == "after: must be an integer"
    assert client.get("/api/events", {"after": "-1"}).status_code == 200


# ---- the live socket ---------------------------------------------------------------------


@pytest.fixture
def own_channel_layer() -> Any:
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    yield
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


async def close_code(user: User, query: bytes) -> int:
    """The code the socket is closed with, right after its handshake, for this query string."""
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live")
    communicator.scope["query_string"] = query
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    closing = await communicator.receive_output(timeout=10)
    assert closing["type"] == "websocket.close", closing
    return int(closing["code"])


@pytest.mark.parametrize(
    "query",
    [
        "topic=task-²",
        "topic=task-١",
        "topic=home&seen=²",
        "topic=home&seen=1,²,3",
        "topic=home&after=²",
        "topic=home&after=١٢",
        "topic=home&after=x",
        "topic=home&after=-1",
        f"topic=home&after={2**64}",
        f"topic=task-{2**64}",
    ],
)
def test_the_live_socket_closes_with_4400_on_a_parameter_that_is_no_id(
    transactional_db: None, guest: User, own_channel_layer: None, query: str
) -> None:
    async def scenario() -> None:
        assert await close_code(guest, query.encode()) == BAD_REQUEST
        await live.tailer().stop()

    async_to_sync(scenario)()


def test_the_live_socket_ignores_what_a_client_sends_and_bytes_that_are_not_utf8(
    transactional_db: None, guest: User, own_channel_layer: None
) -> None:
    task = make_task(step("a"))

    async def scenario() -> None:
        assert await close_code(guest, b"topic=home&after=\xff\xfe") == BAD_REQUEST
        assert await close_code(guest, b"topic=\xff") == 4404
        communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live")
        communicator.scope["query_string"] = f"topic=task-{task.pk}".encode()
        communicator.scope["user"] = guest
        assert (await communicator.connect(timeout=10))[0]
        await communicator.send_to(text_data="not json {")
        await communicator.send_to(bytes_data=b"\x00\xff")
        while not await communicator.receive_nothing(timeout=0.3):  # the live feed, if any
            said = await communicator.receive_output(timeout=5)
            assert said["type"] == "websocket.send", said  # still open: no close
        await communicator.disconnect()  # raises what the consumer raised, if anything
        await live.tailer().stop()

    async_to_sync(scenario)()
