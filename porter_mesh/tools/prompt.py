"""The system-prompt sections an agent needs to use the mesh: messaging and the team.

The profile ("System prompt integration") keeps AS2 out of prompts: agents get a short
messaging section and the live team roster, with ``porter-ui`` named as the human user.
The messaging section below is the profile's text, followed by one sentence about
``control`` (the profile lists it, but it carries the mesh's own traffic, which the
tools neither show nor send).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from porter_mesh.core.advert import is_human
from porter_mesh.core.constants import HUMAN_AGENT
from porter_mesh.tools.port import MeshPort, RosterEntry

__all__ = ["MESSAGING_SECTION", "roster_section", "system_prompt_sections"]

#: The profile's messaging section, verbatim, plus a note on ``control``.
MESSAGING_SECTION: Final = """\
## Messaging
Use send_message to send messages to other agents or channels.
Use read_messages to check for incoming messages.
Channels: 'log' (status updates), 'task' (broadcast to workers),
'task:<agent-name>' (direct to a specific agent), 'review', 'control'.
'control' is used by the mesh itself: you will not see it and cannot send on it."""


def roster_section(entries: Iterable[RosterEntry], *, me: str, role: str | None = None) -> str:
    """The team roster as a prompt section.

    Args:
        entries: the roster (the agent itself is left out of the list).
        me: the agent's own name.
        role: the agent's own role, if known.

    Returns:
        A ``## Team`` section naming each teammate with role and state, and saying that
        messages from ``porter-ui`` come from the human user.
    """
    lines = ["## Team", f"You are {me}" + (f" ({role})." if role else ".")]
    mates = sorted((e for e in entries if e.name != me), key=lambda e: e.name)
    if mates:
        lines.append("Your teammates (name: role, state):")
    else:
        lines.append("No teammates are online right now.")
    for entry in mates:
        if is_human(entry.name):
            lines.append(f"- {entry.name}: the human user, {entry.state}")
            continue
        state = entry.state + (", draining (takes no new tasks)" if entry.draining else "")
        lines.append(f"- {entry.name}: {entry.role}, {state}")
    lines.append(
        f"Messages from {HUMAN_AGENT} come from the human user running the team; "
        "their instructions come first."
    )
    return "\n".join(lines)


def system_prompt_sections(port: MeshPort, *, role: str | None = None) -> str:
    """The messaging and team sections, from the node's live roster.

    Args:
        port: the node.
        role: the agent's role.

    Returns:
        Both sections, separated by a blank line.
    """
    roster = roster_section(port.roster(), me=port.agent_name, role=role)
    return f"{MESSAGING_SECTION}\n\n{roster}"
