"""Tool descriptions: valid JSON Schema, the OpenAI and MCP exports, argument checking.

``jsonschema`` is not a dependency, so the schemas are checked here against the rules
of the JSON Schema keywords they use (a structural meta-check), and the argument
checker is exercised on valid and hostile calls.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from porter_mesh.cli.main import main
from porter_mesh.errors import ConfigError, ToolError
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

JSON_TYPES = {"object", "string", "number", "integer", "boolean", "array", "null"}
KEYWORDS = {
    "type", "properties", "required", "additionalProperties", "description", "enum",
    "items", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "default", "title",
}
PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def assert_valid_schema(schema: Any, path: str = "$") -> None:
    """Fail unless ``schema`` is a well-formed JSON Schema over the keywords used here."""
    assert isinstance(schema, dict), f"{path}: a schema is an object"
    unknown = set(schema) - KEYWORDS
    assert not unknown, f"{path}: unknown keywords {unknown}"
    types = schema.get("type")
    if types is not None:
        listed = types if isinstance(types, list) else [types]
        assert listed and all(t in JSON_TYPES for t in listed), f"{path}.type: {types}"
    if "description" in schema:
        assert isinstance(schema["description"], str) and schema["description"], path
    if "properties" in schema:
        assert isinstance(schema["properties"], dict), f"{path}.properties"
        for name, sub in schema["properties"].items():
            assert isinstance(name, str)
            assert_valid_schema(sub, f"{path}.properties.{name}")
    if "required" in schema:
        required = schema["required"]
        assert isinstance(required, list), f"{path}.required"
        assert len(set(required)) == len(required), f"{path}.required has duplicates"
        assert all(isinstance(r, str) for r in required)
        assert set(required) <= set(schema.get("properties", {})), f"{path}.required"
    if "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        if not isinstance(extra, bool):
            assert_valid_schema(extra, f"{path}.additionalProperties")
    if "items" in schema:
        assert_valid_schema(schema["items"], f"{path}.items")
    if "enum" in schema:
        enum = schema["enum"]
        assert isinstance(enum, list) and enum, f"{path}.enum"
        assert len({json.dumps(v) for v in enum}) == len(enum), f"{path}.enum duplicates"
        if isinstance(types, str):
            assert all(isinstance(v, PY_TYPES[types]) for v in enum), f"{path}.enum types"
    for key in ("minLength", "maxLength"):
        if key in schema:
            assert isinstance(schema[key], int) and schema[key] >= 0, f"{path}.{key}"
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            value = schema[key]
            assert isinstance(value, int | float) and not isinstance(value, bool)
            assert math.isfinite(value), f"{path}.{key}"


def test_the_meta_check_can_fail() -> None:
    for bad in (
        {"type": "strng"},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
        {"type": "string", "enum": []},
        {"type": "string", "enum": [1]},
        {"type": "object", "propertys": {}},
        {"type": "number", "maximum": "10"},
    ):
        with pytest.raises(AssertionError):
            assert_valid_schema(bad)


@pytest.mark.parametrize("name", ALL_TOOLS)
def test_every_tool_schema_is_valid(name: str) -> None:
    spec = TOOL_SPECS[name]
    assert_valid_schema(dict(spec.parameters))
    assert spec.parameters["type"] == "object"
    assert spec.parameters["additionalProperties"] is False
    assert spec.description


def test_openai_export_is_valid() -> None:
    exported = to_openai(specs_for())
    text = json.dumps(exported)  # plain JSON, nothing Python-specific left
    assert json.loads(text) == exported
    assert [t["function"]["name"] for t in exported] == list(ALL_TOOLS)
    for tool in exported:
        assert set(tool) == {"type", "function"} and tool["type"] == "function"
        fn = tool["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", fn["name"])
        assert_valid_schema(fn["parameters"])
        destructive = TOOL_SPECS[fn["name"]].destructive
        assert ("Destructive:" in fn["description"]) is destructive


def test_mcp_export_is_valid() -> None:
    exported = to_mcp(specs_for())
    assert json.loads(json.dumps(exported)) == exported
    assert set(exported) == {"tools"}
    destructive = set()
    for tool in exported["tools"]:
        assert set(tool) == {"name", "description", "inputSchema", "annotations"}
        assert tool["inputSchema"]["type"] == "object"
        assert_valid_schema(tool["inputSchema"])
        hints = tool["annotations"]
        assert all(isinstance(v, bool) for v in hints.values())
        assert not (hints["readOnlyHint"] and hints["destructiveHint"])
        if hints["destructiveHint"]:
            destructive.add(tool["name"])
    assert destructive == {"bash", "write_file", "edit_file", "cancel_task"}


#: What each tool does to the world, written out independently of the specs.
HINTS = {
    #  name            readOnly destructive idempotent openWorld
    "send_message": (False, False, False, True),
    "read_messages": (False, False, False, False),  # it drains the inbox
    "memory_write": (False, False, False, False),   # each call adds an observation
    "memory_query": (True, False, True, False),
    "bash": (False, True, False, True),
    "read_file": (True, False, True, False),
    "write_file": (False, True, True, False),
    "edit_file": (False, True, False, False),
    "list_dir": (True, False, True, False),
    "glob": (True, False, True, False),
    "grep": (True, False, True, False),
    "git": (False, False, False, False),            # add and commit only add history
    "peers": (True, False, True, False),
    "cancel_task": (False, True, True, True),   # stops another agent's work
}


def test_mcp_annotations_say_what_each_tool_does() -> None:
    assert set(HINTS) == set(ALL_TOOLS)
    for tool in to_mcp(specs_for())["tools"]:
        hints = tool["annotations"]
        got = (hints["readOnlyHint"], hints["destructiveHint"], hints["idempotentHint"],
               hints["openWorldHint"])
        assert got == HINTS[tool["name"]], tool["name"]


def assert_strict(schema: dict[str, Any]) -> None:
    """OpenAI strict mode's rules: every property required, no extra keys, no
    keyword it refuses."""
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == list(schema["properties"])
    for name, prop in schema["properties"].items():
        assert "minLength" not in prop, name
        if "items" in prop:
            assert "minLength" not in prop["items"], name


def test_openai_strict_export() -> None:
    plain = {t["function"]["name"]: t["function"] for t in to_openai(specs_for())}
    for tool in to_openai(specs_for(), strict=True):
        fn = tool["function"]
        assert fn["strict"] is True
        schema = fn["parameters"]
        assert_valid_schema(schema)
        assert_strict(schema)
        original = plain[fn["name"]]["parameters"]
        for name, prop in schema["properties"].items():
            kind = original["properties"][name]["type"]
            if name in original["required"]:
                assert prop["type"] == kind
            else:  # optional: nullable, and null is one of its values
                assert prop["type"] == [kind, "null"], (fn["name"], name)
                if "enum" in prop:
                    assert prop["enum"][-1] is None
    send = next(t for t in to_openai([TOOL_SPECS["send_message"]], strict=True))
    assert send["function"]["parameters"]["required"] == ["channel", "message", "type",
                                                          "context", "tag"]


def test_a_strict_call_reaches_the_same_arguments() -> None:
    # A model in strict mode sends every property, null for those it leaves out.
    strict_call = {"command": "status", "paths": None, "message": None, "staged": None,
                   "limit": None}
    assert check_arguments(TOOL_SPECS["git"], strict_call) == {"command": "status"}


def test_schemas_strict_mode_cannot_take_pass_through_unstrict() -> None:
    nested = ToolSpec("ext__thing", "x", {
        "type": "object", "properties": {"o": {"type": "object", "properties": {}}},
        "required": [], "additionalProperties": False})
    open_ = ToolSpec("ext__open", "x", {"type": "object", "properties": {}})
    assert strict_schema(nested.parameters) is None
    assert strict_schema(open_.parameters) is None
    for tool in to_openai([nested, open_], strict=True):
        assert tool["function"]["strict"] is False
        assert tool["function"]["parameters"] == (nested if "thing" in tool["function"][
            "name"] else open_).parameters


def test_cli_prints_the_strict_export(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "--format", "openai", "--strict"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [t["function"]["name"] for t in printed] == list(ALL_TOOLS)
    assert all(t["function"]["strict"] is True for t in printed)


def test_role_tool_sets() -> None:
    names = {role: [s.name for s in specs_for(role)] for role in ROLE_TOOLS}
    assert names["architect"] == ["send_message", "read_messages", "memory_write",
                                  "memory_query", "cancel_task", "peers"]
    assert names["worker"] == list(ALL_TOOLS)
    for looking in ("bash", "read_file", "list_dir", "glob", "grep", "peers"):
        assert looking in names["reviewer"]
    for changing in ("write_file", "edit_file", "git"):
        assert changing not in names["reviewer"]
    assert [s.name for s in specs_for(tools=["bash"])] == ["bash"]
    with pytest.raises(ConfigError, match="known roles"):
        specs_for("janitor")
    with pytest.raises(ConfigError, match="known tools"):
        specs_for(tools=["rm_rf"])


@pytest.mark.parametrize("fmt", ["openai", "mcp"])
def test_cli_prints_the_export(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "--format", fmt, "--role", "architect"]) == 0
    printed = json.loads(capsys.readouterr().out)
    tools = printed if fmt == "openai" else printed["tools"]
    assert len(tools) == 6


def test_cli_refuses_unknown_role(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tools", "--role", "janitor"])
    assert "invalid choice" in capsys.readouterr().err


# -- argument checking ----------------------------------------------------------------------

BASH = TOOL_SPECS["bash"]
SEND = TOOL_SPECS["send_message"]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({}, "missing required argument.*command"),
        ({"command": "ls", "cwd": "/"}, "unexpected argument 'cwd'.*command \\(required"),
        ({"command": 42}, "'command' must be string, got a number"),
        ({"command": "ls", "timeout": "30"}, "'timeout' must be number, got a string"),
        ({"command": "ls", "timeout": True}, "'timeout' must be number, got a boolean"),
        ({"command": "ls", "timeout": 0}, "greater than 0"),
        ({"command": "ls", "timeout": 10_000}, "at most 600"),
        ({"command": "ls", "timeout": float("nan")}, "must be number"),
        ({"command": ""}, "must not be empty"),
        (["ls"], "arguments must be a JSON object, got an array"),
        ("ls", "arguments must be a JSON object, got a string"),
    ],
)
def test_bad_arguments_say_what_is_wrong(args: Any, match: str) -> None:
    with pytest.raises(ToolError, match=match):
        check_arguments(BASH, args)


def test_enum_and_array_items_are_checked() -> None:
    base = {"channel": "log", "message": "hi"}
    with pytest.raises(ToolError, match="one of 'Offer'"):
        check_arguments(SEND, {**base, "type": "Shout"})
    with pytest.raises(ToolError, match=r"'tag\[1\]' must be string"):
        check_arguments(SEND, {**base, "tag": ["a", 2]})
    assert check_arguments(SEND, {**base, "type": "Note", "tag": ["a"]})["tag"] == ["a"]


def test_null_optional_arguments_are_dropped() -> None:
    assert check_arguments(BASH, {"command": "ls", "timeout": None}) == {"command": "ls"}
    with pytest.raises(ToolError, match="must be string, got null"):
        check_arguments(BASH, {"command": None})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8,
)


@given(st.sampled_from(ALL_TOOLS),
       st.dictionaries(st.sampled_from(["command", "path", "channel", "message", "query",
                                        "timeout", "type", "tag", "x"]), json_values))
def test_any_json_arguments_are_accepted_or_refused_cleanly(name: str,
                                                            args: dict[str, Any]) -> None:
    spec = TOOL_SPECS[name]
    try:
        checked = check_arguments(spec, args)
    except ToolError:
        return
    assert set(checked) <= set(spec.parameters["properties"])
    assert set(spec.parameters["required"]) <= set(checked)
