"""Tool descriptions as JSON Schema, their export formats, and argument checking.

Each tool is a :class:`ToolSpec`: a name, a description written for a model, and a JSON
Schema (draft 2020-12 subset: ``object``/``string``/``number``/``integer``/``boolean``/
``array``, ``enum``, ``minimum``/``maximum``, ``minLength``, ``items``) of its flat
arguments. :func:`to_openai` and :func:`to_mcp` write the same specs in the OpenAI
function-calling format and the MCP ``tools/list`` format; destructive tools are marked
(MCP: ``annotations.destructiveHint``; OpenAI, which has no such field: a sentence in
the description).

A model's tool call is untrusted input. :func:`check_arguments` validates it against
the schema and raises :class:`~porter_mesh.errors.ToolError` with a message the model
can act on (which argument, what was expected, what the arguments are), so that a
malformed call becomes a useful tool result instead of a crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from porter_mesh.errors import ConfigError, ToolError

__all__ = [
    "ALL_TOOLS",
    "DEFAULT_BASH_TIMEOUT",
    "MAX_BASH_TIMEOUT",
    "MESSAGE_TYPES",
    "ROLE_TOOLS",
    "SEVERITIES",
    "TOOL_SPECS",
    "ToolSpec",
    "check_arguments",
    "specs_for",
    "to_mcp",
    "to_openai",
]

#: Default and largest ``timeout`` of the bash tool, in seconds.
DEFAULT_BASH_TIMEOUT: Final = 120
MAX_BASH_TIMEOUT: Final = 600

#: Activity types an agent may choose for ``send_message``.
MESSAGE_TYPES: Final = ("Offer", "Accept", "Reject", "Question", "Announce", "Note")

#: Severity labels for ``memory_write``.
SEVERITIES: Final = ("info", "low", "medium", "high", "critical")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as a model sees it.

    Attributes:
        name: the tool name.
        description: what it does and when to use it, for the model.
        parameters: JSON Schema of its arguments (an ``object`` schema).
        destructive: it can change or delete files or run arbitrary commands.
        read_only: it changes nothing (besides draining the agent's own inbox).
        group: ``messaging``, ``memory``, ``shell`` or ``files``.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    destructive: bool = False
    read_only: bool = False
    group: str = "messaging"


def _schema(properties: Mapping[str, Mapping[str, Any]], required: Sequence[str]) -> Any:
    return {
        "type": "object",
        "properties": {k: dict(v) for k, v in properties.items()},
        "required": list(required),
        "additionalProperties": False,
    }


_STR: Final = "string"

_SPECS: Final = (
    ToolSpec(
        "send_message",
        "Send a plain-text message to other agents. The first line is the summary; "
        "further lines are the details. Channels: 'log' (status updates), 'task' "
        "(broadcast to workers), 'task:<agent-name>' (direct to one agent), 'review' "
        "(review requests and verdicts). Messages about a task carry its context "
        "automatically once you have received or sent one.",
        _schema(
            {
                "channel": {
                    "type": _STR,
                    "description": "'log', 'task', 'review' or 'task:<agent-name>'",
                    "minLength": 1,
                },
                "message": {
                    "type": _STR,
                    "description": "The text: first line a one-line summary, then details.",
                    "minLength": 1,
                },
                "type": {
                    "type": _STR,
                    "enum": list(MESSAGE_TYPES),
                    "description": (
                        "Optional kind of message. Offer: assign a task or ask for a "
                        "review. Accept: take a task or approve a review. Reject: decline "
                        "a task or request changes (say why). Question: ask. Announce: "
                        "status or findings. Note: a review comment. By default it "
                        "follows the channel and your role."
                    ),
                },
                "context": {
                    "type": _STR,
                    "description": (
                        "Optional task id (urn:porter:task:<id>, or just <id>) when the "
                        "message is about another task than the current one."
                    ),
                },
                "tag": {
                    "type": "array",
                    "items": {"type": _STR},
                    "description": "Optional labels: priority, language, framework.",
                },
            },
            ("channel", "message"),
        ),
        group="messaging",
    ),
    ToolSpec(
        "read_messages",
        "Read the messages that arrived since you last looked (they are removed from "
        "your inbox). One line per message: [channel] sender: summary -- details. "
        "Messages from porter-ui come from the human user.",
        _schema(
            {
                "channel": {
                    "type": _STR,
                    "description": "Optional: read only this channel, leave the rest queued.",
                    "minLength": 1,
                }
            },
            (),
        ),
        read_only=True,
        group="messaging",
    ),
    ToolSpec(
        "memory_write",
        "Record a finding in the team's shared knowledge graph, so that every agent "
        "can find it later with memory_query.",
        _schema(
            {
                "about": {
                    "type": _STR,
                    "description": (
                        "What the finding is about: a file (urn:porter:file:<path>), a "
                        "topic (api-design), a component."
                    ),
                    "minLength": 1,
                },
                "finding": {
                    "type": _STR,
                    "description": "The finding itself, one or a few sentences.",
                    "minLength": 1,
                },
                "severity": {
                    "type": _STR,
                    "enum": list(SEVERITIES),
                    "description": "Optional severity, for problems found.",
                },
            },
            ("about", "finding"),
        ),
        group="memory",
    ),
    ToolSpec(
        "memory_query",
        "Search the shared knowledge graph. Give keywords (matched against what "
        "findings are about and say) or a read-only SPARQL SELECT/ASK query; findings "
        "are ?obs <https://porter.chapeaux.io/vocab#about> ?about ; "
        "<https://porter.chapeaux.io/vocab#finding> ?finding.",
        _schema(
            {
                "query": {
                    "type": _STR,
                    "description": "Keywords, or a SPARQL query. ('sparql' is accepted too.)",
                    "minLength": 1,
                }
            },
            ("query",),
        ),
        read_only=True,
        group="memory",
    ),
    ToolSpec(
        "bash",
        "Run a shell command (bash -c) in your workspace and get its output (stdout and "
        "stderr merged; long output keeps its end) and exit status. stdin is closed. "
        "The command and everything it started are stopped at the timeout, and "
        "background processes still running when it ends are stopped too.",
        _schema(
            {
                "command": {
                    "type": _STR,
                    "description": "The shell command line.",
                    "minLength": 1,
                },
                "timeout": {
                    "type": "number",
                    "description": (
                        f"Seconds before the command is stopped (default "
                        f"{DEFAULT_BASH_TIMEOUT}, at most {MAX_BASH_TIMEOUT})."
                    ),
                    "exclusiveMinimum": 0,
                    "maximum": MAX_BASH_TIMEOUT,
                },
            },
            ("command",),
        ),
        destructive=True,
        group="shell",
    ),
    ToolSpec(
        "read_file",
        "Read a text file of your workspace (path relative to the workspace).",
        _schema(
            {"path": {"type": _STR, "description": "Path inside the workspace.", "minLength": 1}},
            ("path",),
        ),
        read_only=True,
        group="files",
    ),
    ToolSpec(
        "write_file",
        "Create a file in your workspace, or replace its whole content. Missing parent "
        "directories are created. The team sees a record of the change.",
        _schema(
            {
                "path": {
                    "type": _STR,
                    "description": "Path inside the workspace.",
                    "minLength": 1,
                },
                "content": {"type": _STR, "description": "The complete file content."},
            },
            ("path", "content"),
        ),
        destructive=True,
        group="files",
    ),
    ToolSpec(
        "edit_file",
        "Replace one exact piece of text in a workspace file. 'old' must occur exactly "
        "once in the file (include surrounding lines to make it unique).",
        _schema(
            {
                "path": {
                    "type": _STR,
                    "description": "Path inside the workspace.",
                    "minLength": 1,
                },
                "old": {
                    "type": _STR,
                    "description": "The exact text to replace.",
                    "minLength": 1,
                },
                "new": {"type": _STR, "description": "The replacement text (may be empty)."},
            },
            ("path", "old", "new"),
        ),
        destructive=True,
        group="files",
    ),
)

#: Every tool, by name, in a stable order.
TOOL_SPECS: Final[Mapping[str, ToolSpec]] = MappingProxyType({s.name: s for s in _SPECS})

ALL_TOOLS: Final = tuple(TOOL_SPECS)

_MESSAGING: Final = ("send_message", "read_messages", "memory_write", "memory_query")

#: Tools each role gets. The architect plans and delegates; the reviewer reads and runs
#: the tests but does not change files; a worker does everything.
ROLE_TOOLS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "architect": _MESSAGING,
        "worker": ALL_TOOLS,
        "reviewer": (*_MESSAGING, "read_file", "bash"),
    }
)


def specs_for(role: str | None = None, tools: Iterable[str] | None = None) -> list[ToolSpec]:
    """The tool specs for a role, or for an explicit list of tool names.

    Args:
        role: ``architect``, ``worker`` or ``reviewer``; ``None`` means every tool.
        tools: tool names; overrides ``role`` when given.

    Returns:
        The specs, in the canonical order.

    Raises:
        ConfigError: an unknown role or tool name.
    """
    if tools is not None:
        names = list(tools)
        unknown = [n for n in names if n not in TOOL_SPECS]
        if unknown:
            raise ConfigError(
                f"unknown tool(s) {', '.join(unknown)}; known tools: {', '.join(ALL_TOOLS)}"
            )
        chosen = set(names)
    elif role is None:
        chosen = set(ALL_TOOLS)
    elif role in ROLE_TOOLS:
        chosen = set(ROLE_TOOLS[role])
    else:
        raise ConfigError(f"unknown role {role!r}; known roles: {', '.join(ROLE_TOOLS)}")
    return [spec for name, spec in TOOL_SPECS.items() if name in chosen]


_DESTRUCTIVE_NOTE: Final = " Destructive: it can change or delete files in the workspace."


def to_openai(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Write specs in the OpenAI function-calling format (the ``tools`` request field).

    Args:
        specs: the tools.

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``.
    """
    out = []
    for spec in specs:
        description = spec.description + (_DESTRUCTIVE_NOTE if spec.destructive else "")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": description,
                    "parameters": _plain(spec.parameters),
                },
            }
        )
    return out


def to_mcp(specs: Iterable[ToolSpec]) -> dict[str, Any]:
    """Write specs as an MCP ``tools/list`` result.

    Args:
        specs: the tools.

    Returns:
        ``{"tools": [{"name", "description", "inputSchema", "annotations"}]}``.
    """
    tools = []
    for spec in specs:
        tools.append(
            {
                "name": spec.name,
                "description": spec.description,
                "inputSchema": _plain(spec.parameters),
                "annotations": {
                    "readOnlyHint": spec.read_only,
                    "destructiveHint": spec.destructive,
                    "idempotentHint": spec.read_only and spec.group != "messaging",
                    "openWorldHint": spec.group == "shell",
                },
            }
        )
    return {"tools": tools}


def _plain(value: Any) -> Any:
    """A deep copy of a schema as plain dicts and lists (for JSON output)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# -- argument checking ------------------------------------------------------------------

_JSON_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


def _type_word(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _check_value(tool: str, name: str, schema: Mapping[str, Any], value: Any) -> None:
    expected = schema.get("type", "string")
    kinds = _JSON_TYPES[expected]
    ok = isinstance(value, kinds) and not (expected != "boolean" and isinstance(value, bool))
    if expected == "number" and isinstance(value, float) and value != value:  # NaN
        ok = False
    if not ok:
        raise ToolError(f"{tool}: argument '{name}' must be {expected}, got {_type_word(value)}")
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(repr(c) for c in schema["enum"])
        raise ToolError(f"{tool}: argument '{name}' must be one of {choices}, got {value!r}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        raise ToolError(f"{tool}: argument '{name}' must not be empty")
    if isinstance(value, int | float):
        if "exclusiveMinimum" in schema and not value > schema["exclusiveMinimum"]:
            raise ToolError(
                f"{tool}: argument '{name}' must be greater than {schema['exclusiveMinimum']}"
            )
        if "maximum" in schema and value > schema["maximum"]:
            raise ToolError(f"{tool}: argument '{name}' must be at most {schema['maximum']}")
    if expected == "array" and "items" in schema:
        for index, item in enumerate(value):
            _check_value(tool, f"{name}[{index}]", schema["items"], item)


def check_arguments(spec: ToolSpec, arguments: object) -> dict[str, Any]:
    """Validate a tool call's arguments against the tool's schema.

    ``null`` for an optional argument counts as leaving it out (models often send it).

    Args:
        spec: the tool.
        arguments: the decoded arguments of the call.

    Returns:
        The arguments as a new dict, without ``null`` optional values.

    Raises:
        ToolError: the arguments are not an object, an argument is missing, unknown,
            or of the wrong type or value.
    """
    params = spec.parameters
    properties: Mapping[str, Any] = params["properties"]
    required: Sequence[str] = params["required"]
    listing = ", ".join(
        f"{k} ({'required' if k in required else 'optional'} {v.get('type', 'string')})"
        for k, v in properties.items()
    )
    if not isinstance(arguments, Mapping):
        raise ToolError(
            f"{spec.name}: arguments must be a JSON object, got {_type_word(arguments)}; "
            f"the arguments are: {listing or 'none'}"
        )
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if key not in properties:
            raise ToolError(
                f"{spec.name}: unexpected argument {key!r}; the arguments are: "
                f"{listing or 'none'}"
            )
        if value is None and key not in required:
            continue
        _check_value(spec.name, key, properties[key], value)
        out[key] = value
    missing = [k for k in required if k not in out]
    if missing:
        raise ToolError(
            f"{spec.name}: missing required argument(s) {', '.join(missing)}; the "
            f"arguments are: {listing}"
        )
    return out
