"""Agent tool handlers: plain text in and out for the agent, AS2 activities on the wire.

:class:`Toolbox` bundles one agent's tools over a :class:`MeshPort` (the node as the
tools see it) and a :class:`Workspace`; :func:`specs_for`, :func:`to_openai` (also in
OpenAI's strict form) and :func:`to_mcp` describe the tools for a model;
:func:`run_command` is the runaway-proof command runner behind ``bash`` and ``git``;
:class:`ExternalTools` adds the tools of external MCP servers to a toolbox.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The names below load with the module that defines them, on first use: a node imports
# this package for its small data types (port.py) and must not pay, in every process of
# a mesh, for the toolbox, its tracing and the external servers' client.
if TYPE_CHECKING:
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

_SOURCES = {
    "ExternalServer": "external", "ExternalTools": "external", "external_server": "external",
    "InboxItem": "port", "MeshPort": "port", "QueryResult": "port", "RosterEntry": "port",
    "MESSAGING_SECTION": "prompt", "roster_section": "prompt",
    "system_prompt_sections": "prompt",
    "ALL_TOOLS": "schemas", "ROLE_TOOLS": "schemas", "TOOL_SPECS": "schemas",
    "ToolSpec": "schemas", "check_arguments": "schemas", "specs_for": "schemas",
    "strict_schema": "schemas", "to_mcp": "schemas", "to_openai": "schemas",
    "CommandResult": "shell", "run_command": "shell",
    "Toolbox": "toolbox",
    "Workspace": "workspace",
}


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:  # also how `from porter_mesh.tools import <submodule>` finds one
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{source}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})


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
