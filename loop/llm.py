"""The model judge's client (DESIGN.md §12): one non-streaming chat-completions request per
model turn, through the official `openai` package, against any OpenAI-compatible endpoint
(`LOOP_LLM_BASE_URL`: vLLM, llama.cpp's server, Ollama, …).

The client's own retries are off: connection errors, timeouts, 429 and 5xx are retried here,
with exponential backoff honouring `Retry-After`, each retry reported to the caller (who
journals it), for at most LOOP_LLM_RETRY_SECONDS. What comes back is a value: the model's
`Reply`, `Unavailable` (the endpoint stayed down: never a verdict on the step), or `Refused`
(the endpoint answered a definitive error, such as 400 or 401).
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

if TYPE_CHECKING:
    import openai  # imported when first used: a process without model steps never pays for it

# Backoff between retries of a request the endpoint could not answer (seconds).
BACKOFF_FIRST = 0.25
BACKOFF_MAX = 8.0


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # as the model wrote it: JSON text, maybe malformed

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


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
    """The endpoint answered with an error that asking again will not change."""

    reason: str


Answer = Reply | Unavailable | Refused

_client: tuple[tuple[str, str, float], openai.OpenAI] | None = None
_lock = threading.Lock()
_down_until = 0.0
_down_reason = ""


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
    """The model's next reply to `messages`, offered `tools`. A failure worth retrying is
    retried after a backoff (or the endpoint's Retry-After), `on_retry(reason, delay)` told
    before each wait, until LOOP_LLM_RETRY_SECONDS have passed."""
    import openai

    give_up = time.monotonic() + float(settings.LOOP_LLM_RETRY_SECONDS)
    attempt = 0
    while True:
        try:
            response = client().chat.completions.create(
                model=settings.LOOP_LLM_MODEL,
                messages=list(messages),  # type: ignore[arg-type]
                tools=list(tools),  # type: ignore[arg-type]
            )
        except (
            openai.APIConnectionError,
            openai.RateLimitError,
            openai.InternalServerError,
        ) as exc:
            reason, wait = _why(exc), _retry_after(exc)
        except openai.APIStatusError as exc:
            if exc.status_code < 500 and exc.status_code not in (408, 409, 429):
                return Refused(f"the model endpoint answered {exc.status_code}: {_body(exc)}")
            reason, wait = _why(exc), _retry_after(exc)
        else:
            _mark_up()
            return _reply(response)
        delay = min(BACKOFF_FIRST * 2**attempt, BACKOFF_MAX)
        if wait is not None:
            delay = max(delay, wait)
        attempt += 1
        if time.monotonic() + delay > give_up:
            _mark_down(reason)
            return Unavailable(reason)
        on_retry(reason, delay)
        time.sleep(delay)


def _reply(response: Any) -> Reply:
    message = response.choices[0].message
    calls = [
        ToolCall(str(c.id), str(c.function.name), str(c.function.arguments or ""))
        for c in (message.tool_calls or [])
        if getattr(c, "function", None) is not None
    ]
    usage = response.usage
    return Reply(
        content=message.content or "",
        tool_calls=calls,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )


def _why(exc: openai.APIError) -> str:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return f"timed out after {settings.LOOP_LLM_TIMEOUT_SECONDS}s"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return f"connection failed: {cause or exc}"
    if isinstance(exc, openai.APIStatusError):
        return f"the model endpoint answered {exc.status_code}: {_body(exc)}"
    return f"{type(exc).__name__}: {exc}"


def _body(exc: openai.APIStatusError) -> str:
    body = exc.body
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return text[:300]


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
    when = email.utils.parsedate_to_datetime(value) if value else None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())
