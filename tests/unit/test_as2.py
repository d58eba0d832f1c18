"""The AS2 compact profile: examples, builders, validation, limits, fallback, batches."""

from __future__ import annotations

import copy
import json
import pathlib
import pickle
import time
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter_mesh.core import as2
from porter_mesh.core.as2 import ACTIVITY_TYPES, OBJECT_TYPES, Activity, ASObject
from porter_mesh.core.constants import MAX_ACTIVITY_BYTES, MAX_BATCH, MAX_JSON_DEPTH
from porter_mesh.core.profile_examples import PROFILE_EXAMPLES, profile_examples
from porter_mesh.errors import ActivityError, ProtocolError
from tests.fuzzing import examples

DATA = pathlib.Path(__file__).resolve().parent.parent / "data" / "profile_examples.json"
CTX = "urn:porter:task:a3f9"


def examples_from_file() -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = orjson.loads(DATA.read_bytes())
    return loaded


def base(**more: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"type": "Announce", "actor": "w1", "summary": "status"}
    data.update(more)
    return data


def error_of(data: Any) -> ActivityError:
    with pytest.raises(ActivityError) as info:
        Activity.from_dict(data)
    return info.value


# ------------------------------------------------------------------ profile examples


def test_data_file_equals_module_in_order() -> None:
    from_file = examples_from_file()
    assert from_file == profile_examples()
    assert list(from_file) == list(PROFILE_EXAMPLES)
    for name, activity in from_file.items():
        assert json.dumps(activity) == json.dumps(PROFILE_EXAMPLES[name])  # key order too


def test_every_profile_example_is_covered() -> None:
    names = set(examples_from_file())
    assert {"Invoke (execution lifecycle)", "Remember (knowledge lifecycle)"} <= names
    assert {"Recall (knowledge lifecycle)", "Fallback"} <= names
    assert len(names) == 16  # 3 lifecycle examples, 12 under "Examples", the fallback


@pytest.mark.parametrize("name", list(PROFILE_EXAMPLES))
def test_example_round_trips_exactly(name: str) -> None:
    original = examples_from_file()[name]
    raw = orjson.dumps(original)
    for activity in (
        Activity.from_dict(original),
        Activity.from_json(raw),
        as2.parse_activity(raw),
        as2.parse_activity(json.dumps(original, indent=2)),
    ):
        as2.validate_activity(original)
        assert activity.to_dict() == original
        assert json.dumps(activity.to_dict()) == json.dumps(original)
        assert json.dumps(orjson.loads(activity.to_json())) == json.dumps(original)
        assert activity.to_json() == raw
        assert activity.is_fallback == (name == "Fallback")


def test_example_fields_read_as_typed_values() -> None:
    offer = Activity.from_dict(PROFILE_EXAMPLES["Admin assigns a task"])
    assert (offer.type, offer.actor, offer.target, offer.context) == (
        "Offer",
        "architect",
        "worker-backend",
        CTX,
    )
    assert offer.tag == ("api", "backend")
    assert isinstance(offer.object, ASObject)
    assert offer.object.type == "Note"
    assert offer.object.content is not None and offer.object.content.startswith("Add a GET")
    assert offer.result is None and offer.instrument is None and offer.content is None
    assert offer.extra == {}
    assert offer.task_id == CTX

    created = Activity.from_dict(PROFILE_EXAMPLES["Worker creates files"])
    assert created.instrument == ("file",)
    assert isinstance(created.object, ASObject)
    items = created.object.items
    assert items is not None and len(items) == 2
    first = items[0]
    assert isinstance(first, ASObject)
    assert (first.type, first.url, first.summary) == (
        "Document",
        "src/routes/users.ts",
        "Route handler",
    )

    recall = Activity.from_dict(PROFILE_EXAMPLES["Recall (knowledge lifecycle)"])
    assert recall.bindings == (
        {"about": "urn:porter:file:server.ts", "finding": "depends on express module"},
    )
    assert recall.result is not None
    rows = recall.result.items
    assert rows is not None
    row = rows[0]
    assert isinstance(row, ASObject) and row.is_record and row.type == ""
    assert row.about is None and row.extra["finding"] == "depends on express module"
    assert row.to_dict() == {
        "about": "urn:porter:file:server.ts",
        "finding": "depends on express module",
    }
    assert offer.bindings is None


def test_headline_and_repr() -> None:
    offer = Activity.from_dict(PROFILE_EXAMPLES["Admin assigns a task"])
    assert offer.headline() == (
        "Offer architect -> worker-backend [urn:porter:task:a3f9] Add GET /users endpoint"
    )
    assert repr(offer) == f"<Activity {offer.headline()}>"
    accepted = Activity.from_dict(PROFILE_EXAMPLES["Worker accepts"])
    assert (
        accepted.headline()
        == "Accept worker-backend [urn:porter:task:a3f9] Starting work on GET /users"
    )
    assert as2.fallback_note("hi\nthere").headline() == "Note (fallback) hi there"
    assert len(repr(as2.note("a", "s" * 500, "c"))) < 120
    assert repr(as2.document("a.py")) == "ASObject(Document 'a.py')"


# -------------------------------------------------------------------------- builders


def test_builders_reproduce_the_profile_examples() -> None:
    ex = examples_from_file()
    users, model = "src/routes/users.ts", "src/models/user.ts"
    sparql_all = ex["Recall (knowledge lifecycle)"]["object"]["content"]
    built = {
        "Invoke (execution lifecycle)": as2.invoke(
            "worker-1",
            "Running test suite",
            "deno test --allow-all",
            "14 tests passed, 0 failures",
            context=CTX,
        ),
        "Remember (knowledge lifecycle)": as2.remember(
            "worker-1",
            "Recording dependency relationship",
            "urn:porter:file:server.ts",
            "depends on express module for HTTP routing",
        ),
        "Recall (knowledge lifecycle)": as2.recall(
            "architect",
            "Checking known dependencies",
            sparql_all,
            result_items=[
                {"about": "urn:porter:file:server.ts", "finding": "depends on express module"}
            ],
        ),
        "Admin assigns a task": as2.offer(
            "architect",
            "Add GET /users endpoint",
            ex["Admin assigns a task"]["object"]["content"],
            target="worker-backend",
            context=CTX,
            tag=["api", "backend"],
        ),
        "Worker accepts": as2.accept("worker-backend", "Starting work on GET /users", context=CTX),
        "Worker invokes a command": as2.invoke(
            "worker-backend",
            "Running database migration",
            "deno task db:migrate",
            "Migration complete: added users table",
            context=CTX,
        ),
        "Worker creates files": as2.create(
            "worker-backend",
            "Added /users route and handler",
            as2.collection(
                [as2.document(users, "Route handler"), as2.document(model, "User type definition")]
            ),
            context=CTX,
            instrument=("file",),
        ),
        "Worker stores knowledge": as2.remember(
            "worker-backend",
            "Recording API design decision",
            "api-design",
            "GET /users returns paginated JSON with {data, page, limit, total} envelope",
            context=CTX,
        ),
        "Admin queries knowledge": as2.recall(
            "architect",
            "Checking API decisions",
            ex["Admin queries knowledge"]["object"]["content"],
        ),
        "Worker requests review": as2.offer(
            "worker-backend",
            "Ready for review: GET /users endpoint",
            context=CTX,
            object=as2.collection([as2.document(users), as2.document(model)]),
            target="reviewer",
        ),
        "Reviewer gives feedback": as2.reject(
            "reviewer",
            "Missing input validation on pagination params",
            ex["Reviewer gives feedback"]["object"]["content"],
            context=CTX,
            tag=("validation", "testing"),
        ),
        "Worker updates after feedback": as2.update(
            "worker-backend",
            "Added pagination validation and tests",
            as2.collection(
                [
                    as2.document(users, "Added validation"),
                    as2.document("tests/users.test.ts", "Pagination edge cases"),
                ]
            ),
            context=CTX,
        ),
        "Reviewer approves": as2.accept(
            "reviewer", "LGTM -- validation and tests look good", context=CTX
        ),
        "Agent asks a question": as2.question(
            "worker-frontend",
            "Which auth library should I use?",
            ex["Agent asks a question"]["object"]["content"],
            target="architect",
            context="urn:porter:task:b7c2",
        ),
        "Status announcement": as2.announce(
            "worker-backend",
            "All tests passing",
            "14 tests passing, 0 failures. Coverage: 87%.",
            context=CTX,
        ),
        "Fallback": as2.fallback_note("<the raw message text>"),
    }
    assert list(built) == list(ex)
    for name, activity in built.items():
        assert activity == Activity.from_dict(ex[name]), name
        assert activity.to_json() == orjson.dumps(ex[name]), name  # key order as printed


def test_other_builders() -> None:
    comment = as2.note("reviewer", "nit", "rename x", context=CTX, target="w1", tag=["style"])
    assert comment.to_dict() == {
        "type": "Note",
        "actor": "reviewer",
        "summary": "nit",
        "content": "rename x",
        "context": CTX,
        "target": "w1",
        "tag": ["style"],
    }
    assert comment.content == "rename x" and not comment.is_fallback
    gone = as2.delete("w1", "remove", as2.document("old.py"), context=CTX)
    assert gone.object == as2.document("old.py")
    assert as2.delete("w1", "remove", "old.py").object == "old.py"
    finding = as2.remember("w1", "s", "urn:porter:file:a.py", "slow", severity="high")
    assert isinstance(finding.object, ASObject)
    assert finding.object.extra == {"severity": "high"}
    assert list(finding.to_dict()["object"]) == ["type", "about", "content", "severity"]
    quiet = as2.invoke("w1", "ran", "true", None, instrument="bash")
    assert quiet.result is None and quiet.instrument == "bash"
    article = ASObject("Article", name="Design", content="text", extra={"lang": "en"})
    assert article.to_dict() == {
        "type": "Article",
        "name": "Design",
        "content": "text",
        "lang": "en",
    }
    assert as2.note_object("x", about="y").to_dict() == {
        "type": "Note",
        "about": "y",
        "content": "x",
    }
    with pytest.raises(ActivityError, match="not both"):
        as2.offer("a", "s", "text", object=as2.document("x"))
    with pytest.raises(ActivityError, match="own") as info:
        as2.offer("a", "s", extra={"summary": "again"})
    assert info.value.reason == "bad-field"
    with pytest.raises(ActivityError) as info:
        as2.document(5)  # type: ignore[arg-type]
    assert info.value.field == "url"
    with pytest.raises(ActivityError) as info:
        as2.collection([as2.document("a"), 7])  # type: ignore[list-item]
    assert info.value.field == "items[1]"


# ------------------------------------------------------------------------ validation

BAD_CASES: list[tuple[str, Any, str | None, str, str]] = [
    ("no type", {"actor": "a", "summary": "s"}, "type", "missing-field", "missing"),
    ("bad type", base(type="Like"), "type", "bad-value", '"Like"'),
    ("object type at top", base(type="Document"), "type", "bad-value", "Offer"),
    ("type not str", base(type=["Offer"]), "type", "bad-value", "an array"),
    ("type object", base(type={"a": 1}), "type", "bad-value", "an object"),
    ("no actor", {"type": "Offer", "summary": "s"}, "actor", "missing-field", "agent"),
    ("empty actor", base(actor=""), "actor", "bad-type", "empty string"),
    ("actor number", base(actor=3), "actor", "bad-type", "a number"),
    ("no summary", {"type": "Offer", "actor": "a"}, "summary", "missing-field", "missing"),
    ("summary null", base(summary=None), "summary", "bad-type", "null"),
    (
        "note missing actor",
        {"type": "Note", "content": "x", "tag": []},
        "actor",
        "missing-field",
        "fallback",
    ),
    ("fallback not Note", {"type": "Offer", "content": "x"}, "actor", "missing-field", "missing"),
    (
        "fallback content number",
        {"type": "Note", "content": 1},
        "actor",
        "missing-field",
        "missing",
    ),
    ("target object", base(target={"type": "Note"}), "target", "bad-type", "an object"),
    ("target null", base(target=None), "target", "bad-type", "omit"),
    ("result string", base(result="done"), "result", "bad-type", "the string \"done\""),
    ("result no type", base(result={"content": "x"}), "result.type", "missing-field", "Document"),
    ("object number", base(object=5), "object", "bad-type", "or a string"),
    ("object bad type", base(object={"type": "Image"}), "object.type", "bad-value", "Image"),
    (
        "object url number",
        base(object={"type": "Document", "url": 1}),
        "object.url",
        "bad-type",
        "a number",
    ),
    (
        "object null field",
        base(object={"type": "Note", "content": None}),
        "object.content",
        "bad-type",
        "null",
    ),
    (
        "items not array",
        base(object={"type": "Collection", "items": {}}),
        "object.items",
        "bad-type",
        "an array",
    ),
    (
        "item number",
        base(object={"type": "Collection", "items": [{"type": "Document"}, 2]}),
        "object.items[1]",
        "bad-type",
        'expected an object with a "type", or a string, got a number',
    ),
    (
        "deep item url",
        base(
            object={
                "type": "Collection",
                "items": ["a", "b", {"type": "Document", "url": False}],
            }
        ),
        "object.items[2].url",
        "bad-type",
        "a boolean",
    ),
    (
        "untyped item outside Recall",
        base(result={"type": "Collection", "items": [{"about": "x"}]}),
        "result.items[0].type",
        "missing-field",
        "missing",
    ),
    ("instrument number", base(instrument=1), "instrument", "bad-type", "or an array"),
    ("instrument mixed", base(instrument=["bash", 2]), "instrument[1]", "bad-type", "a number"),
    ("tag string", base(tag="api"), "tag", "bad-type", "array of strings"),
    ("tag item", base(tag=["a", None]), "tag[1]", "bad-type", "null"),
    ("context number", base(context=7), "context", "bad-type", "a number"),
    ("context bad task", base(context="urn:porter:task:a b"), "context", "bad-task-id", "short-id"),
    (
        "context empty task",
        base(context="urn:porter:task:"),
        "context",
        "bad-task-id",
        "new_task_id",
    ),
    ("content number", base(content=1.5), "content", "bad-type", "a number"),
    ("not an object", ["type"], None, "not-an-object", "JSON object"),
    # Shapes that look like the hot path's one-expression checks but are not.
    ("actor array", base(actor=["a"]), "actor", "bad-type", "an array"),
    ("actor object", base(actor={"a": 1}), "actor", "bad-type", "an object"),
    ("summary boolean", base(summary=True), "summary", "bad-type", "a boolean"),
    ("object pair array", base(object=[1, 2]), "object", "bad-type", "or a string"),
    (
        "object pair without type",
        base(object={"content": "x", "name": "y"}),
        "object.type",
        "missing-field",
        "missing",
    ),
    (
        "note content number",
        base(object={"type": "Note", "content": 5}),
        "object.content",
        "bad-type",
        "a number",
    ),
    (
        "note type array",
        base(object={"type": ["Note"], "content": "x"}),
        "object.type",
        "bad-value",
        "an array",
    ),
]


@pytest.mark.parametrize(
    ("data", "field", "reason", "text"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_invalid_activities_name_the_field(
    data: Any, field: str | None, reason: str, text: str
) -> None:
    error = error_of(data)
    assert (error.field, error.reason) == (field, reason), str(error)
    assert text in str(error)
    assert error.expected
    if field:
        assert str(error).startswith(f"{field}: expected ")
    assert isinstance(error, ProtocolError)
    # The same document arriving as bytes fails the same way.
    if isinstance(data, dict):
        with pytest.raises(ActivityError) as info:
            as2.parse_activity(orjson.dumps(data))
        assert (info.value.field, info.value.reason) == (field, reason)


GOOD_CASES: list[tuple[str, dict[str, Any]]] = [
    ("minimal", base()),
    ("string object", base(object="src/app.py")),
    ("two-character reference", base(object="ab")),
    ("note with empty content", base(object={"type": "Note", "content": ""})),
    ("two-field document", base(object={"type": "Document", "url": "a.py"})),
    ("instrument string", base(instrument="bash")),
    ("empty lists", base(tag=[], instrument=[])),
    ("thread context", base(context="thread-42")),
    ("task id with dash", base(context="urn:porter:task:A-b_9")),
    ("nested activity", {"type": "Accept", "actor": "w", "summary": "ok", "object": base()}),
    ("string items", base(object={"type": "Collection", "items": ["a.py", "b.py"]})),
    ("empty strings inside", base(object={"type": "Note", "content": "", "name": ""})),
    (
        "recall rows",
        {
            "type": "Recall",
            "actor": "a",
            "summary": "s",
            "result": {"type": "Collection", "items": [{"type": 3, "n": [1, {"x": None}]}, "ref"]},
        },
    ),
    ("unknown fields", base(x=None, y={"z": [1, 2.5, True]}, object={"type": "Note", "k": [None]})),
]


@pytest.mark.parametrize("data", [c[1] for c in GOOD_CASES], ids=[c[0] for c in GOOD_CASES])
def test_valid_activities(data: dict[str, Any]) -> None:
    activity = Activity.from_dict(data)
    assert json.dumps(activity.to_dict()) == json.dumps(data)
    assert as2.parse_activity(orjson.dumps(data)) == activity


def test_unknown_fields_are_kept_verbatim_and_in_order() -> None:
    raw = (
        b'{"zeta":1,"type":"Create","actor":"w","summary":"s","mediaType":"text/x",'
        b'"object":{"type":"Collection","x-note":{"a":[1,2]},"items":[{"type":"Document",'
        b'"url":"a","hash":"ab12"}]},"published":"2024-01-01T00:00:00Z"}'
    )
    activity = as2.parse_activity(raw)
    assert activity.to_json() == raw
    assert list(activity.extra) == ["zeta", "mediaType", "published"]
    assert isinstance(activity.object, ASObject)
    assert activity.object.extra == {"x-note": {"a": [1, 2]}}
    items = activity.object.items
    assert items is not None and isinstance(items[0], ASObject)
    assert items[0].extra == {"hash": "ab12"}
    with pytest.raises(TypeError):
        activity.extra["zeta"] = 2  # type: ignore[index]
    activity.object.extra["x-note"]["a"].append(3)  # a copy: the activity is unchanged
    assert activity.to_json() == raw


# ------------------------------------------------------------------- fallback rules


@pytest.mark.parametrize(
    ("payload", "content"),
    [
        (b"plain text message", "plain text message"),
        (b"", ""),
        (b"   ", "   "),
        (b"{not json", "{not json"),
        (b'{"type": "Offer"', '{"type": "Offer"'),
        (b"caf\xe9 \xff\xfe", "caf\ufffd \ufffd\ufffd"),
        (
            b'{"type":"Note","actor":"a","summary":"\xff"}',
            '{"type":"Note","actor":"a","summary":"\ufffd"}',
        ),
        ("already text \u00e9", "already text \u00e9"),
        ("lone \ud800 surrogate", "lone ? surrogate"),
    ],
)
def test_non_json_becomes_the_fallback_note(payload: bytes | str, content: str) -> None:
    activity = as2.parse_activity(payload)
    assert activity.is_fallback
    assert activity.to_dict() == {"type": "Note", "content": content}
    assert (activity.type, activity.actor, activity.summary) == ("Note", "", "")
    assert activity.content == content
    # The fallback is itself a valid document and survives a second hop unchanged.
    assert as2.parse_activity(activity.to_json()) == activity
    assert Activity.from_json(activity.to_json()) == activity
    assert Activity.fallback(content) == activity


@pytest.mark.parametrize(
    "payload", [b"1", b'"text"', b"[]", b"null", b"true", b'[{"type":"Note"}]']
)
def test_json_that_is_not_an_object_is_an_error_not_a_fallback(payload: bytes) -> None:
    with pytest.raises(ActivityError, match="expected a JSON object") as info:
        as2.parse_activity(payload)
    assert info.value.reason == "not-an-object" and info.value.field is None


def test_from_json_is_strict() -> None:
    with pytest.raises(ActivityError, match="not valid JSON") as info:
        Activity.from_json(b"hello")
    assert info.value.reason == "bad-json"
    with pytest.raises(ActivityError) as info:
        Activity.from_json(b'{"type":"Note","actor":"a","summary":"\xff"}')
    assert info.value.reason == "bad-json"
    assert Activity.from_json('{"type":"Note","actor":"a","summary":"s"}').actor == "a"


def test_fallback_text_must_be_a_string() -> None:
    with pytest.raises(ActivityError) as info:
        Activity.fallback(b"bytes")  # type: ignore[arg-type]
    assert info.value.field == "content"


# ------------------------------------------------------------------------------ limits


def _nested_bytes(levels: int) -> bytes:
    return b'{"type":"Note","actor":"a","summary":"s","x":' + b"[" * levels + b"]" * levels + b"}"


def test_depth_limit_is_exact() -> None:
    # The activity is level 1, so an unknown field may hold MAX_JSON_DEPTH - 1 levels.
    ok = as2.parse_activity(_nested_bytes(MAX_JSON_DEPTH - 1))
    assert ok.extra["x"]
    with pytest.raises(ActivityError, match="nested more than") as info:
        as2.parse_activity(_nested_bytes(MAX_JSON_DEPTH))
    assert (info.value.reason, info.value.field) == ("too-deep", "x")


def test_depth_counts_through_collections() -> None:
    obj: dict[str, Any] = {"type": "Note"}
    levels = 1  # the activity
    while levels + 1 < MAX_JSON_DEPTH:  # each Collection adds an object and an array
        obj = {"type": "Collection", "items": [obj]}
        levels += 2
    Activity.from_dict(base(object=obj))
    deeper = {"type": "Collection", "items": [{"type": "Collection", "items": [obj]}]}
    error = error_of(base(object=deeper))
    assert error.reason == "too-deep"
    assert error.field is not None and error.field.startswith("object.items[0].items[0]")


def test_depth_inside_recall_rows_and_nested_unknown_fields() -> None:
    row: Any = "leaf"
    for _ in range(MAX_JSON_DEPTH):
        row = {"r": row}
    recall = {
        "type": "Recall",
        "actor": "a",
        "summary": "s",
        "result": {"type": "Collection", "items": [row]},
    }
    assert error_of(recall).reason == "too-deep"
    assert error_of(base(object={"type": "Note", "meta": row})).field == "object.meta"


def test_ten_thousand_levels_fail_fast() -> None:
    deep_bytes = b'{"a":' * 10_000 + b"1" + b"}" * 10_000
    deep_dict: dict[str, Any] = {"type": "Note", "actor": "a", "summary": "s"}
    cursor = deep_dict
    for _ in range(10_000):
        cursor["x"] = {}
        cursor = cursor["x"]
    started = time.monotonic()
    for attempt in (
        lambda: as2.parse_activity(deep_bytes),
        lambda: Activity.from_json(deep_bytes),
        lambda: Activity.from_dict(deep_dict),
        lambda: as2.activities_from_json_array(b"[" + deep_bytes + b"]"),
    ):
        with pytest.raises(ActivityError, match="nested more than") as info:
            attempt()
        assert info.value.reason == "too-deep"
    assert time.monotonic() - started < 2.0


def test_five_megabytes_fail_fast() -> None:
    text = "x" * (5 * 1024 * 1024)
    raw = orjson.dumps(base(content=text))
    started = time.monotonic()
    for attempt in (
        lambda: as2.parse_activity(raw),
        lambda: as2.parse_activity(text),
        lambda: Activity.from_json(raw),
        lambda: Activity.from_dict(base(content=text)),
        lambda: as2.note("a", "s", text),
        lambda: as2.fallback_note(text),
    ):
        with pytest.raises(ActivityError, match="over the limit") as info:
            attempt()
        assert info.value.reason == "too-large"
        assert "workspace file" in str(info.value)
    assert time.monotonic() - started < 2.0


def test_size_limit_is_exact() -> None:
    skeleton = orjson.dumps(base(content=""))
    fits = base(content="x" * (MAX_ACTIVITY_BYTES - len(skeleton)))
    assert len(orjson.dumps(fits)) == MAX_ACTIVITY_BYTES
    Activity.from_dict(fits)
    as2.parse_activity(orjson.dumps(fits))
    over = base(content="x" * (MAX_ACTIVITY_BYTES - len(skeleton) + 1))
    assert error_of(over).reason == "too-large"


def test_python_values_that_json_cannot_hold() -> None:
    for value in ({1, 2}, b"bytes", object(), 2**70):
        error = error_of(base(x=value))
        assert error.reason == "bad-type" and "JSON" in str(error)
    assert error_of({1: "x"}).reason == "bad-type"
    assert error_of("not a mapping").reason == "not-an-object"


# --------------------------------------------------------------- value semantics


def test_activity_is_immutable_and_owns_its_data() -> None:
    source = base(object={"type": "Note", "content": "x"}, tag=["a"])
    activity = Activity.from_dict(source)
    source["object"]["content"] = "changed"
    source["tag"].append("b")
    assert activity.to_dict() == base(object={"type": "Note", "content": "x"}, tag=["a"])
    out = activity.to_dict()
    out["object"]["content"] = "mutated"
    assert activity.to_dict()["object"]["content"] == "x"
    for name in ("type", "actor", "object", "extra"):
        with pytest.raises(AttributeError):
            setattr(activity, name, "x")
    with pytest.raises(AttributeError):
        activity.anything = 1  # type: ignore[attr-defined]
    obj = activity.object
    assert isinstance(obj, ASObject)
    with pytest.raises(AttributeError):
        obj.content = "y"  # type: ignore[misc]
    assert copy.copy(activity) is activity and copy.deepcopy(activity) is activity


def test_equality_and_hash_by_content() -> None:
    a = Activity.from_dict({"type": "Offer", "actor": "a", "summary": "s", "context": CTX})
    b = Activity.from_dict({"context": CTX, "summary": "s", "actor": "a", "type": "Offer"})
    c = a.replace(summary="t")
    assert a == b and hash(a) == hash(b) and a != c
    assert len({a, b, c}) == 2
    assert a != a.to_dict()
    x = Activity.from_dict(base(n=1))
    y = Activity.from_dict(base(n=1.0))
    assert x == y and hash(x) == hash(y)
    assert as2.document("a") == ASObject.from_dict({"type": "Document", "url": "a"})
    assert hash(as2.document("a")) == hash(ASObject.from_dict({"url": "a", "type": "Document"}))


def test_pickle_round_trip() -> None:
    for name in PROFILE_EXAMPLES:
        activity = Activity.from_dict(PROFILE_EXAMPLES[name])
        again = pickle.loads(pickle.dumps(activity))
        assert again == activity and again.to_json() == activity.to_json()
    recall = Activity.from_dict(PROFILE_EXAMPLES["Recall (knowledge lifecycle)"])
    assert recall.result is not None and recall.result.items is not None
    row = recall.result.items[0]
    assert pickle.loads(pickle.dumps(row)) == row
    assert pickle.loads(pickle.dumps(as2.document("a"))) == as2.document("a")


def test_replace() -> None:
    offer = Activity.from_dict(PROFILE_EXAMPLES["Admin assigns a task"])
    moved = offer.replace(target="worker-2", tag=None, extra={"attempt": 2})
    assert moved.target == "worker-2" and moved.tag is None and moved.extra == {"attempt": 2}
    assert list(moved.to_dict()) == [
        "type",
        "actor",
        "summary",
        "context",
        "object",
        "target",
        "attempt",
    ]
    assert offer.target == "worker-backend"  # unchanged
    assert moved.replace(extra={"attempt": None}).extra == {}
    renoted = offer.replace(object=as2.note_object("new text"))
    assert isinstance(renoted.object, ASObject) and renoted.object.content == "new text"
    with pytest.raises(ActivityError) as info:
        offer.replace(actor="")
    assert info.value.field == "actor"
    with pytest.raises(ActivityError, match="not a field") as info:
        offer.replace(sumary="typo")
    assert info.value.reason == "bad-field"
    with pytest.raises(ActivityError):
        offer.replace(extra={"type": "Note"})


def test_constructor_orders_fields() -> None:
    activity = Activity(
        "Invoke",
        "w1",
        "ran",
        tag=("x",),
        instrument=["bash"],
        result={"type": "Note", "content": "ok"},
        target="log",
        object="cmd",
        context=CTX,
        content="c",
        extra={"z": 1},
    )
    assert list(activity.to_dict()) == [*as2.ACTIVITY_FIELDS, "z"]
    with pytest.raises(ActivityError):
        Activity("Invoke", "w1", "ran", extra=["not", "a", "mapping"])  # type: ignore[arg-type]


def test_type_sets() -> None:
    assert {
        "Offer",
        "Accept",
        "Reject",
        "Create",
        "Update",
        "Delete",
        "Announce",
        "Question",
        "Invoke",
        "Remember",
        "Recall",
        "Note",
    } == ACTIVITY_TYPES
    assert {"Document", "Collection", "Note", "Article"} == OBJECT_TYPES


# --------------------------------------------------------------------------- batches


def test_batch_round_trip() -> None:
    activities = [Activity.from_dict(d) for d in PROFILE_EXAMPLES.values()]
    raw = as2.activities_to_json_array(activities)
    assert raw == orjson.dumps(list(PROFILE_EXAMPLES.values()))
    decoded = as2.activities_from_json_array(raw)
    assert decoded == activities
    assert [a.to_json() for a in decoded] == [a.to_json() for a in activities]
    assert as2.activities_from_json_array(b"[]") == []


def test_batch_errors() -> None:
    good = orjson.dumps(base())
    bad = orjson.dumps(base(tag=[1]))
    raw = b"[" + b",".join([good, bad, good, b"3"]) + b"]"
    with pytest.raises(ActivityError) as info:
        as2.activities_from_json_array(raw)
    assert info.value.field == "[1].tag[0]" and str(info.value).startswith("batch item 1: ")
    seen: list[tuple[int, str]] = []
    kept = as2.activities_from_json_array(raw, on_error=lambda i, e: seen.append((i, e.reason)))
    assert len(kept) == 2 and seen == [(1, "bad-type"), (3, "not-an-object")]
    for payload, reason in (
        (b"{}", "not-an-object"),
        (b"nope", "bad-json"),
        (b"[" + b",".join([good] * (MAX_BATCH + 1)) + b"]", "too-many"),
    ):
        with pytest.raises(ActivityError) as info:
            as2.activities_from_json_array(payload)
        assert info.value.reason == reason
    with pytest.raises(ActivityError):
        as2.activities_to_json_array([Activity.from_dict(base()), base()])  # type: ignore[list-item]
    with pytest.raises(ActivityError) as info:
        not_activity: Any = as2.note_object("an object, not an activity")
        as2.activities_to_json_array([Activity.from_dict(base()), not_activity])
    assert info.value.field == "[1]"
    with pytest.raises(ActivityError) as info:
        as2.activities_to_json_array([Activity.from_dict(base())] * (MAX_BATCH + 1))
    assert info.value.reason == "too-many"


def test_batch_encoding_with_and_without_cached_json() -> None:
    built = [Activity.from_dict(base(summary=f"s{i}")) for i in range(5)]  # JSON cached
    expected = orjson.dumps([a.to_dict() for a in built])
    assert as2.activities_to_json_array(built) == expected
    decoded = as2.activities_from_json_array(expected)  # no JSON cached yet
    assert as2.activities_to_json_array(decoded) == expected
    mixed = [built[0], decoded[1], built[2], decoded[3], built[4]]
    assert as2.activities_to_json_array(iter(mixed)) == expected  # any iterable


def test_batch_elements_keep_the_single_activity_size_limit() -> None:
    big = orjson.dumps(base(content="x" * (MAX_ACTIVITY_BYTES)))
    raw = b"[" + orjson.dumps(base()) + b"," + big + b"]"
    with pytest.raises(ActivityError) as info:
        as2.activities_from_json_array(raw)
    assert info.value.reason == "too-large" and info.value.field == "[1]"
    half = orjson.dumps(base(content="y" * (MAX_ACTIVITY_BYTES // 2)))
    both = as2.activities_from_json_array(b"[" + half + b"," + half + b"]")
    assert [a.to_json() for a in both] == [half, half]


# ------------------------------------------------------------------ property tests

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
names = st.text(min_size=1, max_size=20)
known_keys = st.sampled_from((*as2.ACTIVITY_FIELDS, "items", "url", "about"))


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(payload: bytes) -> None:
    try:
        activity = as2.parse_activity(payload)
    except ActivityError as exc:
        assert exc.reason and str(exc)
    else:
        assert as2.parse_activity(activity.to_json()) == activity


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(known_keys | st.text(max_size=8), json_values | names, max_size=8),
    st.sampled_from([*sorted(ACTIVITY_TYPES), "Image", ""]),
)
def test_random_dicts_never_crash(data: dict[str, Any], kind: str) -> None:
    for candidate in (
        data,
        {"type": kind, **data},
        {**data, "type": kind, "actor": "a", "summary": "s"},
    ):
        try:
            activity = Activity.from_dict(candidate)
        except ActivityError as exc:
            assert exc.reason and str(exc)
            with pytest.raises(ActivityError):
                as2.parse_activity(orjson.dumps(candidate))
        else:
            assert activity.to_dict() == candidate
            assert as2.parse_activity(orjson.dumps(candidate)) == activity


objects = st.deferred(
    lambda: st.fixed_dictionaries(
        {"type": st.sampled_from(sorted(OBJECT_TYPES))},
        optional={
            "name": st.text(max_size=10),
            "url": st.text(max_size=10),
            "content": st.text(max_size=30),
            "summary": st.text(max_size=10),
            "about": st.text(max_size=10),
            "items": st.lists(objects | st.text(max_size=5), max_size=3),
            "x-extra": json_values,
        },
    )
)
valid_activities = st.fixed_dictionaries(
    {
        "type": st.sampled_from(sorted(ACTIVITY_TYPES)),
        "actor": names,
        "summary": names,
    },
    optional={
        "content": st.text(max_size=30),
        "context": st.just(CTX)
        | st.builds(lambda: as2_task_id())
        | st.text(max_size=10).filter(lambda s: not s.startswith("urn:porter:task:")),
        "object": objects | st.text(max_size=10),
        "target": names,
        "result": objects,
        "instrument": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3),
        "tag": st.lists(st.text(max_size=5), max_size=3),
        "published": json_values,
        "x": json_values,
    },
)


def as2_task_id() -> str:
    from porter_mesh.core.taskid import new_task_id

    return new_task_id()


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(valid_activities, st.randoms(use_true_random=False))
def test_valid_activities_round_trip_exactly(data: dict[str, Any], rnd: Any) -> None:
    keys = list(data)
    rnd.shuffle(keys)
    data = {key: data[key] for key in keys}  # any key order must survive
    raw = orjson.dumps(data)
    for activity in (Activity.from_dict(data), Activity.from_json(raw), as2.parse_activity(raw)):
        assert json.dumps(activity.to_dict()) == json.dumps(data)
        assert activity.to_json() == raw
    [single] = as2.activities_from_json_array(b"[" + raw + b"]")
    assert single.to_json() == raw
