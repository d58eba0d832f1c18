"""A brain driven by a language model: :class:`LLMBrain`.

The model is reached through any OpenAI-compatible chat-completions endpoint (a local
llama.cpp or vLLM server, Ollama, a hosted API). HTTP goes through httpx, with every
policy decision kept here (the official ``openai`` SDK retries on its own terms, follows
no rule of ours for a 200 whose body is not JSON, and brings pydantic along); JSON goes
through orjson.

Endpoint
--------
``url`` is read the way the OpenAI clients read their ``base_url``: a URL whose path ends
in ``/chat/completions`` is used as given; any other URL is a base, and
``/chat/completions`` is appended to its path (``http://127.0.0.1:8000/v1`` becomes
``http://127.0.0.1:8000/v1/chat/completions``). Only ``http`` and ``https`` are accepted.
Requests go to that URL and nowhere else: redirects are refused (an error names the
target, so the operator can configure it directly) and the environment is not read
(``trust_env=False``: no ``HTTP_PROXY``/``ALL_PROXY``, no ``.netrc``). ``api_key``, when
given, is sent as a bearer token.

Requests
--------
Each request carries the conversation, the role's tools and ``tool_choice: auto``;
``max_tokens`` and ``temperature`` when set. The tools are written for OpenAI's strict
mode (:func:`openai_tools`, by :mod:`porter_mesh.tools.schemas`): ``strict: true``,
every property required, the optional ones nullable (``null`` means "left out"), and no
length or range keywords (which strict mode refuses; the tools check those themselves
and say so to the model).

Theory of operation
-------------------
The brain alternates between waiting and working::

    waiting --(messages arrive / goal given)--> working --(reply without tool calls)--> waiting
    waiting --(quiet for idle_timeout)--> exit 0
    any     --(ctx.stop set)--> exit 0

*Waiting*: new messages are drained with the ``read_messages`` tool's own code path and
added to the conversation as one user message (``New messages:`` and the lines the tool
would return). Messages the tool hides (the mesh's own, the agent's own broadcasts) do
not wake the model.

*Working* is one turn of the tool-calling loop: the model is called with the
conversation and the role's tools in OpenAI format; every tool call in its answer runs
through :meth:`Toolbox.call`, and each result goes back as a ``tool`` message with the
call's id; the model is called again, until it answers with no tool call (that answer
is printed and ends the turn). The answer's ``finish_reason`` is read: ``length`` (cut
at ``max_tokens``) runs none of the answer's tool calls, whose arguments may be cut too;
the model is told so and called again, and a second cut in a row ends the turn (with a
printed reason). ``content_filter`` ends the turn too. ``tool_calls`` without any call
is answered with a note, once a turn. There is no "finish" pseudo-tool: an agent is done
when it has said its last word and nobody writes to it for ``idle_timeout`` seconds.

The system prompt is the role's description (or the agent's own, the ``system_prompt``
option) plus :meth:`Toolbox.system_prompt`
(messaging section and live team). It is rebuilt at the start of every turn, so the
model sees teammates come and go. The conversation is kept under ``max_context_chars``
by dropping the oldest exchanges whole (an assistant message with tool calls goes
together with its tool results, as the API requires); the system prompt and the goal
stay.

Failure handling
----------------
Nothing the model or the endpoint does ends the process by itself:

* HTTP 5xx, 408, 429, a refused or dropped connection, a timeout, a body that is not JSON
  or has no ``choices[0].message``: the call is retried up to ``max_retries`` times with
  exponential backoff (``Retry-After`` is honoured, within the backoff cap). When the
  retries are spent the turn is given up with a printed reason; the unanswered
  conversation is tried again after a pause, or sooner when new messages arrive. After
  ``max_failed_turns`` failed turns in a row the brain stops with
  :data:`EXIT_MODEL_FAILED` and says why.
* Any other HTTP 4xx is not retried: the error names the status and the start of the
  body, and the turn fails. 401, 403 and 404 (bad key, no access, wrong URL or model)
  cannot heal by themselves, so the brain stops at once with :data:`EXIT_MODEL_FAILED`.
* A tool call naming an unknown tool, with arguments that are not a JSON object, or
  with arguments the tool's schema refuses, and any :class:`ToolError` from the tool,
  is answered with the error text as that call's tool result, so the model can correct
  itself. These are counted in :attr:`LLMBrain.stats`.
* ``max_steps`` model calls in all end the run with :data:`EXIT_STEP_LIMIT`.

Metrics
-------
:meth:`LLMBrain.metrics` (model calls, tokens in and out from the answers' ``usage``,
tool calls, errors, retries) is what the agent's node reports in its view, so
``porter-mesh stats AGENT`` shows it.

``ctx.stop`` is checked between requests, tool calls and retry pauses; an HTTP request
already under way is not interrupted, so stopping can take up to ``request_timeout``.
"""

from __future__ import annotations

import email.utils
import logging
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from agents.context import AgentContext
from porter_mesh.errors import ConfigError, PorterError, ToolError
from porter_mesh.tools.schemas import ToolSpec, to_openai

__all__ = [
    "EXIT_DONE",
    "EXIT_MODEL_FAILED",
    "EXIT_STEP_LIMIT",
    "ROLE_PROMPTS",
    "LLMBrain",
    "ModelError",
    "chat_completions_url",
    "openai_tools",
    "trim_conversation",
]

_log = logging.getLogger("porter_mesh.agents.llm")

#: Exit status: stopped, or idle with nothing left to do.
EXIT_DONE: Final = 0
#: Exit status: the endpoint failed ``max_failed_turns`` turns in a row, or refused the
#: brain's credentials, URL or model (HTTP 401/403/404).
EXIT_MODEL_FAILED: Final = 1
#: Exit status: the ``max_steps`` budget of model calls was spent.
EXIT_STEP_LIMIT: Final = 2

#: What each role is for, in the model's words. The tools and team follow it.
ROLE_PROMPTS: Final[Mapping[str, str]] = {
    "architect": (
        "You are the architect of a team of software agents. You split the goal into "
        "tasks, hand each task to a worker (send_message with type Offer on "
        "'task:<worker>'), follow the team's progress, check the results and the "
        "reviewer's verdicts, and announce on 'log' when the goal is met. You do not "
        "write code yourself."
    ),
    "worker": (
        "You are a worker in a team of software agents. When a task is offered to you, "
        "accept it (type Accept), do it in your workspace with your file and shell tools, "
        "then ask for a review on the 'review' channel. When the review asks for "
        "changes, fix what it says and ask again. Report progress on 'log'."
    ),
    "reviewer": (
        "You are the reviewer of a team of software agents. When a worker asks for a "
        "review, read the files it names and run the tests with bash, then answer on "
        "'review': type Accept when the work is right, type Reject with precise reasons "
        "when it is not."
    ),
}

_COMMON_PROMPT: Final = (
    "Act only through your tools. When you have nothing more to do for now, answer with "
    "a short plain-text note and no tool call; you are woken up when new messages arrive."
)

#: Told to the model when its answer was cut at ``max_tokens``.
_CUT_NOTE: Final = (
    "Your last answer was cut off at the limit of {limit} tokens, so none of its "
    "{calls} tool call(s) was run. Answer again, shorter: make one tool call at a time, "
    "and split long file contents over several edits."
)
#: Told to the model when it finished for tool calls but sent none.
_NO_CALLS_NOTE: Final = (
    "Your last answer ended as if to call tools, but it contained no tool call that "
    "could be read. Call the tool again, with a JSON object of arguments."
)

#: What ``read_messages`` answers when nothing the model should see is waiting.
_NO_MESSAGES: Final = "No new messages."
#: Tool results longer than this are cut before they go to the model (characters).
MAX_TOOL_RESULT_CHARS: Final = 16_000
#: The most response body read from the endpoint (bytes).
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
#: Backoff between retries never exceeds this (seconds).
MAX_BACKOFF: Final = 30.0
#: Status codes that will not change by retrying later: stop the brain.
_FATAL_STATUS: Final = frozenset({401, 403, 404})
#: Client-side status codes that are worth retrying.
_RETRY_STATUS: Final = frozenset({408, 409, 425, 429})
#: The counters :meth:`LLMBrain.metrics` reports, and those that add up to ``errors``.
_METRICS: Final = ("model_calls", "tokens_in", "tokens_out", "tool_calls", "retries",
                   "model_errors", "tool_errors", "malformed_calls", "failed_turns",
                   "cut_answers")
_ERROR_COUNTERS: Final = ("model_errors", "tool_errors", "malformed_calls")


class ModelError(PorterError):
    """A chat-completions call failed.

    Attributes:
        status: the HTTP status, or ``None`` when none was received.
        retryable: trying the same request again may succeed.
        fatal: no later request can succeed without a configuration change.
        retry_after: seconds the server asked to wait, if it said.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        fatal: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.fatal = fatal
        self.retry_after = retry_after


def chat_completions_url(url: str) -> str:
    """The chat-completions URL for an endpoint or base URL.

    Args:
        url: ``http(s)://host[:port]/...``; a path ending in ``/chat/completions`` is
            kept, any other path gets ``/chat/completions`` appended.

    Returns:
        The URL requests are sent to.

    Raises:
        ConfigError: not an http(s) URL with a host, or it carries a user name or
            password (give the key as ``api_key``).
    """
    try:
        parts = urllib.parse.urlsplit(url.strip())
        host = parts.hostname
    except ValueError as exc:
        raise ConfigError(f"LLM URL {url!r} cannot be parsed ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"LLM URL {url!r} must start with http:// or https:// "
            "(e.g. http://127.0.0.1:8000/v1)"
        )
    if not host:
        raise ConfigError(f"LLM URL {url!r} has no host (e.g. http://127.0.0.1:8000/v1)")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "LLM URL must not carry a user name or password; give the key as api_key"
        )
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def openai_tools(specs: Iterable[ToolSpec], *, strict: bool = True) -> list[dict[str, Any]]:
    """The ``tools`` field of a request: :func:`~porter_mesh.tools.schemas.to_openai`,
    by default in OpenAI's strict mode (``strict: true``, every property required, the
    optional ones nullable)."""
    return to_openai(specs, strict=strict)


def _message_size(message: Mapping[str, Any]) -> int:
    size = len(str(message.get("content") or ""))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        size += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    return size + 16


def trim_conversation(
    messages: Sequence[Mapping[str, Any]], *, max_chars: int, pinned: int = 1
) -> list[Mapping[str, Any]]:
    """Drop the oldest exchanges until the conversation fits.

    The first ``pinned`` messages (system prompt, goal) always stay, and so does the
    newest exchange. An exchange is a user message, or an assistant message together
    with the tool results that answer it: dropping one never leaves a tool result
    without the call it answers.

    Args:
        messages: the conversation, oldest first.
        max_chars: the size to fit in, counted in characters of content and arguments.
        pinned: leading messages never dropped.

    Returns:
        The kept messages, in order (a new list).
    """
    head = list(messages[:pinned])
    groups: list[list[Mapping[str, Any]]] = []
    for message in messages[pinned:]:
        if message.get("role") == "tool" and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    sizes = [sum(_message_size(m) for m in group) for group in groups]
    total = sum(_message_size(m) for m in head) + sum(sizes)
    start = 0
    while total > max_chars and start < len(groups) - 1:
        total -= sizes[start]
        start += 1
    return head + [m for group in groups[start:] for m in group]


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _summarise_arguments(arguments: Any) -> str:
    if not isinstance(arguments, Mapping):
        return _clip(str(arguments), 60)
    return ", ".join(f"{k}={_clip(str(v), 40)}" for k, v in arguments.items())


def _content_text(content: Any) -> str:
    """Message content as text (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping)
        )
    return ""


def _body_excerpt(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return _clip(text, 300) if text else "(empty body)"


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # unreadable: the backoff applies
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer of the endpoint.

    Attributes:
        message: the assistant message of the first choice.
        finish_reason: why the model stopped (``stop``, ``length``, ``tool_calls``,
            ``content_filter``...), or ``None`` when the server did not say.
        tokens_in: ``usage.prompt_tokens`` (0 when not reported).
        tokens_out: ``usage.completion_tokens`` (0 when not reported).
    """

    message: Mapping[str, Any]
    finish_reason: str | None
    tokens_in: int
    tokens_out: int


class LLMBrain:
    """A brain that lets a model choose the tool calls.

    Args:
        url: the OpenAI-compatible endpoint (see the module docstring for how it is
            read).
        model: the model name sent with every request.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        request_timeout: seconds one HTTP request may take.
        max_steps: the most model calls in one run.
        max_retries: retries of one model call after a transient failure.
        idle_timeout: seconds without new messages, after the model's last answer, that
            end the run (``None``: wait until stopped).
        max_failed_turns: turns given up in a row before the brain stops.
        retry_backoff: the first retry's delay (seconds); it doubles with each retry.
        max_context_chars: the conversation is trimmed to about this size.
        temperature: sent when given (0 to 2); the server's default otherwise.
        max_tokens: the most tokens one answer may have (sent as ``max_tokens``);
            ``None`` sends none (the server's default).
        strict_tools: write the tools for OpenAI's strict mode (see
            :func:`openai_tools`).

    Raises:
        ConfigError: a bad URL or a setting out of range.
    """

    def __init__(
        self,
        *,
        url: str,
        model: str,
        api_key: str | None = None,
        request_timeout: float = 60.0,
        max_steps: int = 50,
        max_retries: int = 3,
        idle_timeout: float | None = 300.0,
        max_failed_turns: int = 3,
        retry_backoff: float = 1.0,
        max_context_chars: int = 200_000,
        temperature: float | None = None,
        max_tokens: int | None = 4096,
        strict_tools: bool = True,
    ) -> None:
        self.url = chat_completions_url(url)
        if not model.strip():
            raise ConfigError("model name is empty; give the name the endpoint serves")
        checks = (
            ("request_timeout", request_timeout > 0),
            ("max_steps", max_steps >= 1),
            ("max_retries", max_retries >= 0),
            ("idle_timeout", idle_timeout is None or idle_timeout >= 0),
            ("max_failed_turns", max_failed_turns >= 1),
            ("retry_backoff", retry_backoff >= 0),
            ("max_context_chars", max_context_chars >= 1000),
            ("temperature", temperature is None or 0 <= temperature <= 2),
            ("max_tokens", max_tokens is None or max_tokens >= 1),
        )
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"{name} is out of range (see LLMBrain's documentation)")
        self.model = model
        self._api_key = api_key
        self.request_timeout = request_timeout
        self.max_steps = max_steps
        self.max_retries = max_retries
        self.idle_timeout = idle_timeout
        self.max_failed_turns = max_failed_turns
        self.retry_backoff = retry_backoff
        self.max_context_chars = max_context_chars
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.strict_tools = strict_tools
        #: Counters: ``model_calls``, ``model_errors``, ``retries``, ``failed_turns``,
        #: ``tool_calls``, ``tool_errors``, ``malformed_calls``, ``tokens_in``,
        #: ``tokens_out``, ``cut_answers`` (finish_reason ``length``).
        self.stats: Counter[str] = Counter()
        self.messages: list[Mapping[str, Any]] = []
        self._pinned = 1
        self._client: httpx.Client | None = None

    def metrics(self) -> dict[str, Any]:
        """What the agent's node reports about its brain (plain values).

        Safe to call from another thread while the brain runs: it reads fixed keys and
        never iterates the counters.
        """
        stats = self.stats
        counts = {key: stats[key] for key in _METRICS}
        counts["errors"] = sum(stats[key] for key in _ERROR_COUNTERS)
        return {"brain": "llm", "model": self.model, **counts}

    # -- the run ---------------------------------------------------------------------

    def run(self, ctx: AgentContext) -> int:
        """Work until idle, stopped, out of steps, or the endpoint keeps failing.

        Args:
            ctx: the agent.

        Returns:
            :data:`EXIT_DONE`, :data:`EXIT_MODEL_FAILED` or :data:`EXIT_STEP_LIMIT`.
        """
        try:
            return self._run(ctx)
        finally:
            self.close()

    def _run(self, ctx: AgentContext) -> int:
        self.messages = [{"role": "system", "content": self._system_prompt(ctx)}]
        self._pinned = 1
        pending = False
        goal = ctx.options.get("goal")
        if isinstance(goal, str) and goal.strip():
            self.messages.append({"role": "user", "content": f"Your goal:\n{goal.strip()}"})
            self._pinned = 2
            pending = True
        go = ctx.options.get("go")
        if go is not None:
            ctx.say("waiting for the go signal")
            while not go.wait(0.2):
                if ctx.stop.is_set():
                    return EXIT_DONE
        failed_in_row = 0
        while not ctx.stop.is_set():
            if pending:
                if failed_in_row:
                    # Give the endpoint a pause before trying the same conversation again;
                    # new messages cut it short.
                    ctx.wait_for_messages(self._backoff(self.max_retries))
                got = self._take_messages(ctx)
            else:
                got = self._wait_for_work(ctx)
            if got is None:
                return EXIT_MODEL_FAILED
            pending = pending or got
            if ctx.stop.is_set():
                break
            if not pending:
                ctx.say(f"no new messages for {self.idle_timeout:g}s; done")
                return EXIT_DONE
            if self.stats["model_calls"] >= self.max_steps:
                ctx.say(f"step budget spent ({self.max_steps} model calls); stopping")
                return EXIT_STEP_LIMIT
            try:
                self._turn(ctx)
            except ModelError as exc:
                if ctx.stop.is_set():
                    break
                self.stats["failed_turns"] += 1
                if exc.fatal:
                    ctx.say(f"model endpoint refused the request: {exc}; stopping "
                            f"(check --llm-url, the model name and the API key)")
                    return EXIT_MODEL_FAILED
                failed_in_row += 1
                if failed_in_row >= self.max_failed_turns:
                    ctx.say(f"model endpoint failed {failed_in_row} turns in a row "
                            f"(last: {exc}); stopping")
                    return EXIT_MODEL_FAILED
                ctx.say(f"turn given up: {exc}; will try again "
                        f"({failed_in_row}/{self.max_failed_turns} failed in a row)")
                continue
            except _StepLimit:
                ctx.say(f"step budget spent ({self.max_steps} model calls); stopping")
                return EXIT_STEP_LIMIT
            failed_in_row = 0
            pending = False
        return EXIT_DONE

    def _wait_for_work(self, ctx: AgentContext) -> bool | None:
        """Wait for messages that the model should see, up to ``idle_timeout``.

        Returns:
            True when messages were added, False on idle timeout or stop, None when the
            node is gone.
        """
        deadline = None if self.idle_timeout is None else time.monotonic() + self.idle_timeout
        while not ctx.stop.is_set():
            left = 60.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            if ctx.wait_for_messages(left):
                got = self._take_messages(ctx)
                if got is None or got:
                    return got
                # Only messages the model does not see (its own broadcasts): keep waiting,
                # without spinning if the node keeps reporting a waiting message.
                ctx.stop.wait(min(0.2, max(0.0, left)))
        return False

    def _take_messages(self, ctx: AgentContext) -> bool | None:
        """Add waiting messages to the conversation; None when the node is gone."""
        try:
            text = ctx.toolbox.read_messages()
        except ToolError as exc:
            ctx.say(f"cannot read messages: {exc}; stopping")
            return None
        # The model reads text only; drop the structured copies the tapped port keeps
        # (of this read and of the model's own read_messages calls) so they cannot pile up.
        ctx.port.take()
        if text == _NO_MESSAGES:
            return False
        self.messages.append({"role": "user", "content": f"New messages:\n{text}"})
        return True

    def _system_prompt(self, ctx: AgentContext) -> str:
        custom = ctx.options.get("system_prompt")
        if isinstance(custom, str) and custom.strip():
            role = custom.strip()
        else:
            role = ROLE_PROMPTS.get(
                ctx.role, f"You are {ctx.name}, a {ctx.role} in a team of agents.")
        return f"{role}\n{_COMMON_PROMPT}\n\n{ctx.toolbox.system_prompt()}"

    # -- one turn --------------------------------------------------------------------

    def _turn(self, ctx: AgentContext) -> None:
        """Call the model and run its tool calls until it answers without any.

        Raises:
            ModelError: the model could not be reached after the retries.
            _StepLimit: ``max_steps`` was reached mid-turn.
        """
        self.messages[0] = {"role": "system", "content": self._system_prompt(ctx)}
        tools = openai_tools(ctx.toolbox.specs(), strict=self.strict_tools)
        cut_in_row = 0
        nudged = False
        while not ctx.stop.is_set():
            if self.stats["model_calls"] >= self.max_steps:
                raise _StepLimit
            self.messages = trim_conversation(
                self.messages, max_chars=self.max_context_chars, pinned=self._pinned
            )
            completion = self._complete(ctx, tools)
            reply = completion.message
            calls = self._normalise_calls(reply.get("tool_calls"))
            content = _content_text(reply.get("content"))
            if completion.finish_reason == "length":
                # Cut at max_tokens: the calls' arguments may be cut too, so none is run
                # (and none goes back: a call needs its result). The model hears why.
                self.stats["cut_answers"] += 1
                cut_in_row += 1
                self.messages.append({"role": "assistant", "content": content})
                if cut_in_row >= 2:
                    ctx.say(f"model's answer was cut at max_tokens ({self.max_tokens}) "
                            "twice in a row; turn ended (raise --max-tokens?)")
                    return
                ctx.say(f"model's answer was cut at max_tokens ({self.max_tokens}); "
                        f"{len(calls)} tool call(s) not run; asking for a shorter one")
                self.messages.append({"role": "user", "content": _CUT_NOTE.format(
                    limit=self.max_tokens, calls=len(calls))})
                continue
            cut_in_row = 0
            # Null content is only valid beside tool calls; some servers refuse it alone.
            assistant: dict[str, Any] = {
                "role": "assistant", "content": content or (None if calls else ""),
            }
            if calls:
                assistant["tool_calls"] = calls
            self.messages.append(assistant)
            if content.strip():
                ctx.say(f"model: {_clip(content, 300)}")
            if completion.finish_reason == "content_filter":
                ctx.say("the endpoint's content filter stopped the answer; turn ended")
                return
            if not calls and completion.finish_reason == "tool_calls" and not nudged:
                # It meant to call a tool, but the call got lost (a server's parser):
                # say so once, rather than end the turn on an empty answer.
                nudged = True
                self.stats["malformed_calls"] += 1
                ctx.say("model's answer ended for tool calls but carried none; telling it")
                self.messages.append({"role": "user", "content": _NO_CALLS_NOTE})
                continue
            if not calls:
                return
            for call in calls:
                if ctx.stop.is_set():
                    result = "not run: the agent is stopping"
                else:
                    result = self._run_tool(ctx, call)
                self.messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": result}
                )

    def _normalise_calls(self, raw: Any) -> list[dict[str, Any]]:
        """The tool calls as the API expects them back, whatever shape they came in."""
        if not isinstance(raw, list):
            return []
        calls = []
        for index, item in enumerate(raw):
            item = item if isinstance(item, Mapping) else {}
            function = item.get("function")
            function = function if isinstance(function, Mapping) else {}
            name = function.get("name")
            arguments = function.get("arguments")
            if arguments is None:
                arguments = "{}"
            elif not isinstance(arguments, str):
                # Some servers send the object itself; send back what the API expects.
                arguments = orjson.dumps(arguments).decode()
            call_id = item.get("id")
            if not isinstance(call_id, str) or not call_id:
                call_id = f"call_{self.stats['model_calls']}_{index}"
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name if isinstance(name, str) else "",
                        "arguments": arguments,
                    },
                }
            )
        return calls

    def _run_tool(self, ctx: AgentContext, call: Mapping[str, Any]) -> str:
        """Run one call; any failure becomes the call's result text."""
        name: str = call["function"]["name"]
        raw: str = call["function"]["arguments"]
        self.stats["tool_calls"] += 1
        try:
            arguments = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            self.stats["malformed_calls"] += 1
            ctx.say(f"tool {name or '?'}: arguments are not JSON ({_clip(raw, 60)})")
            return (
                f"error: the arguments of this {name or 'tool'} call are not valid JSON "
                f"({exc}); call the tool again with a JSON object of arguments"
            )
        label = f"{name or '?'}({_summarise_arguments(arguments)})"
        if not name:
            self.stats["malformed_calls"] += 1
            ctx.say(f"tool call without a name: {label}")
            return "error: this tool call has no function name; name one of your tools"
        if not isinstance(arguments, dict):
            self.stats["malformed_calls"] += 1
            ctx.say(f"tool {label}: arguments are not an object")
            return (
                f"error: the arguments of {name} must be a JSON object with named "
                f"arguments, not {type(arguments).__name__}"
            )
        try:
            result = ctx.toolbox.call(name, arguments)
        except ToolError as exc:
            self.stats["tool_errors"] += 1
            ctx.say(f"tool {label} failed: {_clip(str(exc), 160)}")
            return f"error: {exc}"
        except Exception as exc:  # a bug in a tool must not end the agent
            self.stats["tool_errors"] += 1
            _log.warning("tool %s raised", name, exc_info=True)
            ctx.say(f"tool {label} crashed: {type(exc).__name__}: {_clip(str(exc), 160)}")
            return f"error: the tool failed unexpectedly ({type(exc).__name__}: {exc})"
        ctx.say(f"tool {label} -> {_clip(result, 100)}")
        if len(result) > MAX_TOOL_RESULT_CHARS:
            cut = len(result) - MAX_TOOL_RESULT_CHARS
            result = result[:MAX_TOOL_RESULT_CHARS] + f"\n[{cut} more characters cut]"
        return result

    # -- the endpoint ----------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return min(MAX_BACKOFF, self.retry_backoff * 2.0 ** max(0, attempt - 1))

    def _complete(self, ctx: AgentContext, tools: list[dict[str, Any]]) -> Completion:
        """One model call with retries.

        Returns:
            The first choice's answer.

        Raises:
            ModelError: failed without retry, or still failing after the retries.
        """
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages,
            "tools": tools,
            "tool_choice": "auto",
        }
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        body = orjson.dumps(payload)
        attempt = 0
        self.stats["model_calls"] += 1
        while True:
            try:
                completion = self._post(body)
            except ModelError as exc:
                self.stats["model_errors"] += 1
                if not exc.retryable or attempt >= self.max_retries:
                    raise
                attempt += 1
                delay = self._backoff(attempt)
                if exc.retry_after is not None:
                    delay = min(MAX_BACKOFF, max(delay, exc.retry_after))
                ctx.say(f"model error: {exc}; retry {attempt}/{self.max_retries} "
                        f"in {delay:.1f}s")
                self.stats["retries"] += 1
                if ctx.stop.wait(delay):
                    raise ModelError("stopped while waiting to retry") from exc
                continue
            self.stats["tokens_in"] += completion.tokens_in
            self.stats["tokens_out"] += completion.tokens_out
            return completion

    def _http(self) -> httpx.Client:
        if self._client is None:
            # trust_env=False: no proxy, netrc or certificate settings from the
            # environment; requests go to the configured URL only, unredirected.
            self._client = httpx.Client(
                follow_redirects=False, trust_env=False,
                timeout=httpx.Timeout(self.request_timeout),
                headers={"Content-Type": "application/json", "Accept": "application/json"},
            )
        return self._client

    def close(self) -> None:
        """Close the HTTP connections (:meth:`run` does it when it returns)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _post(self, body: bytes) -> Completion:
        """One HTTP request; the answer, or a :class:`ModelError`."""
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        deadline = time.monotonic() + self.request_timeout
        try:
            with self._http().stream("POST", self.url, content=body,
                                     headers=headers) as response:
                if response.status_code != 200:
                    raise self._status_error(response)
                data = self._read(response, deadline)
        except httpx.ConnectError as exc:
            raise ModelError(f"cannot reach {self.url}: {exc}", retryable=True) from None
        except httpx.TimeoutException:
            raise ModelError(f"request to {self.url} timed out", retryable=True) from None
        except httpx.HTTPError as exc:
            raise ModelError(f"request to {self.url} failed ({type(exc).__name__}: {exc})",
                             retryable=True) from None
        return self._parse(data)

    def _read(self, response: httpx.Response, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes(65536):
            if time.monotonic() > deadline:
                raise ModelError(f"request to {self.url} timed out", retryable=True)
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise ModelError(
                    f"response from {self.url} is larger than {MAX_RESPONSE_BYTES} bytes",
                    retryable=True,
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def _status_error(self, response: httpx.Response) -> ModelError:
        status = response.status_code
        if response.is_redirect or 300 <= status < 400:
            target = response.headers.get("Location", "?")
            return ModelError(
                f"HTTP {status} from {self.url}: redirects are not followed; configure "
                f"the final URL ({target}) instead",
                status=status, fatal=True,
            )
        excerpt = "(body unreadable)"
        try:
            head = b""
            for chunk in response.iter_bytes(2048):
                head += chunk
                if len(head) >= 2048:
                    break
            excerpt = _body_excerpt(head[:2048])
        except httpx.HTTPError:
            pass
        retryable = status >= 500 or status in _RETRY_STATUS
        return ModelError(
            f"HTTP {status} from {self.url}: {excerpt}",
            status=status,
            retryable=retryable,
            fatal=status in _FATAL_STATUS,
            retry_after=_retry_after(response.headers.get("Retry-After")),
        )

    def _parse(self, data: bytes) -> Completion:
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ModelError(
                f"response from {self.url} is not JSON: {_body_excerpt(data)}", retryable=True
            ) from None
        message = None
        finish: str | None = None
        tokens_in = tokens_out = 0
        if isinstance(document, dict):
            choices = document.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                message = choices[0].get("message")
                reason = choices[0].get("finish_reason")
                finish = reason if isinstance(reason, str) else None
            usage = document.get("usage")
            if isinstance(usage, dict):
                tokens_in = _count(usage.get("prompt_tokens"))
                tokens_out = _count(usage.get("completion_tokens"))
        if not isinstance(message, dict):
            error = document.get("error") if isinstance(document, dict) else None
            detail = f" (error: {_clip(str(error), 200)})" if error else ""
            raise ModelError(
                f"response from {self.url} has no choices[0].message{detail}", retryable=True
            )
        return Completion(message, finish, tokens_in, tokens_out)


def _count(value: Any) -> int:
    """A token count from ``usage`` (anything else counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class _StepLimit(Exception):
    """``max_steps`` model calls were made (internal: ends the run)."""
