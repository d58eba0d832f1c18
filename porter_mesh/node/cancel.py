"""What an agent does when one of its tasks is cancelled, and how it tells the mesh
what tasks it has: the driver of :meth:`~porter_mesh.tools.toolbox.Toolbox.cancel`
over a :class:`~porter_mesh.node.sync.SyncNode`, used by the agent program and by the
MCP gateway alike.

:func:`watch_tasks` shows the toolbox every delivered message as it arrives, on the
node's thread, so that a withdrawal or a cancel stops the work while a tool is still
running for it. A cancel (see ``docs/protocol.md``, "Cancel") is carried out here, not by
the brain, so it works the same for a scripted brain, an LLM brain, an MCP host, or a
brain blocked in a long command:

1. the toolbox refuses it unless it comes from the task's requester or the human; a
   refusal is answered with a ``Reject`` on the sender's direct channel, logged and
   counted (``dropped.cancel-refused``);
2. otherwise the toolbox stops the task at once (the bash tool's containment stops its
   command, every later call for it is refused);
3. each open sub-task this agent offered for it is cancelled in turn, by a cancel sent to
   its holder (which does the same);
4. once the task's command has ended, the agent confirms on ``log`` with an ``Announce``
   tagged ``cancelled`` in the task's context (naming its parent and the sub-tasks it
   cancelled).

It also puts the agent's task ledger in the node's view (section ``tasks``), which
``porter-mesh tasks`` asks for over the mesh.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Final

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.lifecycle import CANCELLED_TAG, PARENT_FIELD
from porter_mesh.core.tasks import cancel_activity
from porter_mesh.errors import PorterError
from porter_mesh.node.node import Message, Node
from porter_mesh.node.sync import SyncNode
from porter_mesh.tools.toolbox import CancelOutcome, Toolbox

__all__ = ["CASCADE_TIMEOUT", "LEDGER_FILE", "carry_out_cancel", "watch_tasks"]

_log = logging.getLogger("porter_mesh.node")

#: The task ledger's file in the agent's data directory.
LEDGER_FILE: Final = "tasks.json"

#: Seconds a cancel sent to a sub-task's holder keeps being retried (a paused holder
#: hears it when it resumes).
CASCADE_TIMEOUT: Final = 600.0

#: Seconds to wait for a cancelled task's command to end before confirming anyway.
STOP_WAIT: Final = 15.0


def watch_tasks(node: SyncNode, toolbox: Toolbox, name: str) -> None:
    """Show ``toolbox`` every delivered message as it arrives (see the module
    docstring), and publish its ledger in the node's view."""

    def on_message(msg: Message) -> None:
        outcome = toolbox.cancel(msg.channel, msg.sender, msg.activity)
        if outcome is not None:
            carry_out_cancel(node, toolbox, outcome)
        elif toolbox.observe(msg.channel, msg.sender, msg.activity):
            print(f"[{name}] task {msg.activity.context} withdrawn by {msg.sender}: "
                  f"{msg.activity.summary}", file=sys.stderr, flush=True)

    def install() -> None:
        node.node.view_sections["tasks"] = toolbox.ledger.view
        node.node.add_handler(on_message)

    node.call_in_loop(install)


def carry_out_cancel(node: SyncNode, toolbox: Toolbox, outcome: CancelOutcome) -> None:
    """Refuse, or cascade and confirm, a cancel (on the node's thread).

    Args:
        node: the agent's node.
        toolbox: the agent's tools (the cascade's cancels go into its ledger).
        outcome: what :meth:`Toolbox.cancel` decided.
    """
    inner = node.node
    me = inner.name
    ctx = outcome.context
    if outcome.refused is not None:
        _log.warning("refused a cancel of %s from %s: %s", ctx, outcome.sender,
                     outcome.refused)
        inner.count_drop("cancel-refused", outcome.sender)
        refusal = as2.reject(me, f"Cancel refused: {outcome.refused}", None, context=ctx,
                             target=outcome.sender)
        _send(inner, outcome.sender, refusal)
        return
    print(f"[{me}] task {ctx} cancelled by {outcome.sender}: {outcome.reason}",
          file=sys.stderr, flush=True)
    for sub in outcome.subtasks:
        if sub.holder is None:
            continue
        cancel = cancel_activity(me, sub.context, f"Cancelled with {ctx}: {outcome.reason}",
                                 cancel=True, parent=ctx)
        toolbox.sent(C.DIRECT_PREFIX + sub.holder, cancel)
        _send(inner, sub.holder, cancel)
    subs = [s.context for s in outcome.subtasks]
    # Confirm once the task's command has ended (its processes are gone), off the loop.
    threading.Thread(target=_confirm, args=(node, toolbox, outcome, subs),
                     name=f"confirm-{ctx}", daemon=True).start()


def _confirm(node: SyncNode, toolbox: Toolbox, outcome: CancelOutcome,
             subs: list[str]) -> None:
    ctx = outcome.context
    stopped = toolbox.wait_stopped(ctx, STOP_WAIT)
    extra: dict[str, object] = {"subtasks": subs}
    if outcome.parent is not None:
        extra[PARENT_FIELD] = outcome.parent
    what = "stopped" if stopped else f"its command did not end within {STOP_WAIT:g}s"
    sub_text = f"; cancelled sub-task(s) {', '.join(subs)}" if subs else ""
    confirmation = as2.announce(node.name, f"Cancelled {ctx}: {what}{sub_text}",
                                outcome.reason, context=ctx, tag=[CANCELLED_TAG],
                                extra=extra)
    try:
        node.publish(C.CHANNEL_LOG, confirmation)
    except PorterError as exc:
        _log.warning("could not confirm the cancel of %s: %s", ctx, exc)


def _send(inner: Node, recipient: str, activity: as2.Activity) -> None:
    def done(fut: asyncio.Future[None]) -> None:
        error = None if fut.cancelled() else fut.exception()
        if error is not None:
            _log.warning("%s of %s to %s not delivered: %s", activity.type,
                         activity.context, recipient, error)

    try:
        inner.async_send_nowait(recipient, activity, timeout=CASCADE_TIMEOUT
                                ).add_done_callback(done)
    except PorterError as exc:
        print(f"[{inner.name}] could not tell {recipient} about {activity.context}: {exc}",
              file=sys.stderr, flush=True)
