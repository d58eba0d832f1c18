"""The brain's loop: waiting for messages, and turns of model calls and tool calls.

See :mod:`agents.llm` for the theory of operation, the failure handling and the metrics;
the endpoint (:mod:`.endpoint`) makes one request at a time, and this module decides
when to retry, when to give a turn up and when to stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import orjson

from agents.context import AgentContext
from agents.llm.conversation import (
    Conversation,
    clip,
    content_text,
    normalise_calls,
    summarise_arguments,
)
from agents.llm.endpoint import (
    CallAbandoned,
    ChatEndpoint,
    Completion,
    ModelError,
    openai_tools,
)
from porter_mesh.core.lifecycle import is_cancel
from porter_mesh.core.tasks import is_task_delete
from porter_mesh.errors import ConfigError, ToolError

__all__ = [
    "EXIT_DONE",
    "EXIT_MODEL_FAILED",
    "EXIT_STEP_LIMIT",
    "MAX_BACKOFF",
    "MAX_TOOL_RESULT_CHARS",
    "ROLE_PROMPTS",
    "LLMBrain",
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

#: Told to the model when a model call was abandoned because its task was stopped.
_STOPPED_NOTE: Final = (
    "Task {task} was stopped ({reason}); your model call for it was abandoned. Do no "
    "more work on it and report no result for it; wait for your next task."
)
#: Told to the model when a model call was abandoned because the agent was halted.
_HALTED_NOTE: Final = (
    "This agent was stopped ({reason}); your model call was abandoned. Do no more work "
    "until you are told to resume."
)

#: What ``read_messages`` answers when nothing the model should see is waiting.
_NO_MESSAGES: Final = "No new messages."
#: Tool results longer than this are cut before they go to the model (characters).
MAX_TOOL_RESULT_CHARS: Final = 16_000
#: Backoff between retries never exceeds this (seconds).
MAX_BACKOFF: Final = 30.0
#: The counters :meth:`LLMBrain.metrics` reports, and those that add up to ``errors``.
_METRICS: Final = ("model_calls", "tokens_in", "tokens_out", "tool_calls", "retries",
                   "model_errors", "tool_errors", "malformed_calls", "failed_turns",
                   "cut_answers", "abandoned_calls")
_ERROR_COUNTERS: Final = ("model_errors", "tool_errors", "malformed_calls")


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
        self.endpoint = ChatEndpoint(url=url, model=model, api_key=api_key,
                                     request_timeout=request_timeout,
                                     temperature=temperature, max_tokens=max_tokens)
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
        self.url = self.endpoint.url
        self.model = model
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
        #: ``tokens_out``, ``cut_answers`` (finish_reason ``length``),
        #: ``abandoned_calls`` (cut short because their task was stopped).
        self.stats: Counter[str] = Counter()
        self.conversation = Conversation("")
        # The task the model call in flight works for, the event that abandons it, and
        # what stopped it: set by the toolbox's stop listener, from the node's thread.
        self._stop_lock = threading.Lock()
        self._working_for: str | None = None
        self._call_stop = threading.Event()
        self._stopped: tuple[str | None, str] | None = None

    @property
    def messages(self) -> list[Mapping[str, Any]]:
        """The conversation's messages, oldest first."""
        return self.conversation.messages

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
        remove = ctx.toolbox.on_stop(self._on_stop)
        try:
            return self._run(ctx)
        finally:
            remove()
            self.close()

    def _on_stop(self, context: str | None, reason: str) -> None:
        """The toolbox's stop listener (any thread): abandon the model call in flight
        when its task was stopped, or every call when the agent was halted."""
        with self._stop_lock:
            working = self._working_for
            if context is not None and context != working:
                return
            self._stopped = (context, reason)
            self._call_stop.set()
        self.endpoint.abandon()

    def _run(self, ctx: AgentContext) -> int:
        self.conversation = Conversation(self._system_prompt(ctx))
        pending = False
        goal = ctx.options.get("goal")
        if isinstance(goal, str) and goal.strip():
            self.conversation.pin({"role": "user", "content": f"Your goal:\n{goal.strip()}"})
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
        items = ctx.port.take()
        if text == _NO_MESSAGES:
            return False
        self.conversation.add_user(f"New messages:\n{text}")
        # The cancel or withdrawal of a task already stopped is news to nobody: the model
        # reads it with its next messages, and no model call is made for it alone.
        return not items or not all(_stops_stopped_task(ctx, item.activity) for item in items)

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
        """Call the model and run its tool calls until it answers without any, or until
        the task it works for is stopped (the call in flight is abandoned and the
        conversation says why; see "A stopped task" in :mod:`agents.llm`).

        Raises:
            ModelError: the model could not be reached after the retries.
            _StepLimit: ``max_steps`` was reached mid-turn.
        """
        conversation = self.conversation
        conversation.set_system(self._system_prompt(ctx))
        tools = openai_tools(ctx.toolbox.specs(), strict=self.strict_tools)
        with self._stop_lock:
            self._call_stop = threading.Event()
            self._stopped = None
        try:
            self._turn_calls(ctx, tools)
        except CallAbandoned:
            self.stats["abandoned_calls"] += 1
        finally:
            with self._stop_lock:
                self._working_for = None
                stopped = self._stopped
        if stopped is not None:
            task, reason = stopped
            ctx.say(f"model call abandoned: {reason}")
            note = (_STOPPED_NOTE.format(task=task, reason=reason) if task is not None
                    else _HALTED_NOTE.format(reason=reason))
            conversation.add_user(note)

    def _turn_calls(self, ctx: AgentContext, tools: list[dict[str, Any]]) -> None:
        """The calls of one turn (see :meth:`_turn`).

        Raises:
            CallAbandoned: the task the turn works for was stopped.
            ModelError: as :meth:`_turn`.
            _StepLimit: as :meth:`_turn`.
        """
        conversation = self.conversation
        cut_in_row = 0
        nudged = False
        while not ctx.stop.is_set():
            if self.stats["model_calls"] >= self.max_steps:
                raise _StepLimit
            with self._stop_lock:
                # The task of this call: the current one, or the one stopped mid-turn.
                self._working_for = ctx.toolbox.context or self._working_for
                if self._stopped is not None:
                    return  # stopped while a tool ran: no further call for it
            conversation.trim(self.max_context_chars)
            completion = self._complete(ctx, tools)
            reply = completion.message
            calls = normalise_calls(reply.get("tool_calls"), self.stats["model_calls"])
            content = content_text(reply.get("content"))
            if completion.finish_reason == "length":
                # Cut at max_tokens: the calls' arguments may be cut too, so none is run
                # (and none goes back: a call needs its result). The model hears why.
                self.stats["cut_answers"] += 1
                cut_in_row += 1
                conversation.append({"role": "assistant", "content": content})
                if cut_in_row >= 2:
                    ctx.say(f"model's answer was cut at max_tokens ({self.max_tokens}) "
                            "twice in a row; turn ended (raise --max-tokens?)")
                    return
                ctx.say(f"model's answer was cut at max_tokens ({self.max_tokens}); "
                        f"{len(calls)} tool call(s) not run; asking for a shorter one")
                conversation.append({"role": "user", "content": _CUT_NOTE.format(
                    limit=self.max_tokens, calls=len(calls))})
                continue
            cut_in_row = 0
            # Null content is only valid beside tool calls; some servers refuse it alone.
            assistant: dict[str, Any] = {
                "role": "assistant", "content": content or (None if calls else ""),
            }
            if calls:
                assistant["tool_calls"] = calls
            conversation.append(assistant)
            if content.strip():
                ctx.say(f"model: {clip(content, 300)}")
            if completion.finish_reason == "content_filter":
                ctx.say("the endpoint's content filter stopped the answer; turn ended")
                return
            if not calls and completion.finish_reason == "tool_calls" and not nudged:
                # It meant to call a tool, but the call got lost (a server's parser):
                # say so once, rather than end the turn on an empty answer.
                nudged = True
                self.stats["malformed_calls"] += 1
                ctx.say("model's answer ended for tool calls but carried none; telling it")
                conversation.append({"role": "user", "content": _NO_CALLS_NOTE})
                continue
            if not calls:
                return
            for call in calls:
                if ctx.stop.is_set():
                    result = "not run: the agent is stopping"
                else:
                    result = self._run_tool(ctx, call)
                conversation.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": result}
                )

    def _run_tool(self, ctx: AgentContext, call: Mapping[str, Any]) -> str:
        """Run one call; any failure becomes the call's result text."""
        name: str = call["function"]["name"]
        raw: str = call["function"]["arguments"]
        self.stats["tool_calls"] += 1
        try:
            arguments = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            self.stats["malformed_calls"] += 1
            ctx.say(f"tool {name or '?'}: arguments are not JSON ({clip(raw, 60)})")
            return (
                f"error: the arguments of this {name or 'tool'} call are not valid JSON "
                f"({exc}); call the tool again with a JSON object of arguments"
            )
        label = f"{name or '?'}({summarise_arguments(arguments)})"
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
            ctx.say(f"tool {label} failed: {clip(str(exc), 160)}")
            return f"error: {exc}"
        except Exception as exc:  # a bug in a tool must not end the agent
            self.stats["tool_errors"] += 1
            _log.warning("tool %s raised", name, exc_info=True)
            ctx.say(f"tool {label} crashed: {type(exc).__name__}: {clip(str(exc), 160)}")
            return f"error: the tool failed unexpectedly ({type(exc).__name__}: {exc})"
        ctx.say(f"tool {label} -> {clip(result, 100)}")
        if len(result) > MAX_TOOL_RESULT_CHARS:
            cut = len(result) - MAX_TOOL_RESULT_CHARS
            result = result[:MAX_TOOL_RESULT_CHARS] + f"\n[{cut} more characters cut]"
        return result

    # -- the model call, with retries ----------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return min(MAX_BACKOFF, self.retry_backoff * 2.0 ** max(0, attempt - 1))

    def _complete(self, ctx: AgentContext, tools: list[dict[str, Any]]) -> Completion:
        """One model call with retries.

        Returns:
            The first choice's answer.

        Raises:
            ModelError: failed without retry, or still failing after the retries.
        """
        body = self.endpoint.request_body(self.conversation.messages, tools)
        attempt = 0
        self.stats["model_calls"] += 1
        stop = self._call_stop
        while True:
            traces = ctx.toolbox.traces
            try:
                if traces is None:
                    completion = self.endpoint.post(body, stop=stop)
                else:
                    # One chat span per call to the model, retries included.
                    with traces.model_call(self.endpoint.model, ctx.toolbox.context) as span:
                        completion = self.endpoint.post(body, stop=stop)
                        traces.model_usage(span, response_model=None,
                                           input_tokens=completion.tokens_in,
                                           output_tokens=completion.tokens_out,
                                           finish_reason=completion.finish_reason)
            except CallAbandoned:
                raise
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
                if stop.wait(delay):
                    raise CallAbandoned(self.url) from exc
                if ctx.stop.is_set():
                    raise ModelError("stopped while waiting to retry") from exc
                continue
            self.stats["tokens_in"] += completion.tokens_in
            self.stats["tokens_out"] += completion.tokens_out
            return completion

    def close(self) -> None:
        """Close the HTTP connections (:meth:`run` does it when it returns)."""
        self.endpoint.close()


def _stops_stopped_task(ctx: AgentContext, activity: Any) -> bool:
    """``activity`` cancels or withdraws a task that is already stopped for this agent."""
    task = activity.context
    return (task is not None and (is_cancel(activity) or is_task_delete(activity))
            and ctx.toolbox.withdrawn(task) is not None)


class _StepLimit(Exception):
    """``max_steps`` model calls were made (internal: ends the run)."""
