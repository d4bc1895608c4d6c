"""The model judge's client (DESIGN.md §12): one non-streaming chat-completions request per
model turn, through the official `openai` package, against any OpenAI-compatible endpoint
(`LOOP_LLM_BASE_URL`: vLLM, llama.cpp's server, Ollama, …).

Every request says `max_tokens` (LOOP_LLM_MAX_TOKENS). The reply's body is read here, at most
LOOP_LLM_MAX_REPLY_BYTES of it, and parsed here (`parse`): whatever the endpoint answers —
not JSON, no choices, a count no model spends — comes back as a value, never an exception.

The client's own retries are off. What comes back:

- `Reply`: the model's reply, its calls beyond LOOP_LLM_MAX_CALLS or with arguments beyond
  LOOP_LLM_MAX_ARG_BYTES marked `refused` (their arguments not kept);
- `Unavailable`: the endpoint is down — a refused connection, 5xx, 429, or a timeout while it
  answers nothing, not even `GET /models` — and stayed down for LOOP_LLM_RETRY_SECONDS,
  retried meanwhile with exponential backoff honouring `Retry-After`, each retry reported to
  the caller (who journals it). Never a verdict on the step;
- `Refused`: the step's problem — a definitive error status (400, 401; 408 and 409 once
  retried), a reply that is no chat completion or over a bound, or an endpoint that is up (it
  answered in this process, or answers `GET /models`) but gave no whole reply in
  LOOP_LLM_TIMEOUT_SECONDS, twice.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings

from .transcript import clean

if TYPE_CHECKING:
    import openai  # imported when first used: a process without model steps never pays for it

# Backoff between retries of a request the endpoint could not answer (seconds).
BACKOFF_FIRST = 0.25
BACKOFF_MAX = 8.0
# A token count the loop believes (and its columns hold): 0 to 2**31 - 1.
COUNT_MAX = 2**31 - 1
# A call id longer than this is replaced (the transcript keeps ids of at most 200 characters).
ID_MAX = 64
# The longest piece of a bad reply quoted in the reason.
QUOTE = 200
# How long the probe (`GET /models`) of an endpoint that timed out may take at most (seconds).
PROBE_SECONDS = 5.0


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # as the model wrote it: JSON text, maybe malformed
    refused: str = ""  # over a bound: why it is not run (its arguments are not kept)

    def as_dict(self) -> dict[str, str]:
        found = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.refused:
            found["refused"] = self.refused
        return found


@dataclass(frozen=True)
class Reply:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Unavailable:
    """The endpoint stayed down for LOOP_LLM_RETRY_SECONDS: why, as last seen."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """The endpoint answered, with nothing the step can use: asking again now will not
    change it (the step's retry may)."""

    reason: str


Answer = Reply | Unavailable | Refused

_client: tuple[tuple[str, str, float], openai.OpenAI] | None = None
_lock = threading.Lock()
_down_until = 0.0
_down_reason = ""
_answered: set[str] = set()  # the endpoints (base URLs) that answered in this process


class _Late(Exception):
    """An endpoint that may be up gave no whole answer in time: a timeout, or a reply cut
    off after its headers (then it is up)."""


def client() -> openai.OpenAI:
    """One client per process and configuration (it keeps its connections)."""
    global _client
    import openai

    config = (
        settings.LOOP_LLM_BASE_URL,
        settings.LOOP_LLM_API_KEY,
        float(settings.LOOP_LLM_TIMEOUT_SECONDS),
    )
    with _lock:
        if _client is None or _client[0] != config:
            made = openai.OpenAI(
                base_url=config[0], api_key=config[1] or "none", timeout=config[2], max_retries=0
            )
            _client = (config, made)
        return _client[1]


def outage() -> str:
    """Why a worker should not take new work now ('' when the endpoint is not known to be
    down): after a tick found it down, for LOOP_LLM_RETRY_SECONDS, then it is tried again."""
    if _down_reason and time.monotonic() < _down_until:
        return f"model endpoint down: {_down_reason}"
    return ""


def _mark_down(reason: str) -> None:
    global _down_until, _down_reason
    _down_reason = reason
    _down_until = time.monotonic() + float(settings.LOOP_LLM_RETRY_SECONDS)


def _mark_up() -> None:
    global _down_reason
    _down_reason = ""


def complete(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    *,
    on_retry: Callable[[str, float], None] = lambda reason, delay: None,
) -> Answer:
    """The model's next reply to `messages`, offered `tools`. An endpoint that is down is
    retried after a backoff (or its Retry-After), `on_retry(reason, delay)` told before each
    wait, until LOOP_LLM_RETRY_SECONDS have passed; one that is up and late, once."""
    import openai

    give_up = time.monotonic() + float(settings.LOOP_LLM_RETRY_SECONDS)
    attempt = 0
    late = 0
    while True:
        wait: float | None = None
        try:
            answer = _ask(messages, tools)
        except (_Late, openai.APITimeoutError) as exc:
            reason = _why(exc) if isinstance(exc, openai.APIError) else str(exc)
            if _up():
                late += 1
                if late > 1:
                    return Refused(f"{reason}, twice, from an endpoint that is up")
                on_retry(reason, 0.0)
                continue
        except (
            openai.APIConnectionError,
            openai.RateLimitError,
            openai.InternalServerError,
        ) as exc:
            reason, wait = _why(exc), _retry_after(exc)
        except openai.APIStatusError as exc:
            _answered.add(settings.LOOP_LLM_BASE_URL)
            if exc.status_code >= 500:
                reason, wait = _why(exc), _retry_after(exc)
            elif exc.status_code in (408, 409) and late == 0:
                late += 1  # the endpoint is up: once more, then it is the step's problem
                on_retry(_why(exc), 0.0)
                continue
            else:
                return Refused(_why(exc))
        except openai.APIError as exc:  # anything else the client makes of an answer
            return Refused(_why(exc))
        else:
            _mark_up()
            return answer
        delay = min(BACKOFF_FIRST * 2**attempt, BACKOFF_MAX)
        if wait is not None:
            delay = max(delay, wait)
        attempt += 1
        if time.monotonic() + delay > give_up:
            _mark_down(reason)
            return Unavailable(reason)
        on_retry(reason, delay)
        time.sleep(delay)


def _ask(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> Reply | Refused:
    """One request; its reply read (at most LOOP_LLM_MAX_REPLY_BYTES, within
    LOOP_LLM_TIMEOUT_SECONDS in all) and parsed. `_Late` if the reply came late or cut off."""
    import httpx2  # the openai package's HTTP client

    timeout = float(settings.LOOP_LLM_TIMEOUT_SECONDS)
    limit = int(settings.LOOP_LLM_MAX_REPLY_BYTES)
    deadline = time.monotonic() + timeout
    body = bytearray()
    # The request goes through the client's `post` (the package's way to a request it does not
    # type): its base URL, key, headers, timeout and errors, without `create`'s walk of every
    # message and tool against its typed schema, which changes nothing in plain JSON and was
    # most of the client's time. Streamed: the reply is read here, up to the limit.
    response = client().post(
        "/chat/completions",
        cast_to=httpx2.Response,
        body={
            "model": settings.LOOP_LLM_MODEL,
            "messages": list(messages),
            "tools": list(tools),
            "max_tokens": int(settings.LOOP_LLM_MAX_TOKENS),
        },
        stream=True,
    )
    _answered.add(settings.LOOP_LLM_BASE_URL)
    try:
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > limit:
                return Refused(
                    f"the reply is more than {limit} bytes (LOOP_LLM_MAX_REPLY_BYTES): not kept"
                )
            if time.monotonic() > deadline:
                raise _Late(f"timed out after {settings.LOOP_LLM_TIMEOUT_SECONDS}s")
    except httpx2.TimeoutException:
        raise _Late(f"timed out after {settings.LOOP_LLM_TIMEOUT_SECONDS}s") from None
    except httpx2.TransportError as exc:
        raise _Late(f"the reply was cut off: {clean(str(exc))[0][:QUOTE]}") from None
    finally:
        response.close()
    return parse(bytes(body))


def _up() -> bool:
    """Whether the endpoint is up: it answered in this process, or it answers `GET /models`
    now (any status: a server answered)."""
    import openai

    if settings.LOOP_LLM_BASE_URL in _answered:
        return True
    timeout = min(PROBE_SECONDS, float(settings.LOOP_LLM_TIMEOUT_SECONDS))
    try:
        with client().with_options(timeout=timeout).models.with_streaming_response.list():
            pass
    except openai.APIStatusError:
        pass
    except openai.APIError:
        return False
    _answered.add(settings.LOOP_LLM_BASE_URL)
    return True


# ---- what the endpoint answered ------------------------------------------------------------


def parse(body: bytes) -> Reply | Refused:
    """The reply in a chat completion's body, within the bounds; or why there is none. Text
    that is not UTF-8 is replaced (U+FFFD) and the reply says so; the transcript stores what
    is left valid (`transcript.clean`)."""
    notes = []
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", "replace")
        notes.append("bytes that are not UTF-8 were replaced by U+FFFD")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Refused(f"the reply is not JSON ({_quote(str(exc))}): {_quote(text)}")
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        return Refused(f"the reply has no choices: {_quote(text)}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return Refused(f"the reply's choice has no message: {_quote(text)}")
    content = _content(message.get("content"))
    if content is None:
        return Refused(f"the reply's content is not text: {_quote(json.dumps(message))}")
    calls = _calls(message.get("tool_calls"))
    if isinstance(calls, str):
        return Refused(calls)
    usage = data.get("usage")
    counts = [_count(usage, name) for name in ("prompt_tokens", "completion_tokens")]
    for count in counts:
        if isinstance(count, str):
            return Refused(count)
    if choice.get("finish_reason") == "length":
        notes.append(f"the endpoint cut this reply at LOOP_LLM_MAX_TOKENS ({_max_tokens()})")
    if notes:
        content = f"{content}\n[{'; '.join(notes)}]" if content else f"[{'; '.join(notes)}]"
    prompt, completion = counts
    assert isinstance(prompt, int) and isinstance(completion, int)
    return Reply(content, calls, prompt, completion)


def _max_tokens() -> int:
    return int(settings.LOOP_LLM_MAX_TOKENS)


def _content(raw: Any) -> str | None:
    """The message's text: a string, nothing, or a list of text parts; None if not text."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in raw
    ):
        return "".join(p["text"] for p in raw)
    return None


def _calls(raw: Any) -> list[ToolCall] | str:
    """The message's tool calls, those beyond the bounds marked `refused` without their
    arguments; or what is wrong with them."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        return f"the reply's tool_calls is not a list: {_quote(json.dumps(raw))}"
    most = int(settings.LOOP_LLM_MAX_CALLS)
    limit = int(settings.LOOP_LLM_MAX_ARG_BYTES)
    found = []
    for n, one in enumerate(raw, start=1):
        function = one.get("function") if isinstance(one, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            return f"the reply's tool call {n} names no function: {_quote(json.dumps(one))}"
        assert isinstance(one, dict) and isinstance(function, dict)
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):  # some servers send the object itself
            arguments = json.dumps(arguments)
        call_id = one.get("id")
        if not isinstance(call_id, str) or len(call_id) > ID_MAX or clean(call_id)[1]:
            call_id = ""  # the judge gives it one of its own
        refused = ""
        size = len(arguments.encode("utf-8", "surrogatepass"))
        if n > most:
            refused = (
                f"not run: the reply made {len(raw)} calls, more than LOOP_LLM_MAX_CALLS "
                f"({most}); its arguments were not kept"
            )
        elif size > limit:
            refused = (
                f"not run: its arguments are {size} bytes, more than LOOP_LLM_MAX_ARG_BYTES "
                f"({limit}); they were not kept"
            )
        found.append(ToolCall(call_id, name, "{}" if refused else arguments, refused))
    return found


def _count(usage: Any, name: str) -> int | str:
    """A token count of the reply's `usage` (0 when it has none), or why it is no count."""
    value = usage.get(name) if isinstance(usage, dict) else None
    if value is None:
        return 0
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= COUNT_MAX
        or value != int(value)
    ):
        return f"the reply's usage.{name} is {_quote(json.dumps(value))}, not a count of tokens (0 to {COUNT_MAX})"
    return int(value)


def _quote(text: str) -> str:
    """A piece of what the endpoint sent, short and storable, for a reason."""
    shown = clean(text[:QUOTE])[0]
    return shown + "…" if len(text) > QUOTE else shown


def _why(exc: openai.APIError) -> str:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return f"timed out after {settings.LOOP_LLM_TIMEOUT_SECONDS}s"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return f"connection failed: {_quote(str(cause or exc))}"
    if isinstance(exc, openai.APIStatusError):
        return f"the model endpoint answered {exc.status_code}: {_body(exc)}"
    return f"{type(exc).__name__}: {_quote(str(exc))}"


def _body(exc: openai.APIStatusError) -> str:
    body = exc.body
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return clean(text[:300])[0]


def _retry_after(exc: openai.APIError) -> float | None:
    """The endpoint's Retry-After (seconds or an HTTP date; or retry-after-ms), if it sent one."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = response.headers
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None  # no date either: the backoff decides
