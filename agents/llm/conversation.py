"""The conversation with the model: its messages, kept under a size, and their shapes.

The conversation is a list of chat-completions messages. The first ones are pinned (the
system prompt, and the goal when there is one); the rest is trimmed oldest first, by
whole exchanges: an assistant message with tool calls goes together with its tool
results, as the API requires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = [
    "Conversation",
    "clip",
    "content_text",
    "normalise_calls",
    "summarise_arguments",
    "trim_conversation",
]


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


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with ``...``."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarise_arguments(arguments: Any) -> str:
    """A tool call's arguments in one short line, for the agent's log."""
    if not isinstance(arguments, Mapping):
        return clip(str(arguments), 60)
    return ", ".join(f"{k}={clip(str(v), 40)}" for k, v in arguments.items())


def content_text(content: Any) -> str:
    """Message content as text (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping)
        )
    return ""


class Conversation:
    """The messages sent to the model, oldest first.

    Args:
        system: the system prompt, the first message (pinned).
    """

    def __init__(self, system: str) -> None:
        self.messages: list[Mapping[str, Any]] = [{"role": "system", "content": system}]
        self.pinned = 1

    def set_system(self, text: str) -> None:
        """Replace the system prompt (rebuilt every turn, so the team shown is current)."""
        self.messages[0] = {"role": "system", "content": text}

    def pin(self, message: Mapping[str, Any]) -> None:
        """Append a message that trimming never drops (the goal)."""
        self.messages.append(message)
        self.pinned = len(self.messages)

    def append(self, message: Mapping[str, Any]) -> None:
        """Append a message (trimming may drop it later)."""
        self.messages.append(message)

    def add_user(self, text: str) -> None:
        """Append a user message."""
        self.append({"role": "user", "content": text})

    def trim(self, max_chars: int) -> None:
        """Drop the oldest exchanges until the conversation fits (:func:`trim_conversation`)."""
        self.messages = trim_conversation(self.messages, max_chars=max_chars,
                                          pinned=self.pinned)


def normalise_calls(raw: Any, step: int) -> list[dict[str, Any]]:
    """The tool calls of an answer as the API expects them back, whatever shape they
    came in; a call without an id gets ``call_<step>_<index>``."""
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
            call_id = f"call_{step}_{index}"
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
