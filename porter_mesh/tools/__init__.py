"""Agent tool handlers: plain text in and out for the agent, AS2 activities on the wire.

:class:`Toolbox` bundles one agent's tools over a :class:`MeshPort` (the node as the
tools see it) and a :class:`Workspace`; :func:`specs_for`, :func:`to_openai` (also in
OpenAI's strict form) and :func:`to_mcp` describe the tools for a model;
:func:`run_command` is the runaway-proof command runner behind ``bash`` and ``git``;
:class:`ExternalTools` adds the tools of external MCP servers to a toolbox.
"""

from __future__ import annotations

from porter_mesh.tools.external import ExternalServer, ExternalTools, external_server
from porter_mesh.tools.port import InboxItem, MeshPort, QueryResult, RosterEntry
from porter_mesh.tools.prompt import MESSAGING_SECTION, roster_section, system_prompt_sections
from porter_mesh.tools.schemas import (
    ALL_TOOLS,
    ROLE_TOOLS,
    TOOL_SPECS,
    ToolSpec,
    check_arguments,
    specs_for,
    strict_schema,
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
    "ExternalServer",
    "ExternalTools",
    "InboxItem",
    "MeshPort",
    "QueryResult",
    "RosterEntry",
    "ToolSpec",
    "Toolbox",
    "Workspace",
    "check_arguments",
    "external_server",
    "roster_section",
    "run_command",
    "specs_for",
    "strict_schema",
    "system_prompt_sections",
    "to_mcp",
    "to_openai",
]
