"""The tools of one agent, bundled: :class:`Toolbox`.

A tool-calling loop (scripted or LLM-driven) needs three things from here: the tool
descriptions for its role (:meth:`Toolbox.specs`, or the OpenAI/MCP exports in
:mod:`porter_mesh.tools.schemas`), a way to run a call by name with untrusted arguments
(:meth:`Toolbox.call`, which returns text for the model or raises
:class:`~porter_mesh.errors.ToolError` with a message the model can act on), and the
system-prompt sections (:meth:`Toolbox.system_prompt`).

Task context
------------
The toolbox remembers the task the agent is working on, so that the model never has to
copy ``urn:porter:task:...`` strings around:

* an ``Offer`` addressed to this agent (its direct channel or ``target``; for a
  reviewer, also a review ``Offer`` on ``review``) makes that task current, and its
  ``attempt`` number is kept for the task;
* a message sent with an explicit ``context``, or an ``Offer`` on a task channel (which
  mints a new task id when none is given), makes that task current;
* every message and every file or command record about a task carries the kept
  ``attempt`` back, which is how the architect's board fences stale claims
  (:mod:`porter_mesh.core.tasks`);
* a withdrawal of the task (a ``Delete`` of it, for the kept attempt, from the agent
  that offered it) forgets it, and must be obeyed (below).

Withdrawn tasks
---------------
When the architect re-offers a task elsewhere (this agent expired, was paused, did not
accept in time), it withdraws the old claim. The agent program passes every delivered
message to :meth:`Toolbox.observe` as it arrives, so a withdrawal takes effect while a
tool is still running, not only when the agent next reads its messages: a ``bash``
command running for the withdrawn task is stopped at once (everything it started), and
from then on every call that would act for it (``bash``, ``write_file``, ``edit_file``,
``memory_write``, ``send_message`` about it) raises
:class:`~porter_mesh.errors.TaskWithdrawn` instead of acting, so no result of the stale
attempt is reported. Reading (messages, files, memory) still works, and a new offer makes
the agent's next task current. A withdrawal for another attempt than the one kept (an old
claim of a task offered to this agent again) is ignored.

Records
-------
``bash`` records an ``Invoke`` (command and the end of its output) on ``log``;
``write_file`` records a ``Create`` (new file) or ``Update`` (replaced file) and
``edit_file`` an ``Update``, each with the file as a ``Document``; ``git`` records an
``Invoke`` for ``add`` and ``commit`` (what changes the repository); ``memory_query``
records a ``Recall`` with its rows; ``memory_write`` hands a ``Remember`` to the node.
``list_dir``, ``glob``, ``grep``, ``read_file`` and ``peers`` only look.
A record that cannot be sent is logged and does not fail the tool call: the work it
describes has already happened. An ``Invoke`` is only ever such a record of what this
agent ran; ``send_message`` cannot send one, and nothing here runs a command because a
peer asked for it.

Drain and halt
--------------
The agent program forwards the node's control messages: :meth:`Toolbox.drain` makes
accepting a new task fail (the agent is told to reject offers and finish what it
holds); :meth:`Toolbox.halt` stops a running ``bash`` or ``git`` command at once (every
process it started gets SIGTERM, then SIGKILL after the grace period; see
:mod:`porter_mesh.tools.shell`) and refuses every later call until :meth:`Toolbox.resume`.
:meth:`Toolbox.interrupt` stops the running command only (a caller gave up waiting for
it). :meth:`Toolbox.on_stop` tells a listener, from the stopping thread, of every task
cancelled or withdrawn and of a halt, so a brain can abandon what it waits on for the
task (the LLM brain's model call).

External tools
--------------
``external=`` adds the tools of external MCP servers
(:class:`~porter_mesh.tools.external.ExternalTools`), named ``<server>__<tool>``; a
call is forwarded to the server and its arguments are checked there.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from porter_mesh.core import as2
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity
from porter_mesh.core.constants import (
    CHANNEL_CONTROL,
    CHANNEL_LOG,
    CHANNEL_REVIEW,
    CHANNEL_TASK,
    DIRECT_PREFIX,
)
from porter_mesh.core.lifecycle import Status, TaskRecord, is_cancel, same_party
from porter_mesh.core.taskid import new_task_id
from porter_mesh.core.tasks import ATTEMPT_FIELD, attempt_of, cancel_activity, is_task_delete
from porter_mesh.errors import (
    ActivityError,
    ConfigError,
    DeliveryError,
    KnowledgeError,
    NodeClosedError,
    PorterError,
    SecurityError,
    StorageError,
    TaskWithdrawn,
    ToolError,
    UnknownPeerError,
)
from porter_mesh.tools import memory, messaging, search
from porter_mesh.tools.external import ExternalTools
from porter_mesh.tools.git import git_argv, run_git
from porter_mesh.tools.ledger import TaskLedger
from porter_mesh.tools.port import InboxItem, MeshPort
from porter_mesh.tools.prompt import roster_section, system_prompt_sections
from porter_mesh.tools.schemas import (
    DEFAULT_BASH_TIMEOUT,
    MAX_BASH_TIMEOUT,
    ToolSpec,
    check_arguments,
    specs_for,
)
from porter_mesh.tools.shell import (
    DEFAULT_GRACE,
    DEFAULT_TAIL_BYTES,
    CommandHandle,
    CommandResult,
    run_command,
)
from porter_mesh.tools.workspace import Workspace
from porter_mesh.tracing.tasks import TaskTracer

__all__ = ["CancelOutcome", "Toolbox"]

_log = logging.getLogger("porter_mesh.tools")

#: How much of a command and its output goes into the ``Invoke`` record (bytes of text).
RECORD_LIMIT: Final = 4096

#: Messages one ``read_messages`` call takes from the inbox.
DEFAULT_INBOX_LIMIT: Final = 50

def _newer(attempt: int | None, withdrawn: int | None) -> bool:
    """An offer with ``attempt`` is a new claim after the withdrawal of ``withdrawn``."""
    return attempt is None or withdrawn is None or attempt > withdrawn


def _clip_end(text: str, limit: int = RECORD_LIMIT) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def _clip_start(text: str, limit: int = RECORD_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What :meth:`Toolbox.cancel` did with a cancel addressed to this agent.

    Attributes:
        context: the task.
        sender: who asked.
        reason: the cancel's reason, in words.
        refused: why it was refused (the sender is neither the requester nor the
            human, or the task is already over), else ``None``.
        subtasks: the open sub-tasks this agent offered for it, to cancel in turn.
        parent: the task this one is a sub-task of, if any.
    """

    context: str
    sender: str
    reason: str
    refused: str | None = None
    subtasks: tuple[TaskRecord, ...] = ()
    parent: str | None = None


class Toolbox:
    """The tools of one agent.

    Args:
        port: the node, as the tools see it.
        workspace: the agent's workspace directory (or a :class:`Workspace`); needed
            by ``bash`` and the file tools, ``None`` for roles without them.
        role: ``architect``, ``worker`` or ``reviewer``; picks the tool set and the
            default message types.
        tools: explicit tool names, overriding the role's set.
        bash_timeout: default ``bash`` timeout, seconds.
        grace: seconds between SIGTERM and SIGKILL when a command is stopped.
        tail_bytes: bytes of the end of a command's output returned to the agent.
        inbox_limit: messages one ``read_messages`` call takes.
        external: tools of external MCP servers to add (the caller owns and closes it).
        ledger: the agent's task ledger (one kept in its data directory survives a
            restart); a new one in memory by default.
        traces: the agent's task spans; each call of a traced task gets an
            ``execute_tool`` span (see :mod:`porter_mesh.tracing`).

    Raises:
        ConfigError: unknown role or tool, a file/shell/git tool without a workspace,
            or an external tool whose name is taken.
        ToolError: the workspace is not an existing directory.
    """

    def __init__(
        self,
        port: MeshPort,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        *,
        role: str = "worker",
        tools: Iterable[str] | None = None,
        bash_timeout: float = DEFAULT_BASH_TIMEOUT,
        grace: float = DEFAULT_GRACE,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        inbox_limit: int = DEFAULT_INBOX_LIMIT,
        external: ExternalTools | None = None,
        ledger: TaskLedger | None = None,
        traces: TaskTracer | None = None,
    ) -> None:
        self.port = port
        self.traces = traces
        self.role = role
        self._specs = {s.name: s for s in specs_for(role, tools)}
        self.external = external
        if external is not None:
            taken = sorted(set(self._specs) & set(external.names()))
            if taken:
                raise ConfigError(f"external tool name(s) {', '.join(taken)} are taken by "
                                  "the agent's own tools; rename the server")
        needs_workspace = [n for n, s in self._specs.items() if s.needs_workspace]
        if workspace is None:
            if needs_workspace:
                raise ConfigError(
                    f"tools {', '.join(needs_workspace)} need a workspace directory"
                )
            self.workspace: Workspace | None = None
        else:
            self.workspace = (
                workspace if isinstance(workspace, Workspace) else Workspace(Path(workspace))
            )
        if not 0 < bash_timeout <= MAX_BASH_TIMEOUT:
            raise ConfigError(f"bash_timeout must be in (0, {MAX_BASH_TIMEOUT}] seconds")
        if inbox_limit < 1:
            raise ConfigError("inbox_limit must be >= 1")
        self.bash_timeout = bash_timeout
        self.grace = grace
        self.tail_bytes = tail_bytes
        self.inbox_limit = inbox_limit
        self.context: str | None = None
        self._attempts: dict[str, int] = {}
        self._accepted: set[str] = set()  # tasks this agent took (Accept sent)
        self.draining = False
        self._halted: str | None = None
        self._running: CommandHandle | None = None  # the command running now
        self._running_for: str | None = None  # the task it runs for
        # Withdrawn tasks: context -> (attempt withdrawn, reason); the task that was
        # current when it was withdrawn (calls without a context act for it); who
        # offered each task (the only agent whose withdrawal counts).
        self._withdrawn: dict[str, tuple[int | None, str]] = {}
        self._interrupted: str | None = None
        self._offered_by: dict[str, str] = {}
        self._lock = threading.Lock()  # observe() runs on the node's thread
        self._idle = threading.Condition(self._lock)  # notified when a command ends
        self._stop_listeners: list[Callable[[str | None, str], None]] = []
        self.ledger = ledger if ledger is not None else TaskLedger(port.agent_name)

    # -- the loop's interface -------------------------------------------------------------

    @property
    def agent_name(self) -> str:
        """The agent these tools act for."""
        return self.port.agent_name

    def specs(self) -> list[ToolSpec]:
        """The tools this agent may call (its own, then the external ones)."""
        own = list(self._specs.values())
        return own + (self.external.specs() if self.external is not None else [])

    def system_prompt(self) -> str:
        """The messaging and live team sections for the agent's system prompt."""
        return system_prompt_sections(self.port, role=self.role)

    def resume_task(self, context: str) -> TaskRecord | None:
        """Take up again a task the ledger says this agent holds (after a restart): it
        becomes the current task, with its requester and attempt.

        Args:
            context: the task.

        Returns:
            Its record, or ``None`` when this agent does not hold it (nothing changes).
        """
        record = self.ledger.get(context)
        if record is None or record.holder != self.agent_name or record.final:
            return None
        with self._lock:
            self.context = context
            self._offered_by[context] = record.requester
            if record.attempt is not None:
                self._attempts[context] = record.attempt
            self._accepted.add(context)
        return record

    def attempt_for(self, context: str) -> int | None:
        """The claim attempt kept for a task, if one was offered with it."""
        return self._attempts.get(context)

    def call(self, name: str, arguments: Mapping[str, Any] | None) -> str:
        """Run one tool call.

        Args:
            name: the tool name.
            arguments: the decoded arguments (``None`` means none).

        Returns:
            The tool's result as text for the model.

        Raises:
            ToolError: unknown tool, bad arguments, or the tool failed; the message says
                what to do.
        """
        if self.traces is None:
            return self._call(name, arguments)
        with self.traces.tool_call(name, self.context, arguments):
            return self._call(name, arguments)

    def _call(self, name: str, arguments: Mapping[str, Any] | None) -> str:
        if self._halted is not None:
            raise ToolError(
                f"this agent was halted ({self._halted}); stop working and end your turn"
            )
        spec = self._specs.get(name)
        if spec is None:
            if self.external is not None and name in self.external.names():
                return self.external.call(name, arguments)
            known = ", ".join(s.name for s in self.specs())
            raise ToolError(f"unknown tool {name!r}; your tools are: {known}")
        args = dict(arguments) if arguments is not None else {}
        if name == "memory_query" and "sparql" in args and "query" not in args:
            args["query"] = args.pop("sparql")  # the profile's own name for it
        checked = check_arguments(spec, args)
        method = getattr(self, name)
        try:
            result: str = method(**checked)
        except OSError as exc:
            raise ToolError(f"{name}: {exc.strerror or exc}") from exc
        except UnicodeError as exc:
            raise ToolError(
                f"{name}: the text is not valid Unicode ({exc}); send plain UTF-8 text"
            ) from exc
        return result

    # -- drain and halt -----------------------------------------------------------------------

    def drain(self) -> None:
        """Finish the tasks held, take no new one: accepting another task is refused."""
        self.draining = True

    def halt(self, reason: str = "halted by the mesh") -> None:
        """Stop now: a running command is stopped and every later tool call is refused.

        Safe to call from another thread (the node's control handler) while a tool runs.

        Args:
            reason: shown to the agent in the refusal.
        """
        self._halted = reason
        running = self._running
        if running is not None:
            running.stop(f"halted: {reason}")
        self._tell_stopped(None, f"halted: {reason}")

    def on_stop(self, listener: Callable[[str | None, str], None]) -> Callable[[], None]:
        """Be told when work must stop: a task cancelled or withdrawn, or the agent halted.

        The listener is called from the thread that stopped the work (the node's thread,
        for a cancel or a withdrawal as it arrives), with the task (``None`` for a halt,
        which stops every task) and the reason in words. It must be quick and not raise:
        it is how a brain abandons what it is waiting on for that task (a model call).

        Args:
            listener: ``listener(context, reason)``.

        Returns:
            A function that removes the listener.
        """
        with self._lock:
            self._stop_listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._stop_listeners:
                    self._stop_listeners.remove(listener)

        return remove

    def _tell_stopped(self, context: str | None, reason: str) -> None:
        """Call the stop listeners (without the lock: a listener may call back in)."""
        with self._lock:
            listeners = list(self._stop_listeners)
        for listener in listeners:
            try:
                listener(context, reason)
            except Exception:  # one broken listener must not keep the others uninformed
                _log.exception("a stop listener failed for %s", context)

    def resume(self) -> None:
        """Undo :meth:`drain` and :meth:`halt`."""
        self.draining = False
        self._halted = None

    def interrupt(self) -> None:
        """Stop the command running now, if any (later calls are not refused).

        Safe to call from another thread, as :meth:`halt` is.
        """
        running = self._running
        if running is not None:
            running.stop("interrupted: the caller stopped waiting")

    def _command_ended(self) -> None:
        with self._idle:
            self._running = self._running_for = None
            self._idle.notify_all()

    def wait_stopped(self, context: str, timeout: float) -> bool:
        """Wait until no command runs for ``context`` (one stopped by a withdrawal or a
        cancel has ended, every process it started gone).

        Args:
            context: the task.
            timeout: seconds.

        Returns:
            ``True`` when none runs for it; ``False`` if one still does at ``timeout``.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._running_for != context, timeout)

    def _command_started(self, task: str | None) -> Callable[[CommandHandle], None]:
        """What a command of this toolbox, run for ``task``, calls once it runs."""

        def started(handle: CommandHandle) -> None:
            with self._lock:
                self._running, self._running_for = handle, task
            # Halted or withdrawn between the checks and the start:
            if self._halted is not None:
                handle.stop(f"halted: {self._halted}")
            entry = self._withdrawn.get(task) if task is not None else None
            if entry is not None:
                handle.stop(f"withdrawn: {entry[1]}")

        return started

    # -- messaging ----------------------------------------------------------------------------

    def send_message(
        self,
        channel: str,
        message: str,
        type: str | None = None,
        context: str | None = None,
        tag: list[str] | None = None,
    ) -> str:
        """Send a plain-text message as an AS2 activity (see :mod:`.messaging`).

        Args:
            channel: ``log``, ``task``, ``review`` or ``task:<agent>``.
            message: first line summary, then details.
            type: the activity type; by default from the channel and role.
            context: the task; by default the current task (a new one for an Offer on
                a task channel); ``""`` says the message is about no task (an answer to
                a message that named none must not be taken for news of the current one).
            tag: labels.

        Returns:
            A confirmation naming the type, channel and task.

        Raises:
            ToolError: bad channel or text, unknown recipient, or delivery failed.
        """
        me = self.agent_name
        chan = messaging.check_channel(channel, me)
        kind = type or messaging.default_type(chan, self.role, message)
        on_task_channel = chan == CHANNEL_TASK or chan.startswith(DIRECT_PREFIX)
        parent: str | None = None
        if context == "":
            ctx: str | None = None
        elif context is not None:
            ctx = messaging.normalise_context(context)
        elif kind == "Offer" and on_task_channel:
            ctx = new_task_id()
            parent = self._holding()
        else:
            ctx = self.context
        self._acting_for(parent if parent is not None else ctx)
        takes_task = kind == "Accept" and chan != CHANNEL_REVIEW and ctx is not None
        if takes_task and self.draining and ctx not in self._accepted:
            raise ToolError(
                "you are draining: finish the tasks you hold and Reject new offers "
                "(send_message with type Reject and the reason)"
            )
        attempt = self._attempts.get(ctx) if ctx is not None else None
        activity = messaging.compose(
            actor=me, channel=chan, text=message, kind=kind, context=ctx, tag=tag,
            attempt=attempt, parent=parent,
        )
        self._send(chan, activity)
        if takes_task and ctx is not None:
            self._accepted.add(ctx)
        if parent is not None:
            # A sub-task: this agent goes on working on the task it holds.
            return f"Sent {kind} on {chan} about sub-task {ctx} of your task {parent}."
        if ctx is not None and (context is not None or kind == "Offer"):
            self.context = ctx
            self._interrupted = None
        where = f" about task {ctx}" if ctx else ""
        return f"Sent {kind} on {chan}{where}."

    def _holding(self) -> str | None:
        """The current task when this agent holds it (was offered it, still open)."""
        ctx = self.context
        record = self.ledger.get(ctx) if ctx is not None else None
        if record is None or record.holder != self.agent_name or record.final:
            return None
        return ctx

    def cancel_task(self, context: str, reason: str | None = None) -> str:
        """Cancel a task this agent offered: a cancel to its holder, which stops, cancels
        its sub-tasks and confirms on ``log`` (see ``docs/protocol.md``, "Cancel").

        Args:
            context: the task URN or bare id.
            reason: why, in one line.

        Returns:
            A confirmation naming the holder told.

        Raises:
            ToolError: not a task this agent offered, already over, held by nobody, or
                the holder could not be told.
        """
        ctx = messaging.normalise_context(context)
        record = self.ledger.get(ctx)
        me = self.agent_name
        if record is None or record.requester != me:
            offered = [r.context for r in self.ledger.records()
                       if r.requester == me and not r.final]
            whose = "" if record is None else f" (it was offered by {record.requester})"
            raise ToolError(
                f"cancel_task: {ctx} is not a task you offered{whose}; only its requester "
                f"or the human may cancel it. Your open tasks: {', '.join(offered) or 'none'}")
        if record.final:
            raise ToolError(f"cancel_task: task {ctx} is already {record.status.value}")
        if record.holder is None:
            raise ToolError(f"cancel_task: task {ctx} is held by nobody yet; nothing to stop")
        why = messaging.split_text(reason)[0] if reason and reason.strip() else \
            f"cancelled by {me}"
        activity = cancel_activity(me, ctx, why, cancel=True, parent=record.parent)
        self._send(DIRECT_PREFIX + record.holder, activity)
        return (f"Cancelled task {ctx}: {record.holder} was told to stop and to cancel the "
                "sub-tasks it delegated; its confirmation (an Announce tagged "
                "'cancelled') will come on 'log'.")

    def read_messages(self, channel: str | None = None) -> str:
        """Drain the inbox and return it as text (see :mod:`.messaging`).

        Args:
            channel: only this channel; the others stay queued.

        Returns:
            One line per message, or ``No new messages.``.

        Raises:
            ToolError: a bad channel name, or the node is closed.
        """
        me = self.agent_name
        chan: str | None = None
        if channel is not None:
            chan = channel.strip()
            if chan != DIRECT_PREFIX + me:
                chan = messaging.check_channel(chan, me)
                if chan.startswith(DIRECT_PREFIX):
                    raise ToolError(
                        f"you can read only your own direct channel, {DIRECT_PREFIX}{me}"
                    )
        try:
            items = self.port.drain_inbox(chan, self.inbox_limit)
        except NodeClosedError as exc:
            raise ToolError(f"read_messages: the mesh node is closed ({exc})") from exc
        shown = []
        for item in items:
            if item.channel == CHANNEL_CONTROL or item.sender == me:
                continue
            self._track(item)
            shown.append(item)
        return messaging.render_inbox(shown, more_waiting=len(items) >= self.inbox_limit)

    def _track(self, item: InboxItem) -> None:
        """Follow the task context through received offers and withdrawals."""
        activity = item.activity
        ctx = activity.context
        if ctx is None or activity.is_fallback:
            return
        me = self.agent_name
        to_me = item.channel == DIRECT_PREFIX + me or activity.target == me
        attempt = attempt_of(activity)
        if activity.type == "Offer":
            # The ledger has usually seen it already (observe, as it arrived); not when it
            # came before the agent was watching, while it started. Folding twice is
            # harmless: the same Offer again changes nothing.
            self.ledger.saw(activity, sender=item.sender, channel=item.channel)
            review_for_me = self.role == "reviewer" and item.channel == CHANNEL_REVIEW
            if to_me or review_for_me:
                with self._lock:
                    withdrawn = self._withdrawn.get(ctx)
                    if withdrawn is not None and _newer(attempt, withdrawn[0]):
                        del self._withdrawn[ctx]  # offered again: a new claim
                        withdrawn = None
                    if withdrawn is None:  # (an offer of the withdrawn claim is stale)
                        self.context = ctx
                        self._interrupted = None
                        self._offered_by[ctx] = item.sender
                        if attempt is not None:
                            self._attempts[ctx] = attempt
        else:
            self.observe(item.channel, item.sender, activity)

    def observe(self, channel: str, sender: str, activity: Activity) -> bool:
        """See a message as the node delivers it (from any thread): a withdrawal of a
        task this agent holds takes effect at once (see "Withdrawn tasks" above).

        Args:
            channel: where it arrived.
            sender: the authenticated sender.
            activity: the activity.

        Returns:
            ``True`` when it withdrew a task from this agent.
        """
        me = self.agent_name
        ctx = activity.context
        if sender != me:
            self.ledger.saw(activity, sender=sender, channel=channel)
        if is_cancel(activity):
            outcome = self.cancel(channel, sender, activity, seen=True)
            return outcome is not None and outcome.refused is None
        if (
            ctx is None
            or activity.is_fallback
            or not is_task_delete(activity)
            or not (channel == DIRECT_PREFIX + me or activity.target == me)
        ):
            return False
        return self.withdraw(ctx, attempt_of(activity), sender=sender,
                             reason=activity.summary)

    def cancel(self, channel: str, sender: str, activity: Activity, *,
               seen: bool = False) -> CancelOutcome | None:
        """Obey (or refuse) a cancel of a task this agent holds; safe from any thread.

        Only the task's requester or the human may cancel it. An accepted cancel stops
        the task as a withdrawal does (its running command is stopped, every later call
        for it refused) and names the open sub-tasks this agent offered for it, which the
        caller cancels in turn (see ``docs/protocol.md``, "Cancel").

        Args:
            channel: where it arrived.
            sender: the authenticated sender.
            activity: the activity.
            seen: the ledger has already folded it (:meth:`observe` did).

        Returns:
            ``None`` when ``activity`` is not a cancel addressed to this agent; else what
            was done.
        """
        me = self.agent_name
        ctx = activity.context
        if (ctx is None or not is_cancel(activity)
                or not (channel == DIRECT_PREFIX + me or activity.target == me)):
            return None
        record = self.ledger.get(ctx)
        reason = activity.summary
        if record is not None and not (same_party(sender, record.requester)
                                       or is_human(sender)):
            return CancelOutcome(ctx, sender, reason, refused=(
                f"only {record.requester} (who requested task {ctx}) or the human may "
                f"cancel it; {sender} may not"))
        if (record is not None and record.final and record.status is not Status.CANCELLED
                and not seen):
            return CancelOutcome(ctx, sender, reason,
                                 refused=f"task {ctx} is already {record.status.value}")
        if not seen:
            self.ledger.saw(activity, sender=sender, channel=channel)
        with self._lock:
            self._stop_task(ctx, None, f"cancelled by {sender}: {reason}")
            running = self._running if self._running_for == ctx else None
        if running is not None:
            running.stop(f"cancelled: {reason}")
        self._tell_stopped(ctx, f"cancelled by {sender}: {reason}")
        return CancelOutcome(ctx, sender, reason, subtasks=tuple(self.ledger.open_children(ctx)),
                             parent=record.parent if record is not None else None)

    def withdraw(self, context: str, attempt: int | None, *, sender: str,
                 reason: str) -> bool:
        """Withdraw a task from this agent: stop its running command, act no more for it.

        Safe to call from any thread.

        Args:
            context: the task.
            attempt: the claim withdrawn (``None``: whatever claim is kept).
            sender: who withdraws it; must be the agent that offered it, if known.
            reason: why, in words.

        Returns:
            ``True`` if the task was withdrawn; ``False`` for another attempt's
            withdrawal or one from an agent that did not offer the task.
        """
        with self._lock:
            kept = self._attempts.get(context)
            if attempt is not None and kept is not None and attempt != kept:
                return False  # about an older claim; this agent holds a newer one
            offerer = self._offered_by.get(context)
            if offerer is not None and sender != offerer:
                _log.warning("ignored a withdrawal of %s from %s, which did not offer it",
                             context, sender)
                return False
            self._stop_task(context, attempt if attempt is not None else kept, reason)
            running = self._running if self._running_for == context else None
        if running is not None:
            running.stop(f"withdrawn: {reason}")
        self._tell_stopped(context, f"withdrawn: {reason}")
        return True

    def _stop_task(self, context: str, attempt: int | None, reason: str) -> None:
        """Act no more for ``context`` (call with the lock held)."""
        self._withdrawn[context] = (attempt, reason)
        self._attempts.pop(context, None)
        self._accepted.discard(context)
        if self.context == context:
            self.context = None
            self._interrupted = context

    def withdrawn(self, context: str) -> str | None:
        """Why a task was withdrawn from this agent, or ``None`` if it was not."""
        entry = self._withdrawn.get(context)
        return None if entry is None else entry[1]

    def _acting_for(self, context: str | None) -> None:
        """Refuse to act for a withdrawn task (``None``: the task interrupted last)."""
        target = context if context is not None else self._interrupted
        entry = self._withdrawn.get(target) if target is not None else None
        if target is None or entry is None:
            return
        self._refuse_withdrawn(target, entry)

    def _refuse_withdrawn(self, context: str, entry: tuple[int | None, str],
                          detail: str = "") -> None:
        attempt, reason = entry
        claim = f" (attempt {attempt})" if attempt is not None else ""
        raise TaskWithdrawn(
            f"task {context}{claim} was withdrawn from you: {reason}.{detail} Stop working "
            "on it and do not report a result; read_messages for your next task",
            context=context, attempt=attempt, reason=reason,
        )

    # -- memory -------------------------------------------------------------------------------

    def memory_write(self, about: str, finding: str, severity: str | None = None) -> str:
        """Record a finding in the shared knowledge graph.

        Args:
            about: what it is about.
            finding: the finding.
            severity: optional severity label.

        Returns:
            A confirmation.

        Raises:
            ToolError: the node refused it.
        """
        self._acting_for(self.context)
        summary = messaging.split_text(f"Finding about {about.strip()}")[0]
        try:
            activity = as2.remember(
                self.agent_name,
                summary,
                about.strip(),
                finding.strip(),
                context=self.context,
                severity=severity,
                extra=self._attempt_extra(),
            )
            self.port.remember(activity)
        except (KnowledgeError, ActivityError, StorageError, SecurityError) as exc:
            raise ToolError(f"memory_write: not stored: {exc}") from exc
        except (DeliveryError, NodeClosedError) as exc:
            raise ToolError(f"memory_write: the mesh could not take it: {exc}") from exc
        return f"Remembered about {about.strip()}: {finding.strip()}"

    def memory_query(self, query: str) -> str:
        """Search the shared knowledge graph (keywords or SPARQL).

        Args:
            query: keywords, or a read-only SPARQL query.

        Returns:
            The rows as text.

        Raises:
            ToolError: the query was refused or failed; the message says why.
        """
        sparql = query if memory.is_sparql(query) else memory.keyword_query(query)
        try:
            result = self.port.recall(sparql)
        except KnowledgeError as exc:
            raise ToolError(f"memory_query: {exc}") from exc
        except NodeClosedError as exc:
            raise ToolError(f"memory_query: the mesh node is closed ({exc})") from exc
        rows = [dict(row) for row in result.rows[: memory.ROW_LIMIT]]
        summary = messaging.split_text(query)[0]
        self._record(
            lambda: as2.recall(
                self.agent_name,
                f"Query: {summary}",
                _clip_start(sparql),
                result_items=rows,
                context=self.context,
                extra=self._attempt_extra(),
            )
        )
        return memory.render_rows(result)

    # -- shell and files ---------------------------------------------------------------------

    def _require_workspace(self) -> Workspace:
        if self.workspace is None:  # the constructor prevents this for enabled tools
            raise ToolError("this agent has no workspace")
        return self.workspace

    def bash(self, command: str, timeout: float | None = None) -> str:
        """Run a command in the workspace and record it as an ``Invoke``.

        Args:
            command: the shell command.
            timeout: seconds (default ``bash_timeout``).

        Returns:
            The end of the output and the exit status.

        Raises:
            ToolError: the command is empty or cannot start.
        """
        ws = self._require_workspace()
        task = self.context
        self._acting_for(task)
        try:
            result = run_command(
                command,
                cwd=ws.root,
                timeout=float(timeout if timeout is not None else self.bash_timeout),
                grace=self.grace,
                tail_bytes=self.tail_bytes,
                on_start=self._command_started(task),
            )
        finally:
            self._command_ended()
        entry = self._withdrawn.get(task) if task is not None else None
        if task is not None and entry is not None:
            # The attempt is void: nothing of it is recorded or returned as a result.
            _log.info("command for withdrawn task %s: %s", task, result.status_line())
            self._refuse_withdrawn(task, entry, f" Its command was stopped: "
                                   f"{result.status_line()}.")
        text = result.render()
        self._record_invoke(command, result, text)
        return text

    def _record_invoke(self, command: str, result: CommandResult, text: str) -> None:
        first = messaging.split_text(command)[0]
        self._record(
            lambda: as2.invoke(
                self.agent_name,
                f"Ran: {_clip_start(first, 100)} {result.status_line()}",
                _clip_start(command),
                _clip_end(text),
                context=self.context,
                extra=self._attempt_extra(),
            )
        )

    def list_dir(self, path: str | None = None) -> str:
        """List a workspace directory (see :func:`.search.list_dir`)."""
        return search.list_dir(self._require_workspace(), path)

    def glob(self, pattern: str, path: str | None = None) -> str:
        """Find workspace paths by glob pattern (see :func:`.search.glob`)."""
        return search.glob(self._require_workspace(), pattern, path)

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None,
             ignore_case: bool | None = None) -> str:
        """Search workspace files for a regular expression (see :func:`.search.grep`)."""
        return search.grep(self._require_workspace(), pattern, path, glob=glob,
                           ignore_case=bool(ignore_case))

    def git(self, command: str, paths: list[str] | None = None, message: str | None = None,
            staged: bool | None = None, limit: int | None = None) -> str:
        """Run git status, diff, log, add or commit in the workspace (see :mod:`.git`).

        ``add`` and ``commit`` are recorded as an ``Invoke`` on ``log``.

        Raises:
            WorkspaceError: a path leaves the workspace.
            ToolError: bad arguments, not a repository, or git failed (with its output).
        """
        ws = self._require_workspace()
        argv = git_argv(ws, command, paths=paths, message=message, staged=bool(staged),
                        limit=limit)
        task = self.context
        self._acting_for(task)
        try:
            text, result = run_git(ws, argv, author=self.agent_name,
                                   timeout=float(self.bash_timeout), grace=self.grace,
                                   output_bytes=self.tail_bytes,
                                   on_start=self._command_started(task))
        finally:
            self._command_ended()
        if command in ("add", "commit"):
            shown = shlex.join(["git", *argv[argv.index(command):]])
            self._record_invoke(shown, result, text)
        return text

    def peers(self) -> str:
        """The agents on the mesh now, as text."""
        try:
            roster = self.port.roster()
        except NodeClosedError as exc:
            raise ToolError(f"peers: the mesh node is closed ({exc})") from exc
        return roster_section(roster, me=self.agent_name, role=self.role)

    def read_file(self, path: str) -> str:
        """Read a workspace file.

        Args:
            path: relative to the workspace.

        Returns:
            The content (its beginning, with a note, for large files).

        Raises:
            WorkspaceError: the path leaves the workspace.
            ToolError: missing, binary or unreadable file.
        """
        outcome = self._require_workspace().read(path)
        if outcome.truncated:
            shown = len(outcome.text.encode())
            return (
                f"{outcome.text}\n[truncated: {outcome.path} is {outcome.size} bytes; the "
                f"first {shown} are shown. Read the rest with bash, e.g. "
                f"tail -c +{shown + 1} {outcome.path} | head -c 100000]"
            )
        return outcome.text

    def write_file(self, path: str, content: str) -> str:
        """Create or replace a workspace file; records ``Create`` or ``Update``.

        Args:
            path: relative to the workspace.
            content: the whole new content.

        Returns:
            A confirmation with the size.

        Raises:
            WorkspaceError: the path leaves the workspace.
            ToolError: too large, or not writable.
        """
        self._acting_for(self.context)
        outcome = self._require_workspace().write(path, content)
        verb = "Created" if outcome.created else "Replaced"
        self._record_file(as2.create if outcome.created else as2.update, verb, outcome.path)
        return f"{verb} {outcome.path} ({outcome.size} bytes)."

    def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace the single occurrence of ``old`` in a file; records ``Update``.

        Args:
            path: relative to the workspace.
            old: exact text occurring once.
            new: its replacement.

        Returns:
            A confirmation.

        Raises:
            WorkspaceError: the path leaves the workspace.
            ToolError: missing file, ``old`` absent or not unique, or too large.
        """
        self._acting_for(self.context)
        outcome = self._require_workspace().edit(path, old, new)
        self._record_file(as2.update, "Edited", outcome.path)
        return (
            f"Edited {outcome.path}: replaced {outcome.removed_lines} line(s) with "
            f"{outcome.added_lines} ({outcome.size} bytes now)."
        )

    # -- helpers ------------------------------------------------------------------------------

    def _attempt_extra(self) -> dict[str, Any] | None:
        if self.context is None:
            return None
        attempt = self._attempts.get(self.context)
        return None if attempt is None else {ATTEMPT_FIELD: attempt}

    def sent(self, channel: str, activity: Activity) -> None:
        """Tell the ledger about an activity this agent sent without the tools (a
        board's offers and withdrawals, a review request, a cancel's cascade)."""
        self.ledger.saw(activity, sender=self.agent_name, channel=channel)

    def _send(self, channel: str, activity: Activity) -> None:
        try:
            self.port.send(channel, activity)
            self.sent(channel, activity)
        except UnknownPeerError as exc:
            names = ", ".join(sorted(e.name for e in self.port.roster())) or "nobody"
            raise ToolError(
                f"send_message: {exc.recipient or channel} is not on the mesh; "
                f"online now: {names}"
            ) from exc
        except DeliveryError as exc:
            raise ToolError(
                f"send_message: not delivered on {channel}: {exc}; try again later or "
                "tell the team on 'log'"
            ) from exc
        except NodeClosedError as exc:
            raise ToolError(f"send_message: the mesh node is closed ({exc})") from exc

    def _record_file(self, build: Callable[..., Activity], verb: str, path: str) -> None:
        """Record a file change (``Create``/``Update`` of a ``Document``) on ``log``."""
        self._record(
            lambda: build(
                self.agent_name,
                f"{verb} {path}",
                as2.document(path),
                context=self.context,
                instrument=("file",),
                extra=self._attempt_extra(),
            )
        )

    def _record(self, build: Callable[[], Activity]) -> None:
        """Send a record on ``log``; a failure is logged, never raised."""
        try:
            self.port.send(CHANNEL_LOG, build())
        except PorterError as exc:
            _log.warning("could not record a tool call on %s: %s", CHANNEL_LOG, exc)
