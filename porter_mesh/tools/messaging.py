"""Plain text to AS2 and back: the mapping behind ``send_message`` and ``read_messages``.

Agents write and read plain text; the wire carries AS2 activities (profile, "Tool-to-AS2
Mapping" and "Channel mapping"). This module holds the two pure halves of that mapping.

Outgoing (:func:`compose`)
    The first line of the text is the ``summary``; the remaining lines become the
    details (``object`` Note ``content``, or a top-level ``content`` for a Note). A
    first line longer than :data:`SUMMARY_LIMIT` is cut for the summary and the whole
    text kept as the details. The activity type is the one the agent chose, or else
    follows the channel and the agent's role (:func:`default_type`):

    ==================  ===========================================  ==================
    channel             architect / human / unknown role             worker / reviewer
    ==================  ===========================================  ==================
    ``task:<agent>``    Offer (direct assignment)                    Announce (status)
    ``task``            Offer                                        Announce
    ``review``          Offer (review request)                       reviewer: Note;
                                                                     worker: Offer
    ``log``             Announce                                     Announce
    ==================  ===========================================  ==================

    and text ending in ``?`` is a Question wherever the type is not given. A direct
    channel sets ``target`` to the recipient. ``control`` is refused: it carries the
    mesh's own messages, not the agent's.

Incoming (:func:`render_inbox`)
    One line per message, ``[channel] actor: summary -- details (Type; task <id>)``,
    where the details are the object's text (a command and its output for Invoke, file
    paths for Create/Update, the finding for Remember...), cut to
    :data:`DETAIL_LIMIT` characters with line breaks shown as `` | ``. Details whose
    first line is the summary (a sender that keeps the whole text there, as
    ``porter-mesh send`` does) lose that line, so each line is read once. Messages from
    ``porter-ui`` are marked as the human's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from porter_mesh.core import as2
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity, ASObject
from porter_mesh.core.constants import (
    CHANNEL_CONTROL,
    CHANNEL_LOG,
    CHANNEL_REVIEW,
    CHANNEL_TASK,
    DIRECT_PREFIX,
    TASK_URN_PREFIX,
)
from porter_mesh.core.lifecycle import PARENT_FIELD
from porter_mesh.core.taskid import is_task_id
from porter_mesh.core.tasks import ATTEMPT_FIELD, is_task_delete
from porter_mesh.errors import ActivityError, ToolError
from porter_mesh.tools.port import InboxItem

__all__ = [
    "DETAIL_LIMIT",
    "SUMMARY_LIMIT",
    "check_channel",
    "compose",
    "default_type",
    "describe",
    "normalise_context",
    "render_inbox",
    "render_item",
    "split_text",
]

#: Longest summary (characters) taken from the first line of a message.
SUMMARY_LIMIT: Final = 160

#: Longest details shown per message by ``read_messages`` (characters).
DETAIL_LIMIT: Final = 1200

_HUMAN_MARK: Final = " (the human user)"
_SHORT_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BREAKS: Final = re.compile(r"\s*\n\s*")


def check_channel(channel: str, me: str) -> str:
    """Check a channel name an agent gave.

    Args:
        channel: ``log``, ``task``, ``review`` or ``task:<agent>``.
        me: the agent's own name (its own inbox is not a destination).

    Returns:
        The channel, stripped of surrounding spaces.

    Raises:
        ToolError: ``control``, an unknown channel, or a malformed direct channel.
    """
    name = channel.strip()
    if name == CHANNEL_CONTROL:
        raise ToolError(
            "the 'control' channel is reserved for the mesh itself; use 'log', 'task', "
            "'review' or 'task:<agent-name>'"
        )
    if name in (CHANNEL_LOG, CHANNEL_TASK, CHANNEL_REVIEW):
        return name
    if name.startswith(DIRECT_PREFIX):
        agent = name[len(DIRECT_PREFIX) :].strip()
        if not agent or any(c.isspace() for c in agent):
            raise ToolError(
                f"channel {channel!r}: a direct channel is 'task:<agent-name>' with a "
                "teammate's name from the roster"
            )
        if agent == me:
            raise ToolError(f"{name} is your own inbox; send to a teammate or a shared channel")
        return DIRECT_PREFIX + agent
    raise ToolError(
        f"unknown channel {channel!r}; use 'log' (status), 'task' (all workers), "
        "'review', or 'task:<agent-name>' (one agent)"
    )


def normalise_context(context: str) -> str:
    """Accept a task URN, a bare short id (``a3f9``) or another thread reference.

    Args:
        context: what the agent gave.

    Returns:
        A task URN for task ids and bare short ids; other references unchanged.

    Raises:
        ToolError: the text looks like a task URN but is malformed.
    """
    value = context.strip()
    if value.startswith(TASK_URN_PREFIX):
        if not is_task_id(value):
            raise ToolError(
                f"context {context!r} is not a valid task id; use urn:porter:task:<id> "
                "with 1-64 letters, digits, '-' or '_'"
            )
        return value
    if _SHORT_ID.fullmatch(value):
        return TASK_URN_PREFIX + value
    if not value:
        raise ToolError("context is empty; leave it out or give a task id")
    return value


def split_text(text: str) -> tuple[str, str | None]:
    """Split a message into a one-line summary and optional details.

    Args:
        text: the agent's message.

    Returns:
        ``(summary, details)``; ``details`` is ``None`` when the summary says it all.

    Raises:
        ToolError: the text is blank.
    """
    stripped = text.strip()
    if not stripped:
        raise ToolError("the message is empty; write at least a one-line summary")
    head, _, rest = stripped.partition("\n")
    head = head.strip()
    rest = rest.strip()
    if len(head) > SUMMARY_LIMIT:
        return head[: SUMMARY_LIMIT - 3].rstrip() + "...", stripped
    return head, rest or None


def default_type(channel: str, role: str | None, text: str) -> str:
    """The activity type for a message whose type the agent did not give.

    Args:
        channel: the checked channel.
        role: the sender's role, if known.
        text: the message.

    Returns:
        An activity type (see the table in the module docstring).
    """
    if text.rstrip().endswith("?"):
        return "Question"
    if channel == CHANNEL_LOG:
        return "Announce"
    if channel == CHANNEL_REVIEW:
        return "Note" if role == "reviewer" else "Offer"
    if role in ("worker", "reviewer"):
        return "Announce"
    return "Offer"


#: Builders whose third argument is the details text (``content`` or ``reason``).
_TEXT_BUILDERS: Final[Mapping[str, Callable[..., Activity]]] = {
    "Offer": as2.offer,
    "Question": as2.question,
    "Announce": as2.announce,
    "Reject": as2.reject,
}


def compose(
    *,
    actor: str,
    channel: str,
    text: str,
    kind: str,
    context: str | None = None,
    tag: Sequence[str] | None = None,
    attempt: int | None = None,
    parent: str | None = None,
) -> Activity:
    """Build the activity for a message.

    Args:
        actor: the sending agent.
        channel: the checked channel (see :func:`check_channel`).
        text: the message; first line summary, the rest details.
        kind: the activity type (one of the ``send_message`` types).
        context: the task or thread reference.
        tag: labels.
        attempt: the task claim's attempt number, echoed as an extension field.
        parent: for an Offer of a sub-task, the task it is part of (extension field
            ``parent``).

    Returns:
        The activity.

    Raises:
        ToolError: the text is empty or the activity breaks the profile.
    """
    summary, details = split_text(text)
    target = channel[len(DIRECT_PREFIX) :] if channel.startswith(DIRECT_PREFIX) else None
    fields: dict[str, object] = {ATTEMPT_FIELD: attempt} if attempt is not None else {}
    if parent is not None:
        fields[PARENT_FIELD] = parent
    extra = fields or None
    tags = list(tag) if tag else None
    try:
        build = _TEXT_BUILDERS.get(kind)
        if build is not None:
            return build(
                actor, summary, details, target=target, context=context, tag=tags, extra=extra
            )
        if kind == "Accept":
            obj = as2.note_object(details) if details else None
            activity = as2.accept(
                actor, summary, context=context, object=obj, target=target, extra=extra
            )
            return activity.replace(tag=tags) if tags else activity
        if kind == "Note":
            return as2.note(
                actor, summary, details or summary, context=context, target=target, tag=tags,
                extra=extra,
            )
    except ActivityError as exc:
        raise ToolError(f"send_message: the message cannot be sent: {exc}") from exc
    raise ToolError(f"send_message: type {kind!r} is not a message type")


# -- incoming -------------------------------------------------------------------------------


def _flat(text: str, limit: int = DETAIL_LIMIT) -> str:
    flat = _BREAKS.sub(" | ", text.strip())
    if len(flat) > limit:
        return flat[:limit].rstrip() + f" ... [{len(flat) - limit} more characters]"
    return flat


def _object_text(obj: ASObject | str | None) -> str:
    """Words for an object: its content, a file path, or the paths of a collection."""
    if obj is None:
        return ""
    if isinstance(obj, str):
        return obj
    if obj.type == "Document":
        return obj.url or obj.name or ""
    if obj.type == "Collection":
        parts = []
        for item in obj.items or ():
            parts.append(item if isinstance(item, str) else _object_text(item))
        return ", ".join(p for p in parts if p)
    return obj.content or obj.summary or obj.name or ""


def describe(activity: Activity) -> str:
    """The details of an activity in words (without its summary).

    Args:
        activity: any activity.

    Returns:
        Text (possibly empty) for the part after the summary.
    """
    kind = activity.type
    obj = activity.object
    if kind == "Invoke":
        command = _object_text(obj)
        result = activity.result
        output = result.content if result is not None and result.content else ""
        return f"ran: {command}" + (f" => {output}" if output else "")
    if kind == "Remember" and isinstance(obj, ASObject):
        severity = obj.extra.get("severity")
        mark = f" [{severity}]" if isinstance(severity, str) else ""
        return f"about {obj.about or '?'}{mark}: {obj.content or ''}"
    if kind == "Recall":
        rows = activity.bindings
        query = _object_text(obj)
        return f"query: {query}" + (f" => {len(rows)} row(s)" if rows is not None else "")
    if kind in ("Create", "Update", "Delete") and isinstance(obj, ASObject):
        text = _object_text(obj)
        return f"files: {text}" if obj.type in ("Document", "Collection") else text
    parts = [activity.content or "", _object_text(obj)]
    if activity.result is not None:
        parts.append(_object_text(activity.result))
    return " | ".join(p for p in parts if p)


def _sender_label(name: str) -> str:
    return name + _HUMAN_MARK if is_human(name) else name


def _after_summary(details: str, summary: str) -> str:
    """The details without a first line that repeats the summary.

    Senders that keep a message whole (``porter-mesh send``, the dashboard, other
    implementations) put its first line in ``summary`` and the full text in the details;
    a reader should see that line once.
    """
    text = details.strip()
    head = summary.strip()
    if head and text.startswith(head):
        rest = text[len(head):]
        if not rest or rest[0] == "\n":
            return rest.strip()
    return text


def render_item(item: InboxItem) -> str:
    """One inbox message as one line of text.

    Args:
        item: the message.

    Returns:
        ``[channel] actor: summary -- details (Type; task <id>)``.
    """
    activity = item.activity
    if activity.is_fallback:
        return f"[{item.channel}] {_sender_label(item.sender)}: {_flat(activity.content or '')}"
    actor = activity.actor or item.sender
    line = f"[{item.channel}] {_sender_label(actor)}: {_flat(activity.summary, SUMMARY_LIMIT)}"
    details = _after_summary(describe(activity), activity.summary)
    if details:
        line += f" -- {_flat(details)}"
    notes = [activity.type]
    if activity.context:
        short = activity.task_id
        notes.append(f"task {short[len(TASK_URN_PREFIX):]}" if short else activity.context)
    if is_task_delete(activity):
        notes.append("task withdrawn: stop working on it")
    attempt = activity.extra.get(ATTEMPT_FIELD)
    if isinstance(attempt, int) and attempt > 1:
        notes.append(f"attempt {attempt}")
    if activity.tag:
        notes.append("tags " + ", ".join(activity.tag))
    return f"{line} ({'; '.join(notes)})"


def render_inbox(items: Iterable[InboxItem], *, more_waiting: bool = False) -> str:
    """The text ``read_messages`` returns.

    Args:
        items: the drained messages, oldest first.
        more_waiting: the drain stopped at its limit; more messages may be queued.

    Returns:
        One line per message, or ``No new messages.``.
    """
    lines = [render_item(item) for item in items]
    if not lines:
        return "No new messages."
    if more_waiting:
        lines.append(f"[{len(lines)} shown; more are waiting: call read_messages again]")
    return "\n".join(lines)
