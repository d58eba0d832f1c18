"""Tool descriptions as JSON Schema, their export formats, and argument checking.

Each tool is a :class:`ToolSpec`: a name, a description written for a model, and a JSON
Schema (draft 2020-12 subset: ``object``/``string``/``number``/``integer``/``boolean``/
``array``, ``enum``, ``minimum``/``maximum``, ``minLength``, ``items``) of its flat
arguments, plus what the tool does to the world (reads only, destroys, repeats safely,
reaches beyond the workspace). :func:`to_openai` and :func:`to_mcp` write the same specs
in the OpenAI function-calling format and the MCP ``tools/list`` format; the behaviour
becomes MCP's ``annotations`` and, for OpenAI, which has no such field, a sentence in
the description of destructive tools.

``to_openai(specs, strict=True)`` writes the form OpenAI's strict mode (structured
outputs) accepts: ``"strict": true``, every property listed in ``required``, an optional
one made nullable (``"type": ["string", "null"]``, ``null`` added to its ``enum``), and
no length or range keywords, which strict mode (or a local server's grammar) does not
take; :func:`check_arguments` still enforces them and treats ``null`` as "left out", so
the strict and the plain forms call the same handlers. A schema this module did not
write (an external MCP server's) is passed through with ``"strict": false`` unless it
already meets the rules.

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
    "DEFAULT_GIT_LOG",
    "GIT_COMMANDS",
    "MAX_BASH_TIMEOUT",
    "MAX_GIT_LOG",
    "MESSAGE_TYPES",
    "ROLE_TOOLS",
    "SEVERITIES",
    "TOOL_SPECS",
    "ToolSpec",
    "check_arguments",
    "mcp_annotations",
    "specs_for",
    "strict_schema",
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

#: What the ``git`` tool may run.
GIT_COMMANDS: Final = ("status", "diff", "log", "add", "commit")

#: Default and largest number of commits ``git log`` shows.
DEFAULT_GIT_LOG: Final = 20
MAX_GIT_LOG: Final = 200


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool as a model sees it.

    Attributes:
        name: the tool name.
        description: what it does and when to use it, for the model.
        parameters: JSON Schema of its arguments (an ``object`` schema).
        destructive: it can overwrite or delete things, or run arbitrary commands.
        read_only: it changes nothing (records on ``log`` aside).
        idempotent: calling it again with the same arguments changes nothing more.
        open_world: it reaches beyond the agent's workspace and the mesh's own state
            (other agents, any program).
        group: ``messaging``, ``memory``, ``mesh``, ``shell``, ``files``, ``git`` or
            ``external``; the shell, file and git tools need a workspace.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    destructive: bool = False
    read_only: bool = False
    idempotent: bool = False
    open_world: bool = False
    group: str = "messaging"

    @property
    def needs_workspace(self) -> bool:
        """The tool works on the agent's workspace."""
        return self.group in _WORKSPACE_GROUPS


def _schema(properties: Mapping[str, Mapping[str, Any]], required: Sequence[str]) -> Any:
    return {
        "type": "object",
        "properties": {k: dict(v) for k, v in properties.items()},
        "required": list(required),
        "additionalProperties": False,
    }


_STR: Final = "string"
_WORKSPACE_GROUPS: Final = frozenset({"shell", "files", "git"})
_PATH_IN: Final = {
    "type": _STR,
    "description": "Optional directory (or file) inside the workspace; default: its root.",
    "minLength": 1,
}

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
        open_world=True,
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
        # Not read-only: the messages it returns are taken out of the inbox.
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
        idempotent=True,
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
        open_world=True,
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
        idempotent=True,
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
        idempotent=True,
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
    ToolSpec(
        "list_dir",
        "List a directory of your workspace: subdirectories end in '/', files show "
        "their size, symlinks where they point.",
        _schema({"path": _PATH_IN}, ()),
        read_only=True,
        idempotent=True,
        group="files",
    ),
    ToolSpec(
        "glob",
        "Find workspace files whose path matches a glob pattern: '*' within a name, "
        "'**' across directories, '?' one character, '[abc]' a set (e.g. '**/*.py', "
        "'src/*.js'). Paths are relative to the workspace; .git is skipped.",
        _schema(
            {
                "pattern": {
                    "type": _STR,
                    "description": "The glob pattern, relative to 'path'.",
                    "minLength": 1,
                },
                "path": _PATH_IN,
            },
            ("pattern",),
        ),
        read_only=True,
        idempotent=True,
        group="files",
    ),
    ToolSpec(
        "grep",
        "Search the text files of your workspace for a regular expression (Python "
        "syntax). One line per match: path:line: text. Binary files and .git are "
        "skipped.",
        _schema(
            {
                "pattern": {
                    "type": _STR,
                    "description": "The regular expression.",
                    "minLength": 1,
                },
                "path": _PATH_IN,
                "glob": {
                    "type": _STR,
                    "description": "Optional: only files whose name matches, e.g. '*.py'.",
                    "minLength": 1,
                },
                "ignore_case": {
                    "type": "boolean",
                    "description": "Optional: match regardless of case (default false).",
                },
            },
            ("pattern",),
        ),
        read_only=True,
        idempotent=True,
        group="files",
    ),
    ToolSpec(
        "git",
        "Run git in your workspace's repository: 'status', 'diff' (of the working tree, "
        "or of what is staged), 'log' (recent commits), 'add' (stage paths), 'commit' "
        "(what is staged, with a message; you are the author).",
        _schema(
            {
                "command": {
                    "type": _STR,
                    "enum": list(GIT_COMMANDS),
                    "description": "What to run.",
                },
                "paths": {
                    "type": "array",
                    "items": {"type": _STR, "minLength": 1},
                    "description": (
                        "Paths inside the workspace: what to add (required for 'add'), or "
                        "what status, diff and log are limited to."
                    ),
                },
                "message": {
                    "type": _STR,
                    "description": "The commit message (required for 'commit').",
                    "minLength": 1,
                },
                "staged": {
                    "type": "boolean",
                    "description": "For 'diff': show what is staged for the next commit.",
                },
                "limit": {
                    "type": "integer",
                    "description": (
                        f"For 'log': how many commits (default {DEFAULT_GIT_LOG}, at most "
                        f"{MAX_GIT_LOG})."
                    ),
                    "minimum": 1,
                    "maximum": MAX_GIT_LOG,
                },
            },
            ("command",),
        ),
        group="git",
    ),
    ToolSpec(
        "cancel_task",
        "Cancel a task you offered (the task's id, as in the messages): its holder stops "
        "at once, cancels the sub-tasks it delegated, and confirms on 'log'. Only the "
        "agent that offered a task (or the human) may cancel it.",
        _schema(
            {
                "context": {
                    "type": _STR,
                    "description": "The task id: urn:porter:task:<id>, or just <id>.",
                    "minLength": 1,
                },
                "reason": {
                    "type": _STR,
                    "description": "Optional: why, in one line, shown to the holder.",
                },
            },
            ("context",),
        ),
        destructive=True,
        idempotent=True,
        open_world=True,
        group="messaging",
    ),
    ToolSpec(
        "peers",
        "List the agents on the mesh now: name, role, state (alive, or evasive when "
        "silent for a while) and whether they are draining (take no new tasks). "
        "porter-ui is the human user.",
        _schema({}, ()),
        read_only=True,
        idempotent=True,
        group="mesh",
    ),
)

#: Every tool, by name, in a stable order.
TOOL_SPECS: Final[Mapping[str, ToolSpec]] = MappingProxyType({s.name: s for s in _SPECS})

ALL_TOOLS: Final = tuple(TOOL_SPECS)

_MESSAGING: Final = ("send_message", "read_messages", "memory_write", "memory_query",
                     "cancel_task", "peers")
_LOOKING: Final = ("read_file", "list_dir", "glob", "grep")

#: Tools each role gets. The architect plans and delegates; the reviewer reads and runs
#: the tests but does not change files; a worker does everything.
ROLE_TOOLS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "architect": _MESSAGING,
        "worker": ALL_TOOLS,
        "reviewer": (*_MESSAGING, *_LOOKING, "bash"),
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

#: Keywords kept in the strict form. Lengths and ranges are dropped: strict mode refuses
#: ``minLength``, and OpenAI-compatible local servers refuse the range keywords in their
#: grammars; :func:`check_arguments` enforces all of them anyway, and the descriptions
#: say the bounds.
_STRICT_KEYWORDS: Final = frozenset({"type", "description", "enum", "items"})
_DROPPED_IN_STRICT: Final = frozenset({
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
})


def _strict_property(schema: Mapping[str, Any], *, nullable: bool) -> dict[str, Any] | None:
    """One property in strict form, or None when it uses what strict mode cannot take."""
    kind = schema.get("type")
    if not isinstance(kind, str) or kind == "object":
        return None
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED_IN_STRICT:
            continue
        if key not in _STRICT_KEYWORDS:
            return None
        if key == "items":
            item = _strict_property(value, nullable=False)
            if item is None:
                return None
            out[key] = item
        else:
            out[key] = _plain(value)
    if nullable:
        out["type"] = [kind, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def strict_schema(parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The OpenAI strict-mode form of a tool's argument schema.

    Every property is listed in ``required``; those that were optional become nullable
    (a model in strict mode sends ``null`` for "not given", which
    :func:`check_arguments` reads as left out).

    Args:
        parameters: a flat ``object`` schema.

    Returns:
        The strict schema, or ``None`` when the schema uses something strict mode
        cannot express (nested objects, ``anyOf``, open ``additionalProperties``...).
    """
    if parameters.get("type") != "object" or parameters.get("additionalProperties") is not False:
        return None
    if set(parameters) - {"type", "properties", "required", "additionalProperties",
                          "description"}:
        return None
    properties: Mapping[str, Any] = parameters.get("properties", {})
    required = set(parameters.get("required", ()))
    out: dict[str, Any] = {}
    for name, schema in properties.items():
        converted = _strict_property(schema, nullable=name not in required)
        if converted is None:
            return None
        out[name] = converted
    strict: dict[str, Any] = {"type": "object", "properties": out, "required": list(out),
                              "additionalProperties": False}
    if "description" in parameters:
        strict["description"] = parameters["description"]
    return strict


def to_openai(specs: Iterable[ToolSpec], *, strict: bool = False) -> list[dict[str, Any]]:
    """Write specs in the OpenAI function-calling format (the ``tools`` request field).

    Args:
        specs: the tools.
        strict: the strict-mode form (see the module docstring); a tool whose schema
            cannot be written so keeps its plain schema and gets ``"strict": false``.

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``,
        with ``"strict"`` in each function when ``strict`` is asked for.
    """
    out = []
    for spec in specs:
        description = spec.description + (_DESTRUCTIVE_NOTE if spec.destructive else "")
        function: dict[str, Any] = {"name": spec.name, "description": description}
        converted = strict_schema(spec.parameters) if strict else None
        function["parameters"] = converted if converted is not None else _plain(
            spec.parameters)
        if strict:
            function["strict"] = converted is not None
        out.append({"type": "function", "function": function})
    return out


def mcp_annotations(spec: ToolSpec) -> dict[str, bool]:
    """MCP's behaviour hints for a tool (``readOnlyHint``, ``destructiveHint``...)."""
    return {
        "readOnlyHint": spec.read_only,
        "destructiveHint": spec.destructive,
        "idempotentHint": spec.idempotent,
        "openWorldHint": spec.open_world,
    }


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
                "annotations": mcp_annotations(spec),
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
        if "minimum" in schema and value < schema["minimum"]:
            raise ToolError(f"{tool}: argument '{name}' must be at least {schema['minimum']}")
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
