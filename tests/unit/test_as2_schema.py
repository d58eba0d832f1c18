"""The C schema in front of the Python validator: never more lenient, and really used.

Bytes the schema accepts skip the Python checks (and an activity built in Python is
decoded from its JSON only when a field is read), so every accepted input must also pass
the Python validator and decode with orjson to the same fields.
"""

from __future__ import annotations

import typing
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter_mesh.core import as2
from porter_mesh.core.as2 import codec, schema
from porter_mesh.core.profile_examples import profile_examples
from porter_mesh.errors import ActivityError
from tests.fuzzing import examples

FUZZ = settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow],
                deadline=None)


def test_schema_types_are_the_profile_types() -> None:
    def literal_values(alias: Any) -> set[str]:
        return set(typing.get_args(alias))

    assert literal_values(schema._ActivityType) == set(as2.ACTIVITY_TYPES)
    assert literal_values(schema._NestedType) == set(as2.ACTIVITY_TYPES | as2.OBJECT_TYPES)
    fields = set(schema._ActivityShape.__struct_fields__)
    assert fields == set(as2.ACTIVITY_FIELDS)
    assert set(schema._ObjectShape.__struct_fields__) == set(as2.OBJECT_FIELDS)


def test_the_profile_examples_take_the_schema_path() -> None:
    examples = profile_examples()
    slow = {name for name, ex in examples.items() if schema._shape_of(orjson.dumps(ex)) is None}
    # Only the binding rows of a Recall result and the plain-text fallback need Python.
    assert slow == {"Recall (knowledge lifecycle)", "Fallback"}
    activity = as2.Activity.from_dict(examples["Status announcement"])
    assert activity._d is None  # validated from its JSON; the dict is not decoded yet
    assert activity.summary == examples["Status announcement"]["summary"]
    assert activity.to_dict() == examples["Status announcement"]


def _python_accepts(raw: bytes) -> dict[str, Any]:
    decoded = orjson.loads(raw)
    as2.activity_from_decoded(decoded)  # raises if the Python rules refuse it
    assert isinstance(decoded, dict)
    return decoded


# -- near-valid activities: the right keys, values of every kind ------------------------

words = st.one_of(st.sampled_from(["a", "worker-1", "ok"]), st.text(min_size=1, max_size=12))
texts = st.one_of(words, st.just(""), st.text(max_size=12))
contexts = st.one_of(words, st.sampled_from([
    "urn:porter:task:a3f9", "urn:porter:task:", "urn:porter:task:bad id",
    "urn:porter:task:" + "x" * 65, "thread-7", "urn:porter:task:ok_1-2\n"]))
activity_types = st.sampled_from(sorted(as2.ACTIVITY_TYPES))
nested_types = st.sampled_from(sorted(as2.ACTIVITY_TYPES | as2.OBJECT_TYPES))
odd = st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False),
                st.booleans(),
                st.just(""), st.sampled_from(["Zap", "note"]),
                st.lists(st.integers(-9, 9), max_size=2),
                st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2))


def mostly(draw: st.DrawFn, good: st.SearchStrategy[Any]) -> Any:
    """A value from ``good`` nine times in ten, else anything odd."""
    return draw(good) if draw(st.integers(0, 9)) else draw(odd)


@st.composite
def objects(draw: st.DrawFn, depth: int = 0) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(words, odd))
    body: dict[str, Any] = {}
    if draw(st.integers(0, 19)):
        body["type"] = mostly(draw, nested_types)
    for key in ("name", "about", "url", "content", "summary"):
        if draw(st.booleans()):
            body[key] = mostly(draw, texts)
    if depth < 3 and draw(st.booleans()):
        body["items"] = mostly(draw, st.lists(st.one_of(words, objects(depth + 1), odd),
                                              max_size=3))
    if draw(st.integers(0, 19)) == 0:
        body[draw(st.sampled_from(["extra", "id", "items"]))] = draw(odd)
    return body


@st.composite
def activities(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, values in (
        ("type", activity_types), ("actor", words), ("summary", words), ("content", texts),
        ("context", contexts), ("object", objects()), ("target", texts),
        ("result", objects()), ("instrument", st.one_of(texts, st.lists(texts, max_size=3))),
        ("tag", st.lists(texts, max_size=3)), ("origin", odd),
    ):
        # The three required fields are nearly always there; the rest now and then.
        often = ("type", "actor", "summary") if key != "object" else ()
        if draw(st.integers(0, 19)) < (19 if key in often else 10 if key == "object" else 5):
            body[key] = mostly(draw, values)
    return body


def _fields(activity: as2.Activity) -> tuple[Any, ...]:
    """What an application reads, the parts a shape can answer without a dict."""
    ref = activity.object
    return (activity.type, activity.actor, activity.summary, activity.content,
            activity.context, activity.target, ref if isinstance(ref, str) else None,
            activity.task_id, activity.is_fallback)


def _same_reads(raw: bytes) -> None:
    """The shape-backed activity of ``raw`` reads as the dict-backed one does."""
    lazy = as2.Activity.from_json(raw)
    assert lazy._s is not None
    assert _fields(lazy) == _fields(as2.activity_from_decoded(orjson.loads(raw)))


@FUZZ
@given(activities())
def test_schema_never_accepts_what_python_refuses(data: dict[str, Any]) -> None:
    raw = orjson.dumps(data)
    if schema._shape_of(raw) is not None:
        assert _python_accepts(raw) == data
        _same_reads(raw)
        activity = as2.Activity.from_json(raw)
        assert activity.to_dict() == data
        assert activity == as2.activity_from_decoded(orjson.loads(raw))
    else:
        # Python has the last word, and the public call agrees with it.
        try:
            as2.activity_from_decoded(orjson.loads(raw))
        except ActivityError:
            with pytest.raises(ActivityError):
                as2.Activity.from_json(raw)
        else:
            assert as2.Activity.from_json(raw).to_dict() == data


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value: dict keys and list positions, nested ones too."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _places(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _places(child, (*path, index))
    return found


@st.composite
def valid_objects(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"type": draw(nested_types)}
    for key in ("name", "about", "url", "content", "summary"):
        if draw(st.booleans()):
            body[key] = draw(texts)
    if depth < 1 and draw(st.booleans()):
        body["items"] = draw(st.lists(st.one_of(words, valid_objects(depth + 1)), max_size=3))
    return body


@st.composite
def valid_activities(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"type": draw(activity_types), "actor": draw(words),
                            "summary": draw(words)}
    for key, values in (
        ("content", texts), ("context", st.sampled_from(["urn:porter:task:a3f9", "t-1"])),
        ("object", st.one_of(words, valid_objects())), ("target", texts),
        ("result", valid_objects()), ("instrument", st.one_of(texts, st.lists(texts))),
        ("tag", st.lists(texts, max_size=3)),
    ):
        if draw(st.booleans()):
            body[key] = draw(values)
    return body


@st.composite
def one_fault(draw: st.DrawFn) -> dict[str, Any]:
    """A valid activity with exactly one value somewhere replaced by an odd one (or a
    field added or removed there): the Python rules usually refuse these."""
    body = draw(valid_activities())
    places = _places(body)
    path = draw(st.sampled_from(places))
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
    if action == "remove" and isinstance(parent, dict):
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["zz", "id", "items", "type"]))] = draw(odd)
    else:
        parent[last] = draw(odd)
    return body


@FUZZ
@given(valid_activities())
def test_valid_activities_of_the_usual_shapes_take_the_schema_path(data: dict[str, Any]) -> None:
    raw = orjson.dumps(data)
    assert schema._shape_of(raw) is not None
    assert _python_accepts(raw) == data


FULL_OBJECT = {"type": "Collection", "name": "n", "about": "ab", "url": "u", "content": "c",
               "summary": "s", "items": ["x", {"type": "Document", "name": "n", "about": "a",
                                               "url": "u", "content": "c", "summary": "s"}]}
FULL = {"type": "Announce", "actor": "a", "summary": "s", "content": "c",
        "context": "urn:porter:task:a3f9", "object": FULL_OBJECT, "target": "t",
        "result": FULL_OBJECT, "instrument": ["bash"], "tag": ["p1"]}
DEEP: Any = []
for _ in range(40):
    DEEP = [DEEP]
ODD_VALUES = [None, 0, 1.5, True, "", "Zap", [], ["x"], [1], {}, {"k": 1}, {"type": "Zap"},
              "urn:porter:task:not valid"]


def _faults() -> list[tuple[str, Any]]:
    """Every activity one fault away from FULL (and from two variants of it)."""
    cases: list[tuple[str, Any]] = []
    bases = [FULL, {**FULL, "object": "urn:porter:file:x", "instrument": "bash"}]
    for b, base in enumerate(bases):
        for path in _places(base):
            for action, value in [("=", v) for v in ODD_VALUES] + [("-", None), ("+", None)]:
                body = orjson.loads(orjson.dumps(base))
                parent = body
                for step in path[:-1]:
                    parent = parent[step]
                if action == "-":
                    if not isinstance(parent, dict):
                        continue
                    del parent[path[-1]]
                elif action == "+":
                    if not isinstance(parent, dict):
                        continue
                    parent["zz"] = DEEP  # an unknown field: allowed, but not this deep
                else:
                    parent[path[-1]] = value
                cases.append((f"{b}:{'.'.join(map(str, path))}{action}{value!r}", body))
    return cases


def test_every_single_fault_the_schema_lets_through_python_accepts_too() -> None:
    assert schema._shape_of(orjson.dumps(FULL)) is not None
    cases = _faults()
    assert len(cases) > 500
    let_through = [name for name, body in cases if schema._shape_of(orjson.dumps(body)) is not None]
    wrong = []
    for name, body in cases:
        if schema._shape_of(orjson.dumps(body)) is not None:
            try:
                as2.activity_from_decoded(body)
            except ActivityError as exc:
                wrong.append(f"{name}: {exc}")
    assert not wrong
    assert let_through  # (some faults are harmless: "" as content, a removed optional field)


@settings(FUZZ, max_examples=examples(800))
@given(one_fault())
def test_schema_refuses_what_python_refuses_one_fault_at_a_time(data: dict[str, Any]) -> None:
    raw = orjson.dumps(data)
    if schema._shape_of(raw) is not None:
        assert _python_accepts(raw) == data


@FUZZ
@given(st.lists(activities(), max_size=5))
def test_batch_schema_never_accepts_what_python_refuses(batch: list[dict[str, Any]]) -> None:
    raw = orjson.dumps(batch)
    fast = codec._shaped_many(raw)
    if fast is not None:
        assert [a.to_dict() for a in fast] == batch
        for item in batch:
            _python_accepts(orjson.dumps(item))


SEEDS = [orjson.dumps(example) for example in profile_examples().values()]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["set", "insert", "cut"]))
        if op == "set":
            data[at] = draw(st.sampled_from(b'"\\:,{}[]\x00\x7f\xc3\xa9\xed\xff u0dD8'))
        elif op == "insert":
            data[at:at] = draw(st.sampled_from(
                [b"\\ud800", b"\\udc00", b'"type":"Note",', b'"context":"urn:porter:task:?",',
                 b'"actor":"",', b"\xef\xbb\xbf", b" ", b"\\u0000", b'"x":1,', b"\\"]))
        else:
            del data[at:at + draw(st.integers(1, 8))]
    return bytes(data)


@FUZZ
@given(mutated())
def test_mutated_bytes_pass_the_schema_only_if_python_agrees(raw: bytes) -> None:
    if schema._shape_of(raw) is not None:
        _python_accepts(raw)
        _same_reads(raw)  # escapes and repeated keys read alike from either decoder
    batch = b"[" + raw + b"]"
    if codec._shaped_many(batch) is not None:
        _python_accepts(raw)


def test_a_repeated_key_is_judged_by_the_value_that_is_kept() -> None:
    good = b'"context":"urn:porter:task:a3f9"'
    bad = b'"context":"urn:porter:task:not valid"'
    head = b'{"type":"Note","actor":"a","summary":"s",'
    with pytest.raises(ActivityError) as info:
        as2.Activity.from_json(head + good + b"," + bad + b"}")
    assert info.value.field == "context"
    kept = as2.Activity.from_json(head + bad + b"," + good + b"}")
    assert kept.context == "urn:porter:task:a3f9"
    with pytest.raises(ActivityError):
        as2.activities_from_json_array(b"[" + head + good + b"," + bad + b"}]")


def test_from_dict_keeps_canonical_bytes_and_decodes_on_demand() -> None:
    data = {"type": "Offer", "actor": "architect", "summary": "build it",
            "object": {"type": "Collection", "items": ["a", {"type": "Document", "url": "x"}]},
            "tag": ("p1",)}
    activity = as2.Activity.from_dict(data)
    assert activity._d is None and activity.to_json() == orjson.dumps(data)
    assert activity.tag == ("p1",)  # the tuple went through JSON: an array
    assert activity.object is not None and activity.object.items[1].url == "x"


def test_a_batch_is_decoded_once_when_its_first_activity_is_read() -> None:
    bodies = [{"type": "Announce", "actor": "w", "summary": f"s{i}", "tag": [str(i)]}
              for i in range(3)]
    got = as2.activities_from_json_array(orjson.dumps(bodies))
    holder = got[0]._src
    assert holder is not None and all(a._src is holder and a._d is None for a in got)
    # String fields come from the schema's shapes: nothing is decoded for them.
    assert [(a.type, a.actor, a.summary, a.context) for a in got] == [
        ("Announce", "w", f"s{i}", None) for i in range(3)]
    assert holder.dicts is None and all(a._d is None for a in got)
    assert got[1].tag == ("1",)  # reading a field without a shape decodes the array for all
    assert holder.dicts is not None
    assert got[1]._src is None and got[0]._d is None  # the others take theirs when read
    assert [a.to_dict() for a in got] == bodies
    assert all(a._src is None for a in got)
    slow = [as2.activity_from_decoded(body) for body in orjson.loads(orjson.dumps(bodies))]
    assert got == slow and [hash(a) for a in got] == [hash(a) for a in slow]
    assert [a.to_json() for a in got] == [orjson.dumps(body) for body in bodies]


def test_a_single_activity_from_json_keeps_its_shape_and_reencodes_compactly() -> None:
    # A foreign sender's spacing, escapes and a repeated key: valid, not our output.
    raw = b'{ "type" : "Announce", "actor": "w\\u0031", "summary": "no", "summary": "ok",' \
          b'\n "context": "c", "object": "x", "tag": ["a"] }'
    for decode in (as2.parse_activity, as2.Activity.from_json):
        activity = decode(raw)
        assert activity._d is not None
        assert (activity._s is not None) == (decode == as2.Activity.from_json)
        assert (activity.actor, activity.summary, activity.context, activity.object) == (
            "w1", "ok", "c", "x")
        assert activity.to_json() == orjson.dumps(orjson.loads(raw))  # compact, one "summary"
        assert activity.tag == ("a",) and activity == as2.activity_from_decoded(orjson.loads(raw))
