"""One trace per task: the spans an agent opens while it works, and the context its
messages carry.

Theory of operation
-------------------
Spans follow OpenTelemetry's generative-AI and messaging conventions and are made
through ``opentelemetry-api`` only, so with no SDK configured they cost next to nothing
and still pass the received context on unchanged (the API's non-recording spans keep
their parent's context).

::

    remote send span (the Offer's sender)
      |- receive task:<me>                   CONSUMER, one per traced message read
      '- invoke_agent <me>                   INTERNAL, per task handled (per attempt)
           |- execute_tool bash              INTERNAL, per tool call
           |    '- send log                  PRODUCER: its context goes in the envelope
           |- chat <model>                   CLIENT, per model call
           '- send review                    PRODUCER

A :class:`TaskTracer` is keyed by the task's ``context`` (``urn:porter:task:...``):

* a received ``Offer`` addressed to this agent (its direct inbox, or ``target`` naming
  it) opens ``invoke_agent`` as a child of the sender's span; a later offer of the same
  task (a new attempt) ends the earlier span and opens a new one in the same trace;
* an ``Offer`` this agent sends for a task it has no span for (it creates the task)
  opens ``invoke_agent`` as a child of what is current: the tool call of the task it is
  working on (a sub-task stays in its parent's trace), or the context handed in from
  outside (:meth:`TaskTracer.adopt`: the CLI's ``--traceparent``, an MCP request's
  ``_meta``, the dashboard's go), or else a new trace;
* every message sent about a task gets a ``send`` span under the task's current span
  (a running tool call when there is one), whose context travels in the envelope: the
  activities an agent emits are children of the work that caused them;
* the agent's span for a task ends when it sends its closing word: an ``Announce`` (the
  holder's result, the creator's summary), a verdict on ``review`` (``Accept`` or
  ``Reject``), or a ``Reject`` of the offer; a withdrawal (``Delete``) ends it as
  cancelled, :meth:`TaskTracer.close` ends what is left as unfinished.

Thread safety: the brain's thread sends and reads; the node's thread reports
withdrawals. One lock guards the table.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.tasks import attempt_of
from porter_mesh.core.tracecontext import TraceContext, valid_traceparent, valid_tracestate
from porter_mesh.tracing.metrics import ServiceMetrics
from porter_mesh.tracing.ring import CONTINUED

__all__ = ["CONTINUED", "INSTRUMENTATION", "TaskTracer", "context_of", "span_context_of",
           "trace_of_span"]

#: The instrumentation scope of every span the mesh makes.
INSTRUMENTATION: Final = "porter_mesh"
_propagator = TraceContextTextMapPropagator()
# Tool calls that are the agent's own inbox polling: a span each would bury the trace
# under empty reads; the messages they return get receive spans instead.
_UNTRACED_TOOLS: Final = frozenset({"read_messages"})
_MESSAGING_SYSTEM: Final = "porter_mesh"


def context_of(trace_context: TraceContext | None) -> otel_context.Context | None:
    """The OpenTelemetry context whose (remote) parent is ``trace_context``.

    Args:
        trace_context: a received trace context, or ``None``.

    Returns:
        The context to start a child span in, or ``None`` when there is nothing valid.
    """
    if trace_context is None or not valid_traceparent(trace_context.traceparent):
        return None
    carrier = {"traceparent": trace_context.traceparent}
    if trace_context.tracestate is not None:
        carrier["tracestate"] = trace_context.tracestate
    ctx = _propagator.extract(carrier)
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def span_context_of(span: Span) -> otel_context.Context:
    """A context whose current span is ``span`` (to start children in)."""
    return trace.set_span_in_context(span)


def trace_of_span(span: Span) -> TraceContext | None:
    """The W3C trace context of ``span`` (what an envelope carries), or ``None`` when the
    span has no valid context."""
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    traceparent = carrier.get("traceparent")
    if traceparent is None or not valid_traceparent(traceparent):
        return None
    state = carrier.get("tracestate") or None
    return TraceContext(traceparent, state if valid_tracestate(state) else None)


def _closing(channel: str, activity: Activity) -> bool:
    """Whether sending ``activity`` ends the sender's part in its task."""
    kind = activity.type
    if kind == "Announce":
        return True
    if channel == C.CHANNEL_REVIEW:
        return kind in ("Accept", "Reject")
    return kind == "Reject"


class TaskTracer:
    """The spans of one agent's tasks (see the module docstring).

    Args:
        agent: the agent name (``gen_ai.agent.name``, and the span names).
        tracer: the OpenTelemetry tracer; by default the global provider's, a no-op
            until an SDK is configured.
    """

    def __init__(self, agent: str, tracer: Tracer | None = None) -> None:
        self.agent = agent
        self.tracer = tracer if tracer is not None else trace.get_tracer(INSTRUMENTATION)
        self._tasks: dict[str, Span] = {}
        self._started: dict[str, float] = {}  # task -> monotonic start of its span
        self.metrics = ServiceMetrics()
        self._origin: otel_context.Context | None = None
        self._lock = threading.Lock()

    # -- the task's own span ------------------------------------------------------------

    def adopt(self, trace_context: TraceContext | None) -> None:
        """Continue the context handed in from outside: the next task this agent creates
        without a traced task of its own is a child of it.

        Args:
            trace_context: the W3C context (``None`` forgets an earlier one).
        """
        with self._lock:
            self._origin = context_of(trace_context)

    def task_span(self, context: str | None) -> Span | None:
        """The open ``invoke_agent`` span of a task, if any."""
        if context is None:
            return None
        with self._lock:
            return self._tasks.get(context)

    def _open(self, context: str, parent: otel_context.Context | None, *,
              attempt: int | None = None, outside: bool = False) -> Span:
        """Open the task's ``invoke_agent`` span; an earlier one (an earlier attempt) ends."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.agent,
            "gen_ai.conversation.id": context,
            "porter.task.context": context,
        }
        if attempt is not None:
            attributes["porter.task.attempt"] = attempt
        if outside:
            attributes[CONTINUED] = True
        span = self.tracer.start_span(f"invoke_agent {self.agent}", context=parent,
                                      kind=SpanKind.INTERNAL, attributes=attributes)
        with self._lock:
            earlier = self._tasks.get(context)
            self._tasks[context] = span
            self._started[context] = time.monotonic()
        if earlier is not None:
            earlier.set_attribute("porter.task.superseded", True)
            earlier.end()
        return span

    def _finish(self, context: str, status: Status | None = None) -> None:
        with self._lock:
            span = self._tasks.pop(context, None)
            started = self._started.pop(context, None)
        if span is not None:
            if status is not None:
                span.set_status(status)
            span.end()
        if started is not None:
            failed = status is not None and status.status_code is StatusCode.ERROR
            self.metrics.observe("task", time.monotonic() - started, error=failed)

    def cancelled(self, context: str, reason: str) -> None:
        """End a task's span as cancelled (its requester withdrew it)."""
        with self._lock:
            span = self._tasks.get(context)
        if span is not None:
            span.set_attribute("porter.task.state", "cancelled")
            self._finish(context, Status(StatusCode.ERROR, f"cancelled: {reason}"))

    def failed(self, context: str, reason: str) -> None:
        """End a task's span as failed."""
        with self._lock:
            span = self._tasks.get(context)
        if span is not None:
            span.set_attribute("porter.task.state", "failed")
            self._finish(context, Status(StatusCode.ERROR, reason))

    # -- messages -----------------------------------------------------------------------

    def received(self, channel: str, sender: str, activity: Activity,
                 trace_context: TraceContext | None, *, msg_id: str | None = None) -> None:
        """Account for a message this agent read.

        Args:
            channel: where it arrived.
            sender: the sending agent.
            activity: the activity.
            trace_context: the context its envelope carried.
            msg_id: the message id (``messaging.message.id``).
        """
        task = activity.context
        if task is None or activity.is_fallback or sender == self.agent:
            return
        parent = context_of(trace_context)
        offer_to_me = activity.type == "Offer" and (
            channel == C.DIRECT_PREFIX + self.agent or activity.target == self.agent)
        if parent is None and not offer_to_me:
            return  # it carries no trace (an earlier version's node, or untraced work)
        attributes: dict[str, Any] = {
            "messaging.system": _MESSAGING_SYSTEM,
            "messaging.operation.type": "receive",
            "messaging.destination.name": channel,
            "messaging.client.id": self.agent,
            "porter.sender": sender,
            "porter.activity.type": activity.type,
            "porter.task.context": task,
        }
        if msg_id is not None:
            attributes["messaging.message.id"] = msg_id
        self.tracer.start_span(f"receive {channel}", context=parent, kind=SpanKind.CONSUMER,
                               attributes=attributes).end()
        if offer_to_me:
            self._open(task, parent, attempt=attempt_of(activity))
        elif activity.type == "Delete" and self.task_span(task) is not None:
            self.cancelled(task, f"withdrawn by {sender}")

    def _parent_for(self, task: str | None) -> otel_context.Context | None:
        """Where a new span about ``task`` goes: under what is current when it belongs
        to the task's trace (a tool call), else under the task's span."""
        span = self.task_span(task)
        with self._lock:
            origin = self._origin
        current = trace.get_current_span()
        current_ctx = current.get_span_context()
        # A current span that is not ours (a library's own propagation, such as an MCP
        # SDK's non-recording span) is used only when there is nothing better.
        ours = current.is_recording() or (span is None and origin is None)
        if current_ctx.is_valid and ours and (
                span is None or current_ctx.trace_id == span.get_span_context().trace_id):
            return None  # the current context
        if span is not None:
            return span_context_of(span)
        return origin

    def sending(self, channel: str, activity: Activity) -> tuple[TraceContext | None, Span | None]:
        """Open the ``send`` span of a message about to go out.

        Args:
            channel: where it goes.
            activity: the activity.

        Returns:
            The trace context for its envelope (``None`` for a message outside any
            traced task) and the span, to pass to :meth:`sent`.
        """
        task = activity.context
        if task is None:
            return None, None
        creates = (activity.type == "Offer" and self.task_span(task) is None
                   and (channel == C.CHANNEL_TASK or channel.startswith(C.DIRECT_PREFIX)))
        if creates:
            parent = self._parent_for(None)
            with self._lock:
                outside = parent is not None and parent is self._origin
            self._open(task, parent, outside=outside)
        elif self.task_span(task) is None and not trace.get_current_span(
                ).get_span_context().is_valid:
            return None, None
        attributes: dict[str, Any] = {
            "messaging.system": _MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": channel,
            "messaging.client.id": self.agent,
            "porter.activity.type": activity.type,
            "porter.task.context": task,
        }
        if channel.startswith(C.DIRECT_PREFIX):
            attributes["porter.recipient"] = channel[len(C.DIRECT_PREFIX):]
        span = self.tracer.start_span(f"send {channel}", context=self._parent_for(task),
                                      kind=SpanKind.PRODUCER, attributes=attributes)
        return trace_of_span(span), span

    def sent(self, channel: str, activity: Activity, span: Span | None,
             error: BaseException | None = None) -> None:
        """End the ``send`` span; a closing activity ends the agent's task span too.

        Args:
            channel: where it went.
            activity: the activity.
            span: what :meth:`sending` returned.
            error: the send's failure, if it failed.
        """
        if span is None:
            return
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
        if error is None and activity.context is not None and _closing(channel, activity):
            self._finish(activity.context)

    # -- work inside a task -------------------------------------------------------------

    @contextlib.contextmanager
    def _measured(self, kind: str, spans: AbstractContextManager[Span | None]
                  ) -> Iterator[Span | None]:
        """Run ``spans`` and count the work in :attr:`metrics` (failed if it raised)."""
        started = time.monotonic()
        failed = True
        try:
            with spans as span:
                yield span
            failed = False
        finally:
            self.metrics.observe(kind, time.monotonic() - started, error=failed)

    def tool_call(self, tool: str, task: str | None, arguments: Mapping[str, Any] | None = None
                  ) -> AbstractContextManager[Span | None]:
        """An ``execute_tool`` span around one tool call of a traced task, current while
        it runs (a message the tool sends is its child), and the call counted in the
        service metrics. Outside a traced task no span; the inbox poll neither.

        Args:
            tool: the tool name.
            task: the task the call acts for.
            arguments: the call's arguments (only their names are recorded).

        Returns:
            A context manager giving the span, or ``None``.
        """
        if tool in _UNTRACED_TOOLS:
            return contextlib.nullcontext()
        return self._measured(f"tool {tool}", self._tool_span(tool, task, arguments))

    @contextlib.contextmanager
    def _tool_span(self, tool: str, task: str | None,
                   arguments: Mapping[str, Any] | None) -> Iterator[Span | None]:
        span_of_task = self.task_span(task)
        if span_of_task is None:
            yield None
            return
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.agent.name": self.agent,
            "porter.task.context": task,
        }
        if arguments:
            attributes["porter.tool.arguments"] = sorted(str(k) for k in arguments)
        with self.tracer.start_as_current_span(
                f"execute_tool {tool}", context=span_context_of(span_of_task),
                kind=SpanKind.INTERNAL, attributes=attributes,
                record_exception=True, set_status_on_exception=True) as span:
            yield span

    def model_call(self, model: str, task: str | None, *,
                   provider: str = "openai") -> AbstractContextManager[Span | None]:
        """A ``chat <model>`` span around one model call of a traced task, the call
        counted in the service metrics.

        Args:
            model: the requested model (``gen_ai.request.model``).
            task: the task the agent works on.
            provider: ``gen_ai.provider.name``.

        Returns:
            A context manager giving the span (set the usage with :meth:`model_usage`),
            or ``None``.
        """
        return self._measured("chat", self._chat_span(model, task, provider))

    @contextlib.contextmanager
    def _chat_span(self, model: str, task: str | None, provider: str) -> Iterator[Span | None]:
        span_of_task = self.task_span(task)
        if span_of_task is None:
            yield None
            return
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.provider.name": provider,
            "gen_ai.agent.name": self.agent,
            "porter.task.context": task,
        }
        with self.tracer.start_as_current_span(
                f"chat {model}", context=self._parent_for(task), kind=SpanKind.CLIENT,
                attributes=attributes, record_exception=True,
                set_status_on_exception=True) as span:
            yield span

    def model_usage(self, span: Span | None, *, response_model: str | None,
                    input_tokens: int, output_tokens: int, finish_reason: str | None) -> None:
        """Record a model call's answer on its ``chat`` span, and count its tokens.

        Args:
            span: what :meth:`model_call` yielded.
            response_model: the model that answered.
            input_tokens: prompt tokens.
            output_tokens: completion tokens.
            finish_reason: why the model stopped.
        """
        self.metrics.add_tokens(input_tokens, output_tokens)
        if span is None:
            return
        if response_model:
            span.set_attribute("gen_ai.response.model", response_model)
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])

    def close(self) -> None:
        """End every task span still open (the agent stops): marked unfinished."""
        with self._lock:
            open_spans, self._tasks = list(self._tasks.values()), {}
            self._started.clear()
        for span in open_spans:
            span.set_attribute("porter.task.unfinished", True)
            span.end()
