"""Secrets by name (issue 24, item 4; DESIGN.md §19): a call names `${secret:NAME}`, and only the
tool's run, at the moment the call is made, has the value (`loop/tools/vault.py`). The step's
args, the effect's request and id, the question, the journal, the transcript and the model keep
the reference; what the world answers is kept with each value written as "[secret NAME]"; a
person sees every other header and field in full."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core import serializers
from django.core.management import call_command
from django.test import Client

from loop import actions, effects, plans, questions, tools
from loop.models import Effect, Event, Message, Step, Task, TranscriptEntry
from loop.permissions import SYSTEM
from loop.tools import vault
from loop.worker import Worker

from .conftest import ROOT, make_task, process_env, run_until_idle, step
from .support.llm_server import call, commit, tool_results

TOKEN = "tok-7Hq!x/ä+%=&"  # a value with characters JSON and URLs escape
AMOUNT = "1000000"


@dataclass
class Echo:
    """An HTTP server on 127.0.0.1 that answers every request with what it received (JSON:
    method, path, headers, body), with the status given for the path (`/status/400` → 400)."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    def __enter__(self) -> Echo:
        echo = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen = {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": body.decode("utf-8", "replace"),
                }
                echo.requests.append(seen)
                status = int(self.path.split("/status/")[1][:3]) if "/status/" in self.path else 200
                data = json.dumps(seen).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _answer  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def echo() -> Iterator[Echo]:
    with Echo() as server:
        yield server


@pytest.fixture
def pay_token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PIPPA_SECRET_PAY_TOKEN", TOKEN)
    return TOKEN


def stored(value: str) -> list[str]:
    """Every row of the loop's tables whose serialized form holds `value` (as it is, or as JSON
    escapes it): where a secret would have leaked to."""
    escaped = json.dumps(value)[1:-1]
    found = []
    for model in (Task, Step, Effect, Event, TranscriptEntry, Message):
        for row in json.loads(serializers.serialize("json", model.objects.all())):
            text = json.dumps(row, ensure_ascii=False)
            if value in text or escaped in text:
                found.append(f"{model.__name__} {row['pk']}")
    return found


def only(task: Task) -> Step:
    return Step.objects.get(task=task)


# ---- a side effect and a read, end to end ----------------------------------------------------


def test_a_post_sends_the_value_and_keeps_only_the_reference_everywhere(
    worker: Worker, echo: Echo, pay_token: str
) -> None:
    args = {
        "url": echo.url("/charge"),
        "headers": {"Authorization": "Bearer ${secret:PAY_TOKEN}", "X-Secret-Amount": AMOUNT},
        "json": {"amount": AMOUNT, "token": "${secret:PAY_TOKEN}"},
    }
    task = make_task(step("pay", "http.post", args=args))
    run_until_idle(worker)
    [sent] = echo.requests
    assert sent["headers"]["Authorization"] == f"Bearer {TOKEN}"  # the world got the value
    assert json.loads(sent["body"]) == {"amount": AMOUNT, "token": TOKEN}
    pay = only(task)
    effect = Effect.objects.get(step=pay)
    assert pay.state == "done" and effect.state == "succeeded"
    # The request as recorded, and so its id and Idempotency-Key, hold the reference.
    assert effect.request == args
    assert effect.pk == effects.effect_id(pay, "http.post", args)
    assert sent["headers"]["Idempotency-Key"] == effect.pk
    # What came back echoed the value: it is kept as the secret's name.
    assert pay.output["body"]["headers"]["Authorization"] == "Bearer [secret PAY_TOKEN]"
    assert json.loads(pay.output["body"]["body"])["token"] == "[secret PAY_TOKEN]"
    assert effect.response == pay.output
    assert stored(TOKEN) == []


def test_a_get_with_a_secret_in_its_url_keeps_it_out_of_its_output(
    worker: Worker, echo: Echo, pay_token: str
) -> None:
    task = make_task(step("look", "http.get", args={"url": echo.url("/q?key=${secret:PAY_TOKEN}")}))
    run_until_idle(worker)
    [sent] = echo.requests
    assert TOKEN.encode().decode() in _unquoted(sent["path"])
    look = only(task)
    assert look.state == "done"
    assert look.output["url"].endswith("/q?key=[secret PAY_TOKEN]")
    assert look.output["body"]["path"] == "/q?key=[secret PAY_TOKEN]"  # percent-encoded there
    assert stored(TOKEN) == []


def _unquoted(path: str) -> str:
    from urllib.parse import unquote

    return unquote(path)


def test_an_error_that_echoes_a_secret_keeps_only_its_name(
    worker: Worker, echo: Echo, pay_token: str
) -> None:
    task = make_task(
        step(
            "pay",
            "http.post",
            args={"url": echo.url("/status/400"), "body": "card=${secret:PAY_TOKEN}"},
        )
    )
    run_until_idle(worker)
    pay = only(task)
    assert pay.state == "failed" and "HTTP 400" in pay.error
    assert "card=[secret PAY_TOKEN]" in pay.error  # the receiver's answer, as kept
    assert stored(TOKEN) == []


# ---- names: refused when written, failed when gone -------------------------------------------


def test_an_unknown_secret_is_refused_when_the_plan_is_written_naming_it(db: None) -> None:
    with pytest.raises(plans.PlanError) as refused:
        make_task(
            step(
                "pay",
                "http.post",
                args={"url": "https://pay.example/x", "headers": {"X-Key": "${secret:NOPE}"}},
            )
        )
    assert refused.value.errors == [
        "step 'pay': args.headers.X-Key: no secret 'NOPE' (PIPPA_SECRET_<NAME> or LOOP_SECRETS_FILE)"
    ]
    with pytest.raises(plans.PlanError, match=r"args.value: '1-bad' is not a secret's name"):
        make_task(step("e", args={"value": "${secret:1-bad}"}))
    with pytest.raises(plans.PlanError, match="a secret can't be the name of a field"):
        make_task(step("e", args={"value": {"${secret:PAY_TOKEN}": 1}}))
    assert not Task.objects.exists()


def test_a_secret_gone_since_the_plan_was_written_fails_the_step_and_sends_nothing(
    worker: Worker, echo: Echo, pay_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_task(
        step("look", "http.get", args={"url": echo.url("/x?k=${secret:PAY_TOKEN}")}),
        step("pay", "http.post", args={"url": echo.url(), "body": "${secret:PAY_TOKEN}"}),
    )
    monkeypatch.delenv("PIPPA_SECRET_PAY_TOKEN")
    run_until_idle(worker)
    look = Step.objects.get(task=task, key="look")
    assert look.state == "failed"
    assert look.error == (
        "step 'look': args.url: no secret 'PAY_TOKEN' (PIPPA_SECRET_<NAME> or LOOP_SECRETS_FILE)"
    )
    actions.resume(task_id=task.pk, actor="dad", user=SYSTEM)  # go on past the failed read
    run_until_idle(worker)
    pay = Step.objects.get(task=task, key="pay")
    assert pay.state == "failed" and "args.body: no secret 'PAY_TOKEN'" in pay.error
    assert not Effect.objects.filter(step=pay).exists()  # refused before its intent
    assert echo.requests == []


def test_a_secret_gone_between_the_intent_and_the_send_fails_the_effect_unsent(
    worker: Worker, echo: Echo, pay_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_task(
        step("pay", "http.post", args={"url": echo.url(), "body": "${secret:PAY_TOKEN}"})
    )
    pay = only(task)
    tool = tools.get("http.post")
    holder = effects.Holder(owner=1, epoch=0, actor="test")
    [intent] = effects.intend_all([effects.Request(holder, pay, tool, pay.args)])
    assert isinstance(intent.found, Effect)
    monkeypatch.delenv("PIPPA_SECRET_PAY_TOKEN")
    with pytest.raises(tools.ToolError, match="no secret 'PAY_TOKEN'.*nothing was sent"):
        tool.run(pay.args, intent.found.pk)
    assert echo.requests == []


# ---- what a person is shown -------------------------------------------------------------------


def test_may_i_shows_every_header_in_full_and_a_secret_by_its_name(
    dad: Any, worker: Worker, echo: Echo, pay_token: str
) -> None:
    """The attacker's headers: a name that "looks like a credential" hid the amount and the
    recipient from Dad. Now only a secret is not shown, by its name."""
    args = {
        "url": echo.url("/pay"),
        "headers": {
            "X-Secret-Amount": AMOUNT,
            "X-Password-Recipient": "mallory@example.com",
            "Authorization": "Bearer ${secret:PAY_TOKEN}",
        },
        "json": {"to": "mallory"},
    }
    task = make_task(step("pay", "http.post", args=args, confirm_before=True))
    run_until_idle(worker)
    pay = only(task)
    assert pay.state == "blocked"
    question = questions.question(pay, Effect.objects.filter(step=pay))
    assert question is not None
    [request] = question.requests
    headers = next(f.text for f in request.fields if f.label == "Headers").splitlines()
    assert f"X-Secret-Amount: {AMOUNT}" in headers
    assert "X-Password-Recipient: mallory@example.com" in headers
    assert "Authorization: Bearer [secret PAY_TOKEN]" in headers
    # The page, the CLI's JSON and the API show the same, and never the value.
    client = Client()
    client.force_login(dad)
    page = client.get(f"/tasks/{task.pk}").content.decode()
    assert f"X-Secret-Amount: {AMOUNT}" in page and "[secret PAY_TOKEN]" in page
    assert TOKEN not in page
    for command in (["task", str(task.pk), "--json"], ["task", str(task.pk)]):
        out = io.StringIO()
        call_command(*command, stdout=out)
        assert "X-Password-Recipient: mallory@example.com" in out.getvalue()
        assert "[secret PAY_TOKEN]" in out.getvalue() and TOKEN not in out.getvalue()
    assert echo.requests == []
    assert stored(TOKEN) == []


# ---- the model ----------------------------------------------------------------------------


def test_the_model_sends_a_secret_only_in_a_call_dad_answered_for(
    llm: Any, worker: Worker, echo: Echo, pay_token: str, dad: Any
) -> None:
    """A model's call is Pippa's, not Dad's: a secret she names in a call nobody answered for
    (a read-only GET to wherever she likes) is refused, nothing sent; in a call Dad allowed,
    as the question showed it ("[secret PAY_TOKEN]" to that address), it is filled in. She
    never sees the value either way."""
    url = echo.url("/account?token=${secret:PAY_TOKEN}")

    def script(body: dict[str, Any], n: int) -> Any:
        said = tool_results(body["messages"])
        if not said:
            return call("http_get", url=url, headers={"X-Token": "${secret:PAY_TOKEN}"})
        if len(said) == 1:
            return call(
                "http_post", url=url, json={"pay": 5}, headers={"X-Token": "${secret:PAY_TOKEN}"}
            )
        return commit(output={"ok": True})

    server = llm(script)
    task = make_task(
        {
            "key": "look",
            "judge": "model",
            "instructions": "Pay from my account.",
            "tools": ["http.get", "http.post"],
            "side_effect": True,
            "confirm_before": True,
        }
    )
    run_until_idle(worker)
    asking = only(task)
    assert asking.state == "blocked" and echo.requests == []
    refused = tool_results(server.requests[1]["messages"])[0]
    assert "filled in only in a call a person wrote or answered for exactly" in refused
    assert "[secret PAY_TOKEN]" in asking.question_text and TOKEN not in asking.question_text
    actions.unblock(step_id=asking.pk, decision="allow", actor="dad", user=dad)
    run_until_idle(worker)
    assert only(task).state == "done"
    [sent] = echo.requests
    assert sent["headers"]["X-Token"] == TOKEN and sent["method"] == "POST"
    assert all(TOKEN not in json.dumps(r) for r in server.requests)
    assert stored(TOKEN) == []
    entries = TranscriptEntry.objects.filter(step=only(task), role="assistant").order_by("seq")
    assert "${secret:PAY_TOKEN}" in json.dumps(entries[0].tool_calls)  # the reference, kept


def test_a_read_only_step_pippa_added_gets_no_secret(
    llm: Any, worker: Worker, echo: Echo, pay_token: str
) -> None:
    look = {
        "key": "peek",
        "tool": "http.get",
        "args": {"url": echo.url("/x?t=${secret:PAY_TOKEN}")},
    }

    def script(body: dict[str, Any], n: int) -> Any:
        if not tool_results(body["messages"]):
            return call("add_steps", steps=[look])
        return commit(output="planned")

    llm(script)
    task = make_task({"key": "plan", "judge": "model", "instructions": "Plan."})
    run_until_idle(worker)
    peek = Step.objects.get(task=task, key="peek")
    assert peek.writer == "pippa" and peek.state == "failed"
    assert "Pippa and agents may not send secrets on their own" in peek.error
    assert echo.requests == []


# ---- the store ----------------------------------------------------------------------------


def private_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secrets"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "text",
    ['{"PAY_TOKEN": "from-file", "OTHER": "x"}', "# keys\nPAY_TOKEN=from-file\n\nOTHER=x=y\n"],
)
def test_the_file_holds_secrets_as_json_or_lines_and_the_environment_comes_first(
    db: None, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    settings.LOOP_SECRETS_FILE = str(private_file(tmp_path, text))
    monkeypatch.delenv("PIPPA_SECRET_PAY_TOKEN", raising=False)
    assert vault.lookup("PAY_TOKEN") == "from-file"
    assert vault.lookup("OTHER") in ("x", "x=y")
    monkeypatch.setenv("PIPPA_SECRET_PAY_TOKEN", "from-env")
    assert vault.lookup("PAY_TOKEN") == "from-env"
    assert vault.lookup("NOPE") is None


def test_a_file_others_may_read_is_not_read_and_the_plan_says_why(
    db: None, settings: Any, tmp_path: Path
) -> None:
    path = private_file(tmp_path, "PAY=x\n", mode=0o644)
    settings.LOOP_SECRETS_FILE = str(path)
    with pytest.raises(plans.PlanError, match=r"mode 0600, owned by uid \d+\), not mode 0644"):
        make_task(step("e", args={"value": "${secret:PAY}"}))
    path.chmod(0o600)
    make_task(step("e", args={"value": "${secret:PAY}"}))  # the file is read again once private


@pytest.mark.parametrize(
    ("text", "mode", "says"),
    [
        ("PAY=x\n", 0o640, "not mode 0640"),
        ("just words\n", 0o600, "line 1 is not NAME=value"),
        ('{"PAY": 1}', 0o600, "the value of 'PAY' must be a string"),
        ("BAD NAME=x\n", 0o600, "'BAD NAME' is not a secret's name"),
    ],
)
def test_a_secrets_file_that_cannot_be_used_stops_the_process_with_one_line(
    db: None, tmp_path: Path, text: str, mode: int, says: str
) -> None:
    path = private_file(tmp_path, text, mode)
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks"],
        capture_output=True,
        text=True,
        env=process_env(LOOP_SECRETS_FILE=str(path)),
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.startswith(f"settings: LOOP_SECRETS_FILE {path}: ")
    assert says in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr


def test_the_redaction_covers_each_spelling_longest_first() -> None:
    used = {"A": "ab/c d", "B": "ab"}
    out = vault.redact(
        {"x": "ab/c d|ab%2Fc%20d|ab%2Fc+d|ab", "ab": ["ab/c d"]},
        used,
    )
    assert out == {
        "x": "[secret A]|[secret A]|[secret A]|[secret B]",
        "[secret B]": ["[secret A]"],
    }
    assert vault.redact({"x": "plain"}, {}) == {"x": "plain"}
    assert os.environ.get("PIPPA_SECRET_A") is None


def test_tools_run_directly_resolve_too_and_an_unknown_name_is_a_tool_error(
    db: None, echo: Echo, pay_token: str
) -> None:
    out = tools.get("http.get").run({"url": echo.url("/?t=${secret:PAY_TOKEN}")})
    assert out["url"].endswith("/?t=[secret PAY_TOKEN]")
    with pytest.raises(tools.ToolError, match="no secret 'GONE'"):
        tools.get("echo").run({"value": "${secret:GONE}"})
    assert tools.get("echo").run({"value": "${secret:PAY_TOKEN}"}) == {
        "value": "[secret PAY_TOKEN]"
    }
