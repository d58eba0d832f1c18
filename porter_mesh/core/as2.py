"""The ActivityStreams 2.0 compact profile: activities, objects and their validator.

Agents speak a compact subset of AS2 (see the profile document): every message is a JSON
object with ``type``, ``actor`` and ``summary``, plus optional fields whose types the
profile's field reference fixes. This module turns bytes or dicts into immutable
:class:`Activity` values, refuses anything the profile does not allow with an
:class:`~porter_mesh.errors.ActivityError` that names the field, and turns activities back
into JSON bytes.

Theory of operation
-------------------
An :class:`Activity` owns one private, already validated JSON dict and nothing else. It
never hands that dict out: :meth:`Activity.to_dict` returns a deep copy, the properties
return strings, tuples or lazily built :class:`ASObject` views, and every "change"
(:meth:`Activity.replace`) builds a new, re-validated value. Because the dict is private
and never mutated, the JSON bytes are cached after the first :meth:`Activity.to_json`,
and activities built in Python (constructor, builders, :meth:`Activity.from_dict`) carry
their bytes from the start. Activities decoded from the wire skip every copy: orjson
produces the dict, one tight sequence of type checks validates it, and the dict becomes
the activity's own.

Decoding is the hot path of every node, so it is kept cheap: validation plus
construction (:func:`_activity`, one function with the common shapes checked in single
expressions) costs about two thirds of a bare ``orjson.loads(orjson.dumps(...))`` of the
same dict (the profile's ``Announce``; ``bench/bench_codec.py`` measures it). Immutability
is therefore that of :class:`fractions.Fraction`: the public fields are read-only
properties and ``__slots__`` refuses new attributes, but there is no ``__setattr__``
override, because one would disable CPython's fast slot stores and cost about 0.12 us
per decoded activity. The private slots are private by convention only; the envelope
codec (:mod:`.envelope`), this module's partner on the hot path, reads and fills
``_json`` directly to save a method call per message.

Validation rules (the profile's field reference, made precise)
--------------------------------------------------------------
- ``type``: one of :data:`ACTIVITY_TYPES` (the profile's activities plus ``Note``, which
  the profile uses for review comments and for its plain-text fallback).
- ``actor``, ``summary``: non-empty strings, required. The only exception is the
  profile's plain-text fallback, a document that is exactly
  ``{"type": "Note", "content": "<text>"}``: it is a valid activity, reported by
  :attr:`Activity.is_fallback`, whose ``actor`` and ``summary`` read as ``""``.
- ``content``: string (the text of a top-level ``Note``). ``context``: string; when it
  starts with ``urn:porter:task:`` it must be a well-formed task id
  (:mod:`porter_mesh.core.taskid`). ``target``: string. ``instrument``: string or array
  of strings. ``tag``: array of strings.
- ``object``: an object or a string (a reference). ``result``: an object.
- A nested object needs a ``type`` from :data:`OBJECT_TYPES` or :data:`ACTIVITY_TYPES`
  (an activity can be the object of another, e.g. an ``Accept`` of an ``Offer``). Nested
  objects are checked by the object rules only: ``name``, ``about``, ``url``,
  ``content`` and ``summary`` must be strings, ``items`` an array; any other field
  (including ``actor`` of a nested activity) is kept as is.
- ``items`` holds objects (each with a ``type``) or strings (references). The one
  exception is the ``result`` of a ``Recall``: its items are SPARQL binding rows, any
  JSON objects (``{"about": ..., "finding": ...}``), kept verbatim and read as records
  (an :class:`ASObject` whose ``type`` is ``""`` and whose fields are all in ``extra``)
  or through :attr:`Activity.bindings`.
- A known field that is present must have its type: ``null`` is refused (omit the field
  instead). Unknown fields, at the top level and inside objects, are kept verbatim and
  written back untouched (IACP's ignore-unknown-fields rule).

Limits
------
Input to :func:`parse_activity` and :meth:`Activity.from_json` is at most
:data:`~porter_mesh.core.constants.MAX_ACTIVITY_BYTES` bytes (checked before parsing;
``reason="too-large"``); activities built in Python are held to the same limit on their
JSON size. JSON nesting is at most :data:`~porter_mesh.core.constants.MAX_JSON_DEPTH`
levels, the activity itself being level 1 (``reason="too-deep"``); orjson stops parsing
far deeper documents by itself, and the depth walk here is iterative, so no input can
exhaust the Python stack. A batch (:func:`activities_from_json_array`) is at most
:data:`~porter_mesh.core.constants.MAX_MESSAGE_BYTES` bytes and
:data:`~porter_mesh.core.constants.MAX_BATCH` activities (``reason="too-many"``); its
elements are held to the single-activity byte limit too. Work is linear in the input.

Fallback
--------
:func:`parse_activity` delivers input that is not JSON as the profile's fallback Note,
``{"type": "Note", "content": "<the raw text>"}``. Bytes that are not valid UTF-8 are
not JSON either; they are decoded with ``errors="replace"`` (each bad byte becomes
U+FFFD) and delivered the same way. JSON that is not a valid activity is never a
fallback: it raises :class:`~porter_mesh.errors.ActivityError`.

Errors
------
Every failure is an :class:`~porter_mesh.errors.ActivityError` with ``field`` (a dotted
path such as ``object.items[2].url``, or ``None`` for the whole document), ``expected``
(in words) and ``reason``, one of ``"bad-json"``, ``"not-an-object"``,
``"missing-field"``, ``"bad-type"``, ``"bad-value"``, ``"bad-task-id"``, ``"too-large"``,
``"too-deep"``, ``"too-many"``, ``"bad-field"``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, NoReturn, cast

import msgspec
import orjson

from porter_mesh.core.constants import (
    MAX_ACTIVITY_BYTES,
    MAX_BATCH,
    MAX_JSON_DEPTH,
    MAX_MESSAGE_BYTES,
    TASK_URN_PREFIX,
)
from porter_mesh.core.taskid import is_task_id, parse_task_id
from porter_mesh.errors import ActivityError

__all__ = [
    "ACTIVITY_FIELDS",
    "ACTIVITY_TYPES",
    "OBJECT_FIELDS",
    "OBJECT_TYPES",
    "ASObject",
    "Activity",
    "accept",
    "activities_from_json_array",
    "activities_to_json_array",
    "announce",
    "collection",
    "create",
    "delete",
    "document",
    "fallback_note",
    "invoke",
    "note",
    "note_object",
    "offer",
    "parse_activity",
    "question",
    "recall",
    "reject",
    "remember",
    "update",
    "validate_activity",
]

#: Activity types of the profile, plus ``Note`` (review comments and the fallback).
ACTIVITY_TYPES: Final[frozenset[str]] = frozenset(
    {
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
    }
)

#: Object types of the profile (values of ``object``, ``result`` and collection items).
OBJECT_TYPES: Final[frozenset[str]] = frozenset({"Document", "Collection", "Note", "Article"})

#: Top-level fields the profile defines, in the order builders write them.
ACTIVITY_FIELDS: Final = (
    "type",
    "actor",
    "summary",
    "content",
    "context",
    "object",
    "target",
    "result",
    "instrument",
    "tag",
)

#: Object fields this module checks, in the order builders write them.
OBJECT_FIELDS: Final = ("type", "name", "about", "url", "content", "summary", "items")

_NESTED_TYPES: Final = OBJECT_TYPES | ACTIVITY_TYPES
_ACTIVITY_KNOWN: Final = frozenset(ACTIVITY_FIELDS)
_OBJECT_KNOWN: Final = frozenset(OBJECT_FIELDS)
_OBJECT_STR_FIELDS: Final = ("content", "url", "summary", "about", "name")  # by frequency
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})
_MISSING: Final = cast(Any, object())

_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError

_TYPE_LIST: Final = ", ".join(sorted(ACTIVITY_TYPES))
_OBJECT_TYPE_LIST: Final = ", ".join(sorted(OBJECT_TYPES))
_EXPECT_ACTIVITY_TYPE: Final = f"one of {_TYPE_LIST}"
_EXPECT_OBJECT_TYPE: Final = f"one of {_OBJECT_TYPE_LIST} (or an activity type)"
_EXPECT_ITEM: Final = 'an object with a "type", or a string'
_EXPECT_OBJECT: Final = 'an object with a "type"'
_EXPECT_STR_LIST: Final = "an array of strings"


# --------------------------------------------------------------------------- errors


def _describe(value: Any) -> str:
    """Say in words what a JSON value is, for error messages."""
    if value is _MISSING:
        return "nothing (the field is missing)"
    if value is None:
        return "null"
    if value is True or value is False:
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        if not value:
            return "an empty string"
        shown = value if len(value) <= 40 else value[:37] + "..."
        return "the string " + _dumps(shown).decode()
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a Python {type(value).__name__}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _fail(
    field: str | None, expected: str, got: Any, reason: str = "bad-type", hint: str = ""
) -> NoReturn:
    where = f"{field}: " if field else ""
    message = f"{where}expected {expected}, got {_describe(got)}"
    if hint:
        message += f"; {hint}"
    raise ActivityError(message, field=field, expected=expected, reason=reason)


def _too_deep(field: str | None) -> NoReturn:
    where = f"{field}: " if field else ""
    raise ActivityError(
        f"{where}JSON nested more than {MAX_JSON_DEPTH} levels deep; flatten the data or "
        "move it to a workspace file and send its path",
        field=field,
        expected=f"at most {MAX_JSON_DEPTH} levels of nesting",
        reason="too-deep",
    )


def _too_large(size: int, limit: int, what: str = "activity") -> NoReturn:
    raise ActivityError(
        f"{what} is {size} bytes, over the limit of {limit}; put large content in a "
        "workspace file and send its path",
        expected=f"at most {limit} bytes",
        reason="too-large",
    )


def _bad_json(exc: Exception, what: str = "an activity") -> ActivityError:
    text = str(exc)
    if "depth" in text or "ecursion" in text:
        return ActivityError(
            f"JSON nested more than {MAX_JSON_DEPTH} levels deep ({text}); flatten the data",
            expected=f"at most {MAX_JSON_DEPTH} levels of nesting",
            reason="too-deep",
        )
    return ActivityError(
        f"not valid JSON ({text}); send {what} as one UTF-8 JSON object",
        expected="a JSON object",
        reason="bad-json",
    )


def _not_object(value: Any) -> NoReturn:
    _fail(
        None,
        "a JSON object",
        value,
        reason="not-an-object",
        hint='an activity is an object such as {"type": "Note", "actor": ..., "summary": ...}',
    )


# ----------------------------------------------------------------------- validation


def _check_depth(value: Any, path: str, depth: int) -> None:
    """Check that ``value`` (a container at nesting level ``depth``) stays in bounds.

    Iterative on purpose: the input may come from anyone, and a recursive walk would
    let a deep document spend the interpreter's stack.
    """
    if depth > MAX_JSON_DEPTH:
        _too_deep(path)
    stack = [(value, depth)]
    pop = stack.pop
    push = stack.append
    while stack:
        node, level = pop()
        for child in node.values() if node.__class__ is dict else node:
            if child.__class__ is dict or child.__class__ is list:
                if level >= MAX_JSON_DEPTH:
                    _too_deep(path)
                push((child, level + 1))


def _check_rest(data: dict[str, Any], known: frozenset[str], path: str, depth: int) -> None:
    """Slow path for a dict with fields beyond the known ones, or known ones set to null.

    The known fields were already checked; here ``null`` in a known field is refused and
    every unknown field's value is depth-checked (and otherwise kept as is).
    """
    for key, value in data.items():
        if key in known:
            if value is None:
                _fail(
                    _join(path, key),
                    "a value",
                    None,
                    hint="omit a field instead of setting it to null",
                )
        elif value.__class__ is dict or value.__class__ is list:
            _check_depth(value, _join(path, key), depth + 1)


def _check_str_list(value: Any, path: str, expected: str) -> None:
    if value.__class__ is not list:
        _fail(path, expected, value)
    for index, item in enumerate(value):
        if item.__class__ is not str:
            _fail(f"{path}[{index}]", "a string", item)


def _check_object(obj: Any, path: str, depth: int, records: bool, expected: str) -> None:
    """Validate a nested object at nesting level ``depth``.

    Args:
        obj: the value found at ``path``.
        path: dotted path for error messages (``""`` for a standalone object).
        depth: nesting level of ``obj`` itself.
        records: its ``items`` are binding rows (the ``result`` of a ``Recall``).
        expected: what to say was expected when ``obj`` is not an object.
    """
    if obj.__class__ is not dict:
        _fail(path or None, expected, obj)
    if depth > MAX_JSON_DEPTH:
        _too_deep(path or None)
    get = obj.get
    kind = get("type", _MISSING)
    if kind.__class__ is not str or kind not in _NESTED_TYPES:
        _fail(
            _join(path, "type"),
            _EXPECT_OBJECT_TYPE,
            kind,
            reason="missing-field" if kind is _MISSING else "bad-value",
        )
    # ``left`` counts fields not yet accounted for, so that the common small objects
    # stop after the fields they have instead of probing for every possible one.
    left = len(obj) - 1
    if not left:
        return
    for key in _OBJECT_STR_FIELDS:
        value = get(key)
        if value is not None:
            if value.__class__ is not str:
                _fail(_join(path, key), "a string", value)
            left -= 1
            if not left:
                return
    items = get("items")
    if items is not None:
        left -= 1
        items_path = _join(path, "items")
        if items.__class__ is not list:
            _fail(items_path, f"an array ({_EXPECT_ITEM} in each place)", items)
        if depth + 1 > MAX_JSON_DEPTH:
            _too_deep(items_path)
        for index, item in enumerate(items):
            if item.__class__ is str:
                continue
            if records and item.__class__ is dict:
                _check_depth(item, f"{items_path}[{index}]", depth + 2)
                continue
            _check_object(item, f"{items_path}[{index}]", depth + 2, False, _EXPECT_ITEM)
    if left:
        _check_rest(obj, _OBJECT_KNOWN, path, depth)


def _bad_activity_type(kind: Any) -> NoReturn:
    _fail(
        "type",
        _EXPECT_ACTIVITY_TYPE,
        kind,
        reason="missing-field" if kind is _MISSING else "bad-value",
    )


def _required_string(data: dict[str, Any], key: str) -> NoReturn:
    value = data.get(key, _MISSING)
    hint = ""
    if data.get("type") == "Note":
        hint = 'only the plain-text fallback {"type": "Note", "content": ...} may omit it'
    what = "the sending agent's name" if key == "actor" else "a one-line description"
    _fail(
        key,
        f"a non-empty string ({what})",
        value,
        reason="missing-field" if value is _MISSING else "bad-type",
        hint=hint,
    )


# Contexts already seen to be valid. A mesh works on a handful of tasks at a time, so
# nearly every context is a hit and skips the task-id check; the set only holds short
# strings and is emptied when it reaches its cap, so it stays small whatever arrives.
_GOOD_CONTEXTS: set[str] = set()
_GOOD_CONTEXTS_CAP: Final = 4096


def _check_context(value: Any) -> None:
    if value.__class__ is not str:
        _fail("context", "a string (a task id or a thread reference)", value)
    if value.startswith(TASK_URN_PREFIX) and not is_task_id(value):
        parse_task_id(value)  # raises with the full explanation
    if len(value) <= 100:
        if len(_GOOD_CONTEXTS) >= _GOOD_CONTEXTS_CAP:
            _GOOD_CONTEXTS.clear()
        _GOOD_CONTEXTS.add(value)


def _check_required(data: Any) -> bool:
    """Slow path of :func:`_activity` for a value that failed its one-expression check.

    Raises the precise error for a value that is not an object or lacks a valid
    ``type``, ``actor`` or ``summary``.

    Returns:
        True for the profile's plain-text fallback (which has no actor or summary, and
        nothing else to check); False when the required fields are fine after all.
    """
    if data.__class__ is not dict:
        _not_object(data)
    get = data.get
    kind = get("type", _MISSING)
    try:
        # Only str values can be members; an unhashable value raises TypeError.
        if kind not in ACTIVITY_TYPES:
            _bad_activity_type(kind)
    except TypeError:
        _bad_activity_type(kind)
    actor = get("actor")
    if actor.__class__ is not str or not actor:
        if actor is None and len(data) == 2 and kind == "Note" and get("content").__class__ is str:
            return True
        _required_string(data, "actor")
    summary = get("summary")
    if summary.__class__ is not str or not summary:
        _required_string(data, "summary")
    return False


def _activity(data: Any) -> Activity:
    """Validate a JSON-decoded value as an activity and wrap it, without copying.

    This runs once per received activity, so it is one function: the required fields
    are tested in one expression (anything unusual, including a value that is not an
    object, drops to :func:`_check_required` for the precise error), then the optional
    fields in the order of their frequency. ``left`` counts the fields not yet accounted
    for, so that a small activity skips the lookups of fields it cannot have; the slow
    paths (unknown fields, ``null`` values, errors) are out of line. The dict is not
    modified and becomes the activity's own.

    (``data.get(...)`` is spelled out each time: binding ``get = data.get`` first
    allocates a method object and costs more than the lookups it saves. A loop over a
    whole batch with these checks inline was measured too: it saves a call per element
    of a batch but costs a single activity more than that.)

    Raises:
        ActivityError: the value is not a valid activity.
    """
    try:
        # ``x > ""`` holds exactly for a non-empty string: comparing any other JSON value
        # with a string raises TypeError. One comparison instead of a class test and a
        # truth test, which shows on this path.
        ok = data["type"] in ACTIVITY_TYPES and data["actor"] > "" and data["summary"] > ""
    except (KeyError, TypeError):  # a field missing, not a string, not an object
        ok = False
    if ok or not _check_required(data):  # (True from _check_required: the fallback Note)
        left = len(data) - 3
        if left and (value := data.get("context")) is not None:
            try:
                if value not in _GOOD_CONTEXTS:
                    _check_context(value)
            except TypeError:
                _check_context(value)
            left -= 1
        if left and (value := data.get("object")) is not None:
            try:
                # The most common object, a bare Note, in one expression (``>= ""``:
                # any string, as above).
                note = len(value) == 2 and value["type"] == "Note" and value["content"] >= ""
            except (KeyError, TypeError):
                note = False
            if not note:
                if value.__class__ is dict:
                    _check_object(value, "object", 2, False, _EXPECT_OBJECT)
                elif value.__class__ is not str:
                    _fail("object", f"{_EXPECT_OBJECT}, or a string", value)
            left -= 1
        if left:  # the rarer fields
            if (value := data.get("target")) is not None:
                if value.__class__ is not str:
                    _fail("target", "a string (an agent name or a channel)", value)
                left -= 1
            if left and (value := data.get("result")) is not None:
                _check_object(value, "result", 2, data["type"] == "Recall", _EXPECT_OBJECT)
                left -= 1
            if left and (value := data.get("instrument")) is not None:
                if value.__class__ is not str:
                    _check_str_list(value, "instrument", "a string or an array of strings")
                left -= 1
            if left and (value := data.get("tag")) is not None:
                _check_str_list(value, "tag", _EXPECT_STR_LIST)
                left -= 1
            if left and (value := data.get("content")) is not None:
                if value.__class__ is not str:
                    _fail("content", "a string", value)
                left -= 1
            if left:
                _check_rest(data, _ACTIVITY_KNOWN, "", 1)
    activity = _new(Activity)
    activity._d = data
    activity._json = activity._s = activity._src = None
    return activity


# ------------------------------------------------------------ validation in C
#
# The shapes nearly every activity has, written as msgspec structs so that JSON bytes
# are checked in one C call: the required strings, the profile's optional fields, and
# objects two levels deep (an object whose items may be leaf objects). No unknown fields,
# no nulls, no numbers. Anything this schema refuses, whatever the reason, goes to the
# Python validator above, which accepts a superset and writes the precise error; so the
# schema may only ever be stricter than the rules it shadows (a property test holds it to
# that). Only the task-id rule of ``context`` stays in Python, checked on the decoded
# value (for a repeated key both decoders keep the last).

_ActivityType = Literal[
    "Offer", "Accept", "Reject", "Create", "Update", "Delete",
    "Announce", "Question", "Invoke", "Remember", "Recall", "Note",
]
_NestedType = Literal[
    "Offer", "Accept", "Reject", "Create", "Update", "Delete",
    "Announce", "Question", "Invoke", "Remember", "Recall", "Note",
    "Document", "Collection", "Article",
]
_Text = Annotated[str, msgspec.Meta(min_length=1)]
_Unset = msgspec.UnsetType
_UNSET: Final = msgspec.UNSET


class _LeafShape(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: _NestedType
    name: str | _Unset = _UNSET
    about: str | _Unset = _UNSET
    url: str | _Unset = _UNSET
    content: str | _Unset = _UNSET
    summary: str | _Unset = _UNSET


class _ObjectShape(_LeafShape, forbid_unknown_fields=True, gc=False):
    items: list[str | _LeafShape] | _Unset = _UNSET


class _ActivityShape(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: _ActivityType
    actor: _Text
    summary: _Text
    content: str | _Unset = _UNSET
    context: str | _Unset = _UNSET
    object: str | _ObjectShape | _Unset = _UNSET
    target: str | _Unset = _UNSET
    result: _ObjectShape | _Unset = _UNSET
    instrument: str | list[str] | _Unset = _UNSET
    tag: list[str] | _Unset = _UNSET


_shape_one = msgspec.json.Decoder(_ActivityShape).decode
_shape_many = msgspec.json.Decoder(list[_ActivityShape]).decode
_ShapeRefused = (msgspec.ValidationError, msgspec.DecodeError)


def _shape_of(raw: bytes | bytearray | memoryview) -> _ActivityShape | None:
    """The shape of ``raw`` (one activity's JSON) if it is valid by the C schema and its
    context, else ``None``, which means "ask the Python validator", not "invalid"."""
    try:
        shape = _shape_one(raw)
    except _ShapeRefused:
        return None
    context = shape.context
    if context is _UNSET or context in _GOOD_CONTEXTS or _context_ok(context):
        return shape
    return None


def _context_ok(value: str) -> bool:
    try:
        _check_context(value)
    except ActivityError:
        return False
    return True


class _Batch:
    """The JSON array a batch of activities arrived in, decoded for all of them when
    the first one is read (one orjson call is cheaper than one per element). Members
    point here, never the other way, so nothing forms a reference cycle."""

    __slots__ = ("data", "dicts")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.dicts: list[dict[str, Any]] | None = None

    def item(self, index: int) -> dict[str, Any]:
        # The bytes stay: a reader on another thread may be decoding them right now
        # (both then get equal dicts, and one list is kept).
        dicts = self.dicts
        if dicts is None:
            dicts = self.dicts = _loads(self.data)
        return dicts[index]


def _shaped_many(data: bytes) -> list[Activity] | None:
    """The activities of a batch if every element passes the C schema, else ``None``.

    The caller has checked the batch's total size. A batch over the single-activity
    limit goes to the Python path, which measures each element.
    """
    if len(data) > MAX_ACTIVITY_BYTES:
        return None
    try:
        shapes = _shape_many(data)
    except _ShapeRefused:
        return None
    if len(shapes) > MAX_BATCH:
        return None
    good = _GOOD_CONTEXTS
    for shape in shapes:
        context = shape.context
        if context is not _UNSET and context not in good and not _context_ok(context):
            return None
    batch = _Batch(data)
    out = []
    new = _new
    for index, shape in enumerate(shapes):  # inline wrapping: runs per activity received
        activity = new(Activity)
        activity._d = activity._json = None
        activity._s = shape
        activity._src = batch
        activity._i = index
        out.append(activity)
    return out


# --------------------------------------------------------------- JSON normalisation


def _json_default(value: Any) -> Any:
    """Let orjson write our own values and read-only mappings inside Python input."""
    if isinstance(value, Activity | ASObject):
        return value._data
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"a Python {type(value).__name__} is not a JSON value")


def _encode(data: Mapping[str, Any], limit: int = MAX_ACTIVITY_BYTES) -> bytes:
    """Python input as compact JSON bytes, refused if JSON cannot hold it or it is too big.

    Tuples become arrays and :class:`Activity`/:class:`ASObject` values their JSON.
    """
    try:
        raw = _dumps(data, default=_json_default)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        text = str(exc)
        if "ecursion" in text:
            _too_deep(None)
        raise ActivityError(
            f"not JSON-compatible: {text}; use only dicts with string keys, lists, "
            "strings, numbers, booleans and null",
            expected="JSON-compatible values",
            reason="bad-type",
        ) from None
    if len(raw) > limit:
        _too_large(len(raw), limit)
    return raw


def _normalise(data: Mapping[str, Any], limit: int = MAX_ACTIVITY_BYTES) -> Any:
    """Copy Python input through JSON (see :func:`_encode`): a private, JSON-faithful
    dict."""
    return _loads(_encode(data, limit))


_new = object.__new__


# ------------------------------------------------------------------------ ASObject


class ASObject:
    """An immutable AS2 object: the value of ``object``, ``result`` or a collection item.

    Build one with the constructor or with :func:`document`, :func:`collection` and
    :func:`note_object`; read one from :attr:`Activity.object` / :attr:`Activity.result`.
    Unknown fields are kept in :attr:`extra`. Equality is by content.

    A *record* is an untyped binding row inside a ``Recall`` result: its :attr:`type` is
    ``""``, its other attributes are ``None`` and all its fields are in :attr:`extra`.
    """

    __slots__ = ("_data", "_kind")

    _data: dict[str, Any]
    _kind: int  # _PLAIN, _RECORDS (items are binding rows) or _RECORD (a binding row)

    def __init__(
        self,
        type: str,
        *,
        name: str | None = None,
        about: str | None = None,
        url: str | None = None,
        content: str | None = None,
        summary: str | None = None,
        items: Iterable[ASObject | str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Build and validate an object.

        Args:
            type: one of :data:`OBJECT_TYPES` (or an activity type).
            name: title, for an ``Article``.
            about: what a knowledge ``Note`` is about (a URN or a short label).
            url: workspace-relative path of a ``Document``.
            content: text of a ``Note`` or ``Article``.
            summary: one-line description.
            items: members of a ``Collection``: objects or string references.
            extra: further fields, written after the known ones.

        Raises:
            ActivityError: a value breaks the profile's object rules.
        """
        data: dict[str, Any] = {"type": type}
        for key, value in (
            ("name", name),
            ("about", about),
            ("url", url),
            ("content", content),
            ("summary", summary),
        ):
            if value is not None:
                data[key] = value
        if items is not None:
            data["items"] = list(items) if not isinstance(items, str | Mapping) else items
        _add_extra(data, extra, _OBJECT_KNOWN)
        copy = _normalise(data)
        _check_object(copy, "", 1, False, _EXPECT_OBJECT)
        self._data = copy
        self._kind = _PLAIN

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ASObject:
        """Validate a JSON-compatible mapping as an object and wrap a private copy of it.

        Args:
            data: e.g. ``{"type": "Document", "url": "src/app.py"}``.

        Returns:
            The object.

        Raises:
            ActivityError: ``data`` is not a valid object (``field`` names the place).
        """
        if not isinstance(data, Mapping):
            _fail(None, _EXPECT_OBJECT, data, reason="not-an-object")
        copy = _normalise(data)
        _check_object(copy, "", 1, False, _EXPECT_OBJECT)
        return _object_view(cls, copy, _PLAIN)

    def to_dict(self) -> dict[str, Any]:
        """Return the object as a fresh JSON-ready dict, fields in their original order."""
        copy: dict[str, Any] = _loads(_dumps(self._data))
        return copy

    def to_json(self) -> bytes:
        """Return the object as compact JSON bytes."""
        return _dumps(self._data)

    @property
    def type(self) -> str:
        """The object's type (``""`` for a record)."""
        if self._kind == _RECORD:
            return ""
        value: str = self._data["type"]
        return value

    def _str(self, key: str) -> str | None:
        if self._kind == _RECORD:
            return None
        value: str | None = self._data.get(key)
        return value

    @property
    def content(self) -> str | None:
        """Text content (``Note``, ``Article``), or ``None``."""
        return self._str("content")

    @property
    def url(self) -> str | None:
        """Workspace-relative path (``Document``), or ``None``."""
        return self._str("url")

    @property
    def name(self) -> str | None:
        """Title (``Article``), or ``None``."""
        return self._str("name")

    @property
    def summary(self) -> str | None:
        """One-line description, or ``None``."""
        return self._str("summary")

    @property
    def about(self) -> str | None:
        """What a knowledge ``Note`` is about, or ``None``."""
        return self._str("about")

    @property
    def items(self) -> tuple[ASObject | str, ...] | None:
        """Members of a ``Collection`` (objects or string references), or ``None``."""
        if self._kind == _RECORD:
            return None
        items = self._data.get("items")
        if items is None:
            return None
        kind = _RECORD if self._kind == _RECORDS else _PLAIN
        return tuple(
            item if item.__class__ is str else _object_view(ASObject, item, kind) for item in items
        )

    @property
    def extra(self) -> Mapping[str, Any]:
        """Read-only copy of the fields this module does not interpret."""
        if self._kind == _RECORD:
            return _frozen_copy(self._data)
        return _unknown_fields(self._data, _OBJECT_KNOWN)

    @property
    def is_record(self) -> bool:
        """Whether this is an untyped binding row of a ``Recall`` result."""
        return self._kind == _RECORD

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ASObject):
            return self._data == other._data
        return NotImplemented

    def __hash__(self) -> int:
        # Only string fields: equal dicts always agree on them.
        data = self._data
        if self._kind == _RECORD:
            return hash(tuple(sorted(data)))
        return hash((data["type"], data.get("url"), data.get("content"), data.get("about")))

    def __repr__(self) -> str:
        if self._kind == _RECORD:
            return f"ASObject(record {_short(self.to_json().decode(), 70)})"
        data = self._data
        detail = data.get("url") or data.get("content") or data.get("name") or ""
        items = data.get("items")
        count = f" ({len(items)} items)" if isinstance(items, list) else ""
        text = f" {_short(detail, 60)!r}" if detail else ""
        return f"ASObject({data['type']}{text}{count})"

    def __copy__(self) -> ASObject:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ASObject:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_object_from_state, (self.to_json(), self._kind))


_PLAIN: Final = 0
_RECORDS: Final = 1
_RECORD: Final = 2


def _object_view(cls: type[ASObject], data: dict[str, Any], kind: int) -> ASObject:
    """Wrap an already validated private dict (shared, never mutated) as an object."""
    obj = _new(cls)
    obj._data = data
    obj._kind = kind
    return obj


def _object_from_state(raw: bytes, kind: int) -> ASObject:
    data = _loads(raw)
    if kind == _RECORD:
        return _object_view(ASObject, data, kind)
    if data.__class__ is not dict:
        _not_object(data)
    _check_object(data, "", 1, kind == _RECORDS, _EXPECT_OBJECT)
    return _object_view(ASObject, data, kind)


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _frozen_copy(data: dict[str, Any]) -> Mapping[str, Any]:
    copy: dict[str, Any] = _loads(_dumps(data))
    return MappingProxyType(copy)


def _unknown_fields(data: dict[str, Any], known: frozenset[str]) -> Mapping[str, Any]:
    unknown = {key: value for key, value in data.items() if key not in known}
    return _frozen_copy(unknown) if unknown else _EMPTY


def _add_extra(
    data: dict[str, Any], extra: Mapping[str, Any] | None, known: frozenset[str]
) -> None:
    if extra is None:
        return
    if not isinstance(extra, Mapping):
        _fail("extra", "a mapping of field names to values", extra)
    for key, value in extra.items():
        if not isinstance(key, str):
            _fail("extra", "string field names", key)
        if key in known:
            raise ActivityError(
                f"extra: {key!r} is a field of its own; pass it as {key}=... instead",
                field=key,
                expected="a field name the profile does not define",
                reason="bad-field",
            )
        data[key] = value


# ------------------------------------------------------------------------ Activity


class Activity:
    """An immutable, validated AS2 activity.

    Build one with the constructor, a builder (:func:`offer`, :func:`invoke`...),
    :meth:`from_dict`, :meth:`from_json` or :func:`parse_activity`. Read the profile's
    fields as attributes; unknown fields are in :attr:`extra`, and :meth:`to_dict` /
    :meth:`to_json` give back exactly what came in (same keys, values and key order).
    Equality and hashing are by content (dict equality: key order does not matter).

    Attributes:
        type: activity type, one of :data:`ACTIVITY_TYPES`.
        actor: the sending agent (``""`` only for the plain-text fallback).
        summary: one-line description (``""`` only for the plain-text fallback).
        content: text of a top-level ``Note``, or ``None``.
        context: task id or thread reference, or ``None``.
        object: the thing acted on: an :class:`ASObject`, a string reference, or ``None``.
        target: recipient agent or channel, or ``None``.
        result: outcome, an :class:`ASObject`, or ``None``.
        instrument: tool(s) used: a string, a tuple of strings, or ``None``.
        tag: labels, a tuple of strings, or ``None``.
        extra: read-only copy of the fields the profile does not define.
    """

    __slots__ = ("_d", "_i", "_json", "_s", "_src")

    # The fields are decoded when first needed (activities arrive validated and most
    # are only counted or forwarded): from _src, the batch the activity arrived in (its
    # element _i), or else from _json. An activity that passed the C schema keeps its
    # shape _s, from which the string fields read without decoding anything.
    _d: dict[str, Any] | None
    _json: bytes | None  # compact orjson bytes once known; never stale, nothing changes
    _s: _ActivityShape | None
    _src: _Batch | None
    _i: int

    def __init__(
        self,
        type: str,
        actor: str,
        summary: str,
        *,
        content: str | None = None,
        context: str | None = None,
        object: ASObject | str | Mapping[str, Any] | None = None,
        target: str | None = None,
        result: ASObject | Mapping[str, Any] | None = None,
        instrument: str | Sequence[str] | None = None,
        tag: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Build and validate an activity; fields are written in :data:`ACTIVITY_FIELDS` order.

        Args:
            type: one of :data:`ACTIVITY_TYPES`.
            actor: name of the sending agent.
            summary: one-line human-readable description.
            content: text, for a top-level ``Note``.
            context: task id (``urn:porter:task:...``) or thread reference.
            object: what is acted on: an object, or a string reference.
            target: recipient agent name or channel.
            result: outcome object.
            instrument: tool or tools used.
            tag: labels (priority, language, framework).
            extra: further fields, written after the known ones.

        Raises:
            ActivityError: the result breaks the profile (``field`` names the place).
        """
        data: dict[str, Any] = {"type": type, "actor": actor, "summary": summary}
        for key, value in (
            ("content", content),
            ("context", context),
            ("object", object),
            ("target", target),
            ("result", result),
            ("instrument", instrument),
            ("tag", tag),
        ):
            if value is not None:
                data[key] = value
        _add_extra(data, extra, _ACTIVITY_KNOWN)
        raw = _encode(data)
        self._json = raw
        self._src = None
        self._s = shape = _shape_of(raw)
        if shape is not None:
            self._d = None
        else:
            copy = _loads(raw)
            _activity(copy)  # validates (the wrapper it returns is not needed here)
            self._d = copy

    @property
    def _data(self) -> dict[str, Any]:
        data = self._d
        if data is None:
            src = self._src
            if src is None:
                data = _loads(cast(bytes, self._json))
            else:
                data = src.item(self._i)
                self._src = None
            self._d = data
        return data

    # -- decoding ------------------------------------------------------------------

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str) -> Activity:
        """Decode and validate one activity from JSON, strictly (no plain-text fallback).

        Args:
            data: UTF-8 JSON bytes (or a str) of one activity object.

        Returns:
            The activity. Its dict is orjson's output, owned and never copied.

        Raises:
            ActivityError: not JSON (``"bad-json"``), not an object, too large or too
                deep, or not a valid activity.
        """
        if data.__class__ is not bytes:
            data = _utf8(data)
        if len(data) > MAX_ACTIVITY_BYTES:
            _too_large(len(data), MAX_ACTIVITY_BYTES)
        try:
            decoded = _loads(data)
        except _JSONDecodeError as exc:
            raise _bad_json(exc) from None
        # One parse each (orjson for the dict, msgspec for the check) costs less than
        # the Python rules; the shape then answers the string fields.
        shape = _shape_of(data)
        if shape is None:
            return _activity(decoded)
        activity = _new(Activity)
        activity._d = decoded
        activity._s = shape
        activity._json = activity._src = None
        return activity

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Activity:
        """Validate a JSON-compatible mapping and wrap a private copy of it.

        Values go through JSON once (the copy is also the size check): tuples become
        arrays and :class:`ASObject` values their JSON form.

        Args:
            data: the activity, e.g. ``{"type": "Accept", "actor": "w1", "summary": "ok"}``.

        Returns:
            The activity; ``to_dict()`` equals ``data``, key order included.

        Raises:
            ActivityError: ``data`` is not JSON-compatible or not a valid activity.
        """
        if data.__class__ is not dict and not isinstance(data, Mapping):
            _not_object(data)
        # _encode() and _shape_of() inline: applications build activities at high rates.
        try:
            raw = _dumps(data, default=_json_default)
        except TypeError:
            raw = _encode(data)  # raises the full explanation
        if len(raw) > MAX_ACTIVITY_BYTES:
            _too_large(len(raw), MAX_ACTIVITY_BYTES)
        try:
            shape = _shape_one(raw)
        except _ShapeRefused:
            pass  # the Python rules decide below
        else:
            context = shape.context
            if context is _UNSET or context in _GOOD_CONTEXTS or _context_ok(context):
                activity = _new(Activity)
                activity._d = activity._src = None
                activity._s = shape
                activity._json = raw
                return activity
        activity = _activity(_loads(raw))
        activity._json = raw
        return activity

    @classmethod
    def fallback(cls, text: str) -> Activity:
        """Wrap plain text as the profile's fallback ``{"type": "Note", "content": text}``.

        Args:
            text: the raw message text.

        Returns:
            An activity with :attr:`is_fallback` set.

        Raises:
            ActivityError: ``text`` is not a str, or is too large.
        """
        if not isinstance(text, str):
            _fail("content", "a string", text)
        return cls.from_dict({"type": "Note", "content": text})

    # -- encoding ------------------------------------------------------------------

    def to_json(self) -> bytes:
        """Return the activity as compact JSON bytes (orjson), cached after the first call."""
        raw = self._json
        if raw is None:
            raw = _dumps(self._data)
            self._json = raw
        return raw

    def to_dict(self) -> dict[str, Any]:
        """Return a fresh JSON-ready dict: same keys, values and key order as the input."""
        copy: dict[str, Any] = _loads(self.to_json())
        return copy

    def replace(self, **changes: Any) -> Activity:
        """Return a re-validated copy with some fields changed.

        Existing fields keep their place; new ones are added at the end. ``None``
        removes a field. ``extra={...}`` sets unknown fields (``None`` values remove).

        Args:
            **changes: new values by field name (:data:`ACTIVITY_FIELDS`, or ``extra``).

        Returns:
            The new activity.

        Raises:
            ActivityError: an unknown keyword, or the result breaks the profile.
        """
        data = dict(self._data)
        extra = changes.pop("extra", None)
        for key, value in changes.items():
            if key not in _ACTIVITY_KNOWN:
                raise ActivityError(
                    f"replace(): {key!r} is not a field of the profile; use one of "
                    f"{', '.join(ACTIVITY_FIELDS)}, or extra={{{key!r}: ...}}",
                    field=key,
                    expected="a profile field name",
                    reason="bad-field",
                )
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if extra is not None:
            added: dict[str, Any] = {}
            _add_extra(added, extra, _ACTIVITY_KNOWN)
            for key, value in added.items():
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
        return type(self).from_dict(data)

    # -- fields --------------------------------------------------------------------

    # The string fields read from the shape when there is one (the same values orjson
    # would decode: both keep the last of a repeated key).

    @property
    def type(self) -> str:
        """Activity type, one of :data:`ACTIVITY_TYPES`."""
        shape = self._s
        value: str = shape.type if shape is not None else self._data["type"]
        return value

    @property
    def actor(self) -> str:
        """The sending agent (``""`` for the plain-text fallback)."""
        shape = self._s
        value: str = shape.actor if shape is not None else self._data.get("actor", "")
        return value

    @property
    def summary(self) -> str:
        """One-line description (``""`` for the plain-text fallback)."""
        shape = self._s
        value: str = shape.summary if shape is not None else self._data.get("summary", "")
        return value

    @property
    def content(self) -> str | None:
        """Text of a top-level ``Note`` (and of the fallback), or ``None``."""
        shape = self._s
        if shape is not None:
            return _set_or_none(shape.content)
        value: str | None = self._data.get("content")
        return value

    @property
    def context(self) -> str | None:
        """Task id or thread reference, or ``None``."""
        shape = self._s
        if shape is not None:
            return _set_or_none(shape.context)
        value: str | None = self._data.get("context")
        return value

    @property
    def target(self) -> str | None:
        """Recipient agent name or channel, or ``None``."""
        shape = self._s
        if shape is not None:
            return _set_or_none(shape.target)
        value: str | None = self._data.get("target")
        return value

    @property
    def object(self) -> ASObject | str | None:
        """What is acted on: an :class:`ASObject`, a string reference, or ``None``."""
        shape = self._s
        if shape is not None:
            ref = shape.object
            if ref is _UNSET:
                return None
            if isinstance(ref, str):
                return ref
        value = self._data.get("object")
        if value is None or value.__class__ is str:
            reference: str | None = value
            return reference
        return _object_view(ASObject, value, _PLAIN)

    @property
    def result(self) -> ASObject | None:
        """Outcome object, or ``None``. A ``Recall``'s result items are records."""
        value = self._data.get("result")
        if value is None:
            return None
        kind = _RECORDS if self._data["type"] == "Recall" else _PLAIN
        return _object_view(ASObject, value, kind)

    @property
    def instrument(self) -> str | tuple[str, ...] | None:
        """Tool or tools used: a string, a tuple of strings, or ``None``."""
        value = self._data.get("instrument")
        if value is None or value.__class__ is str:
            single: str | None = value
            return single
        return tuple(value)

    @property
    def tag(self) -> tuple[str, ...] | None:
        """Labels, or ``None``."""
        value = self._data.get("tag")
        return None if value is None else tuple(value)

    @property
    def extra(self) -> Mapping[str, Any]:
        """Read-only copy of the top-level fields the profile does not define."""
        return _unknown_fields(self._data, _ACTIVITY_KNOWN)

    @property
    def is_fallback(self) -> bool:
        """Whether this is the plain-text fallback (a ``Note`` with only ``content``)."""
        return self._s is None and "actor" not in self._data  # a shape has an actor

    @property
    def task_id(self) -> str | None:
        """The ``context`` when it is a task id, else ``None``."""
        value = self.context
        return value if is_task_id(value) else None

    @property
    def bindings(self) -> tuple[dict[str, Any], ...] | None:
        """Rows of a ``Recall`` result (fresh dicts), or ``None`` for other activities."""
        if self._data["type"] != "Recall":
            return None
        result = self._data.get("result")
        if result is None:
            return None
        rows = [item for item in result.get("items", ()) if item.__class__ is dict]
        copy: list[dict[str, Any]] = _loads(_dumps(rows))
        return tuple(copy)

    def headline(self) -> str:
        """A one-line human-readable digest: ``Offer architect -> worker [ctx] summary``."""
        data = self._data
        if "actor" not in data:
            return f"Note (fallback) {_short(data['content'], 80)}"
        parts = [data["type"], data["actor"]]
        if "target" in data:
            parts += ["->", data["target"]]
        if "context" in data:
            parts.append(f"[{data['context']}]")
        parts.append(data["summary"])
        return " ".join(parts)

    # -- value behaviour -----------------------------------------------------------

    def __eq__(self, other: builtins.object) -> bool:
        if isinstance(other, Activity):
            return self._data == other._data
        return NotImplemented

    def __hash__(self) -> int:
        # Only string fields: equal dicts always agree on them, whatever the key order
        # or number spelling elsewhere.
        data = self._data
        return hash(
            (
                data["type"],
                data.get("actor"),
                data.get("summary"),
                data.get("context"),
                data.get("content"),
            )
        )

    def __repr__(self) -> str:
        return f"<Activity {_short(self.headline(), 100)}>"

    def __copy__(self) -> Activity:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Activity:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_activity_from_state, (self.to_json(),))


def _set_or_none(value: str | msgspec.UnsetType) -> str | None:
    return None if value is _UNSET else value


def _activity_from_state(raw: bytes) -> Activity:
    return Activity.from_json(raw)


# ------------------------------------------------------------------ codec functions


def parse_activity(data: bytes | bytearray | memoryview | str) -> Activity:
    """Decode a received payload the way the profile says a receiver must.

    Args:
        data: the payload, UTF-8 bytes (or a str).

    Returns:
        The activity, or the fallback Note ``{"type": "Note", "content": <text>}`` when
        ``data`` is not JSON (text that is not UTF-8 is decoded with replacement
        characters first).

    Raises:
        ActivityError: larger than ``MAX_ACTIVITY_BYTES`` (``"too-large"``), nested too
            deep (``"too-deep"``), JSON that is not an object (``"not-an-object"``), or
            an object that is not a valid activity (``field``/``expected`` say why).
    """
    if data.__class__ is not bytes:
        data = _utf8(data)
    if len(data) > MAX_ACTIVITY_BYTES:
        _too_large(len(data), MAX_ACTIVITY_BYTES)
    try:
        decoded = _loads(data)
    except _JSONDecodeError as exc:
        error = _bad_json(exc)
        if error.reason == "too-deep":
            raise error from None
        text = bytes(data).decode("utf-8", "replace")
        fallback = _new(Activity)
        fallback._d = {"type": "Note", "content": text}
        fallback._json = fallback._s = fallback._src = None
        return fallback
    return _activity(decoded)


def _utf8(data: bytes | bytearray | memoryview | str) -> bytes | bytearray | memoryview:
    """Input that is not ``bytes`` as something orjson reads: str becomes UTF-8."""
    if isinstance(data, str):
        if len(data) > MAX_ACTIVITY_BYTES:
            _too_large(len(data), MAX_ACTIVITY_BYTES)
        # Lone surrogates cannot be sent as UTF-8; they become "?" like any codec would.
        return data.encode("utf-8", "replace")
    return data


def validate_activity(data: Mapping[str, Any]) -> None:
    """Check a JSON-compatible mapping against the profile.

    Args:
        data: the activity as a dict.

    Raises:
        ActivityError: what is wrong, where (``field``) and what was expected.
    """
    Activity.from_dict(data)


def activities_from_json_array(
    data: bytes | bytearray | memoryview,
    *,
    on_error: Callable[[int, ActivityError], None] | None = None,
) -> list[Activity]:
    """Decode a batch: one JSON array of activities, each validated.

    Args:
        data: UTF-8 JSON bytes of an array, at most ``MAX_MESSAGE_BYTES`` long and with
            at most ``MAX_BATCH`` elements.
        on_error: called with ``(index, error)`` for each invalid element, which is then
            skipped; when ``None`` the first invalid element raises.

    Returns:
        The valid activities, in order.

    Raises:
        ActivityError: the batch as a whole is unusable (not JSON, not an array, too
            large, too many elements), or an element is invalid and ``on_error`` is
            ``None`` (its ``field`` is prefixed with ``[index]``).
    """
    if len(data) > MAX_MESSAGE_BYTES:
        _too_large(len(data), MAX_MESSAGE_BYTES, "batch")
    if data.__class__ is not bytes:
        data = bytes(_utf8(data))  # ours: the activities decode from it later
    fast = _shaped_many(data)
    if fast is not None:
        return fast
    try:
        decoded = _loads(data)
    except _JSONDecodeError as exc:
        raise _bad_json(exc, "a batch") from None
    if decoded.__class__ is not list:
        _fail(None, "a JSON array of activities", decoded, reason="not-an-object")
    if len(decoded) > MAX_BATCH:
        raise ActivityError(
            f"batch holds {len(decoded)} activities, over the limit of {MAX_BATCH}; "
            "split it into several messages",
            expected=f"at most {MAX_BATCH} activities",
            reason="too-many",
        )
    # Elements can only break the single-activity byte limit if the batch itself does.
    measure = len(data) > MAX_ACTIVITY_BYTES
    if not measure:
        # The usual batch: one comprehension, no per-element bookkeeping. An invalid element is
        # rare; the loop below then finds it again and says which it is.
        wrap = _activity
        try:
            return [wrap(item) for item in decoded]
        except ActivityError:
            pass
    out: list[Activity] = []
    for index, item in enumerate(decoded):
        try:
            activity = _activity(item)
            if measure:
                raw = _dumps(item)
                if len(raw) > MAX_ACTIVITY_BYTES:
                    _too_large(len(raw), MAX_ACTIVITY_BYTES)
                activity._json = raw
        except ActivityError as exc:
            if on_error is None:
                raise _in_batch(index, exc) from None
            on_error(index, exc)
            continue
        out.append(activity)
    return out


def _in_batch(index: int, exc: ActivityError) -> ActivityError:
    field = f"[{index}].{exc.field}" if exc.field else f"[{index}]"
    return ActivityError(
        f"batch item {index}: {exc}", field=field, expected=exc.expected, reason=exc.reason
    )


def activities_to_json_array(activities: Iterable[Activity]) -> bytes:
    """Encode activities as one JSON array (the batch form read by
    :func:`activities_from_json_array`).

    When every activity already holds its JSON (activities built in Python do), the
    array is those bytes joined with commas; otherwise one orjson call writes the list
    of their dicts.

    Args:
        activities: the activities, at most ``MAX_BATCH`` of them.

    Returns:
        Compact JSON bytes.

    Raises:
        ActivityError: an element is not an :class:`Activity`, or there are too many.
    """
    items = activities if activities.__class__ is list else list(activities)
    if len(items) > MAX_BATCH:
        raise ActivityError(
            f"batch holds {len(items)} activities, over the limit of {MAX_BATCH}; "
            "split it into several messages",
            expected=f"at most {MAX_BATCH} activities",
            reason="too-many",
        )
    try:
        cached: list[bytes | None] = [activity._json for activity in items]
        if all(cached):  # JSON bytes are never empty; None means not cached
            return b"[" + b",".join(cast(list[bytes], cached)) + b"]"
        return _dumps([activity._data for activity in items])
    except AttributeError:  # not an Activity
        pass
    for index, item in enumerate(items):
        if not isinstance(item, Activity):
            _fail(f"[{index}]", "an Activity", item)
    raise AssertionError("unreachable: every element is an Activity")


# ------------------------------------------------------------------------- builders


def document(url: str, summary: str | None = None) -> ASObject:
    """A workspace file: ``{"type": "Document", "url": url[, "summary": ...]}``.

    Raises:
        ActivityError: ``url`` or ``summary`` is not a string.
    """
    return ASObject("Document", url=url, summary=summary)


def collection(items: Iterable[ASObject | str], *, summary: str | None = None) -> ASObject:
    """A set of objects (usually documents): ``{"type": "Collection", "items": [...]}``.

    Raises:
        ActivityError: an item is neither an object nor a string.
    """
    return ASObject("Collection", summary=summary, items=items)


def note_object(
    content: str,
    *,
    about: str | None = None,
    name: str | None = None,
    summary: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> ASObject:
    """Free text: ``{"type": "Note"[, "about": ...], "content": content}``.

    Raises:
        ActivityError: a value is not a string.
    """
    return ASObject("Note", name=name, about=about, content=content, summary=summary, extra=extra)


def _text_activity(
    kind: str,
    actor: str,
    summary: str,
    text: str | None,
    obj: ASObject | str | Mapping[str, Any] | None,
    context: str | None,
    target: str | None,
    tag: Sequence[str] | None,
    extra: Mapping[str, Any] | None,
) -> Activity:
    """An activity whose ``object`` is either given or a Note made from ``text``."""
    if text is not None:
        if obj is not None:
            what = "reason" if kind == "Reject" else "content"
            raise ActivityError(
                f"give either {what} or object=, not both",
                field="object",
                expected=f"{what} or object",
                reason="bad-field",
            )
        obj = {"type": "Note", "content": text}
    return Activity(
        kind, actor, summary, context=context, object=obj, target=target, tag=tag, extra=extra
    )


def offer(
    actor: str,
    summary: str,
    content: str | None = None,
    *,
    target: str | None = None,
    context: str | None = None,
    tag: Sequence[str] | None = None,
    object: ASObject | str | Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Assign a task (or request a review): ``content`` becomes a Note ``object``.

    Raises:
        ActivityError: a value breaks the profile, or both ``content`` and ``object``.
    """
    return _text_activity("Offer", actor, summary, content, object, context, target, tag, extra)


def accept(
    actor: str,
    summary: str,
    *,
    context: str | None = None,
    object: ASObject | str | Mapping[str, Any] | None = None,
    target: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Acknowledge a task or approve a review.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return Activity(
        "Accept", actor, summary, context=context, object=object, target=target, extra=extra
    )


def reject(
    actor: str,
    summary: str,
    reason: str | None = None,
    *,
    context: str | None = None,
    object: ASObject | str | Mapping[str, Any] | None = None,
    target: str | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Decline a task or request changes: ``reason`` becomes a Note ``object``.

    Raises:
        ActivityError: a value breaks the profile, or both ``reason`` and ``object``.
    """
    return _text_activity("Reject", actor, summary, reason, object, context, target, tag, extra)


def _artifact(
    kind: str,
    actor: str,
    summary: str,
    obj: ASObject | str | Mapping[str, Any] | None,
    context: str | None,
    target: str | None,
    instrument: str | Sequence[str] | None,
    tag: Sequence[str] | None,
    extra: Mapping[str, Any] | None,
) -> Activity:
    return Activity(
        kind,
        actor,
        summary,
        context=context,
        object=obj,
        target=target,
        instrument=instrument,
        tag=tag,
        extra=extra,
    )


def create(
    actor: str,
    summary: str,
    object: ASObject | str | Mapping[str, Any] | None = None,
    *,
    context: str | None = None,
    target: str | None = None,
    instrument: str | Sequence[str] | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Produce a new artifact (``object`` is usually a Document or a Collection).

    Raises:
        ActivityError: a value breaks the profile.
    """
    return _artifact("Create", actor, summary, object, context, target, instrument, tag, extra)


def update(
    actor: str,
    summary: str,
    object: ASObject | str | Mapping[str, Any] | None = None,
    *,
    context: str | None = None,
    target: str | None = None,
    instrument: str | Sequence[str] | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Modify an existing artifact.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return _artifact("Update", actor, summary, object, context, target, instrument, tag, extra)


def delete(
    actor: str,
    summary: str,
    object: ASObject | str | Mapping[str, Any] | None = None,
    *,
    context: str | None = None,
    target: str | None = None,
    instrument: str | Sequence[str] | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Remove an artifact.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return _artifact("Delete", actor, summary, object, context, target, instrument, tag, extra)


def announce(
    actor: str,
    summary: str,
    content: str | None = None,
    *,
    context: str | None = None,
    target: str | None = None,
    object: ASObject | str | Mapping[str, Any] | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Broadcast status or findings: ``content`` becomes a Note ``object``.

    Raises:
        ActivityError: a value breaks the profile, or both ``content`` and ``object``.
    """
    return _text_activity("Announce", actor, summary, content, object, context, target, tag, extra)


def question(
    actor: str,
    summary: str,
    content: str | None = None,
    *,
    target: str | None = None,
    context: str | None = None,
    object: ASObject | str | Mapping[str, Any] | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Ask for input or clarification: ``content`` becomes a Note ``object``.

    Raises:
        ActivityError: a value breaks the profile, or both ``content`` and ``object``.
    """
    return _text_activity("Question", actor, summary, content, object, context, target, tag, extra)


def invoke(
    actor: str,
    summary: str,
    command: str,
    output: str | None,
    *,
    context: str | None = None,
    instrument: str | Sequence[str] | None = ("bash",),
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Record a command execution: ``command`` and ``output`` become Note objects.

    Args:
        actor: the agent that ran the command.
        summary: one-line description.
        command: the command line (``object.content``).
        output: what it printed (``result.content``); ``None`` leaves ``result`` out.
        context: the task id.
        instrument: the tool used, ``["bash"]`` by default.
        extra: further fields.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return Activity(
        "Invoke",
        actor,
        summary,
        context=context,
        object={"type": "Note", "content": command},
        result=None if output is None else {"type": "Note", "content": output},
        instrument=instrument,
        extra=extra,
    )


def remember(
    actor: str,
    summary: str,
    about: str,
    finding: str,
    *,
    context: str | None = None,
    severity: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Store an observation: ``{"type": "Note", "about": about, "content": finding}``.

    Args:
        actor: the discovering agent.
        summary: one-line description.
        about: what the finding is about (a URN such as ``urn:porter:file:app.py``).
        finding: the observation itself.
        context: the task id.
        severity: optional severity label, stored as the object's ``severity`` field.
        extra: further top-level fields.

    Raises:
        ActivityError: a value breaks the profile.
    """
    obj: dict[str, Any] = {"type": "Note", "about": about, "content": finding}
    if severity is not None:
        obj["severity"] = severity
    return Activity("Remember", actor, summary, context=context, object=obj, extra=extra)


def recall(
    actor: str,
    summary: str,
    sparql: str,
    *,
    result_items: Iterable[Mapping[str, Any]] | None = None,
    context: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Query the knowledge graph: the query is a Note ``object``; rows form the ``result``.

    Args:
        actor: the asking agent.
        summary: one-line description.
        sparql: a read-only SPARQL query.
        result_items: binding rows (variable name -> value) for the answer; ``None``
            leaves ``result`` out (a question, not yet an answer).
        context: the task id.
        extra: further fields.

    Raises:
        ActivityError: a value breaks the profile.
    """
    result = None
    if result_items is not None:
        result = {"type": "Collection", "items": list(result_items)}
    return Activity(
        "Recall",
        actor,
        summary,
        context=context,
        object={"type": "Note", "content": sparql},
        result=result,
        extra=extra,
    )


def note(
    actor: str,
    summary: str,
    content: str,
    *,
    context: str | None = None,
    target: str | None = None,
    object: ASObject | str | Mapping[str, Any] | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """A top-level Note, e.g. a review comment: ``content`` is the text.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return Activity(
        "Note",
        actor,
        summary,
        content=content,
        context=context,
        object=object,
        target=target,
        tag=tag,
        extra=extra,
    )


def fallback_note(text: str) -> Activity:
    """The profile's plain-text fallback, ``{"type": "Note", "content": text}``.

    Raises:
        ActivityError: ``text`` is not a string or is too large.
    """
    return Activity.fallback(text)
