"""Agent tool handlers: plain text in and out for the agent, AS2 activities on the wire.

:class:`Toolbox` bundles one agent's tools over a :class:`MeshPort` (the node as the
tools see it) and a :class:`Workspace`; :func:`specs_for`, :func:`to_openai` and
:func:`to_mcp` describe the tools for a model; :func:`run_command` is the runaway-proof
command runner behind ``bash``.
"""

from __future__ import annotations

from porter_mesh.tools.port import InboxItem, MeshPort, QueryResult, RosterEntry
from porter_mesh.tools.prompt import MESSAGING_SECTION, roster_section, system_prompt_sections
from porter_mesh.tools.schemas import (
    ALL_TOOLS,
    ROLE_TOOLS,
    TOOL_SPECS,
    ToolSpec,
    check_arguments,
    specs_for,
    to_mcp,
    to_openai,
)
from porter_mesh.tools.shell import CommandResult, run_command
from porter_mesh.tools.toolbox import Toolbox
from porter_mesh.tools.workspace import Workspace

__all__ = [
    "ALL_TOOLS",
    "MESSAGING_SECTION",
    "ROLE_TOOLS",
    "TOOL_SPECS",
    "CommandResult",
    "InboxItem",
    "MeshPort",
    "QueryResult",
    "RosterEntry",
    "ToolSpec",
    "Toolbox",
    "Workspace",
    "check_arguments",
    "roster_section",
    "run_command",
    "specs_for",
    "system_prompt_sections",
    "to_mcp",
    "to_openai",
]
