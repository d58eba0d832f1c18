"""A brain driven by a language model: :class:`LLMBrain`.

The model is reached through any OpenAI-compatible chat-completions endpoint (a local
llama.cpp or vLLM server, Ollama, a hosted API). The package
-----------
================  ==============================================================
module            holds
================  ==============================================================
``endpoint``      the HTTP client to the model: URL rules, one request, its errors
``conversation``  the messages: pinned head, trimming by whole exchanges, shapes
``brain``         :class:`LLMBrain`: the waiting/working loop, retries, tool calls
================  ==============================================================

Every name below is importable from ``agents.llm`` itself. How ``url`` is read and
what the HTTP client refuses is in :mod:`agents.llm.endpoint`.

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

A stopped task
--------------
The brain listens to its toolbox (:meth:`Toolbox.on_stop`): when the task the model is
working for is cancelled or withdrawn, or the agent is halted, the model call in flight
is abandoned at once: :meth:`ChatEndpoint.abandon` shuts its connection down (the server
sees the client go), a retry pause is cut short, and an answer that came anyway is
dropped. The turn ends there; a stop that comes while a tool runs ends it before the
next call. The conversation gets a note that the task was stopped (so the model does
not take it up again) and the brain waits for work; the cancel or withdrawal message
itself, when it is all that arrived, does not wake the model.

Metrics
-------
:meth:`LLMBrain.metrics` (model calls, tokens in and out from the answers' ``usage``,
tool calls, errors, retries, ``abandoned_calls``) is what the agent's node reports in
its view, so ``porter-mesh stats AGENT`` shows it.

``ctx.stop`` (SIGTERM) is checked between requests, tool calls and retry pauses; an HTTP
request already under way is not interrupted by it, so stopping that way can take up to
``request_timeout`` (a halt does interrupt it, as a stopped task does).
"""

from __future__ import annotations

from agents.llm.brain import (
    EXIT_DONE,
    EXIT_MODEL_FAILED,
    EXIT_STEP_LIMIT,
    MAX_BACKOFF,
    MAX_TOOL_RESULT_CHARS,
    ROLE_PROMPTS,
    LLMBrain,
)
from agents.llm.conversation import Conversation, trim_conversation
from agents.llm.endpoint import (
    MAX_RESPONSE_BYTES,
    CallAbandoned,
    ChatEndpoint,
    Completion,
    ModelError,
    chat_completions_url,
    openai_tools,
)

__all__ = [
    "EXIT_DONE",
    "EXIT_MODEL_FAILED",
    "EXIT_STEP_LIMIT",
    "MAX_BACKOFF",
    "MAX_RESPONSE_BYTES",
    "MAX_TOOL_RESULT_CHARS",
    "ROLE_PROMPTS",
    "CallAbandoned",
    "ChatEndpoint",
    "Completion",
    "Conversation",
    "LLMBrain",
    "ModelError",
    "chat_completions_url",
    "openai_tools",
    "trim_conversation",
]
