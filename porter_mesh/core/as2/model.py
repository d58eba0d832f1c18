"""The values: :class:`Activity` and :class:`ASObject`, immutable views over one private,
validated JSON dict (see the theory of operation in :mod:`porter_mesh.core.as2`).

The slots of an :class:`Activity` (``_d``, ``_json``, ``_s``, ``_src``, ``_i``) are this
package's internal representation: :mod:`.codec` fills them for the batches it decodes;
nothing outside ``porter_mesh.core.as2`` touches them (it goes through
:meth:`Activity.to_json`, :func:`activity_from_decoded` and the codec functions).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, cast

import msgspec

from porter_mesh.core import speedups as _speedups
from porter_mesh.core.as2.rules import (
    _ACTIVITY_KNOWN,
    _EMPTY,
    _EXPECT_OBJECT,
    _EXPECT_STR_LIST,
    _GOOD_CONTEXTS,
    _OBJECT_KNOWN,
    ACTIVITY_FIELDS,
    ACTIVITY_TYPES,
    _bad_json,
    _check_context,
    _check_object,
    _check_required,
    _check_rest,
    _check_str_list,
    _dumps,
    _fail,
    _JSONDecodeError,
    _loads,
    _not_object,
    _too_deep,
    _too_large,
)
from porter_mesh.core.as2.schema import (
    _UNSET,
    _ActivityShape,
    _context_ok,
    _shape_of,
    _shape_one,
    _ShapeRefused,
)
from porter_mesh.core.constants import (
    MAX_ACTIVITY_BYTES,
)
from porter_mesh.core.taskid import is_task_id
from porter_mesh.errors import ActivityError


def activity_from_decoded(data: Any) -> Activity:
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

    Args:
        data: a value just produced by a JSON decoder (``orjson.loads``), which the
            caller gives away: it must not keep, share or change it afterwards.

    Returns:
        The activity, owning ``data``.

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


def _one_json(data: bytes | bytearray | memoryview | str) -> bytes | bytearray | memoryview:
    """The input of one activity's JSON as bytes orjson reads, refused when too large."""
    if data.__class__ is not bytes:
        data = _utf8(data)
    if len(data) > MAX_ACTIVITY_BYTES:
        _too_large(len(data), MAX_ACTIVITY_BYTES)
    return data


def _utf8(data: bytes | bytearray | memoryview | str) -> bytes | bytearray | memoryview:
    """Input that is not ``bytes`` as something orjson reads: str becomes UTF-8."""
    if isinstance(data, str):
        if len(data) > MAX_ACTIVITY_BYTES:
            _too_large(len(data), MAX_ACTIVITY_BYTES)
        # Lone surrogates cannot be sent as UTF-8; they become "?" like any codec would.
        return data.encode("utf-8", "replace")
    return data


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
        """Read-only copy of the fields this package does not interpret."""
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
            activity_from_decoded(copy)  # validates (the wrapper it returns is not needed here)
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
        data = _one_json(data)
        try:
            decoded = _loads(data)
        except _JSONDecodeError as exc:
            raise _bad_json(exc) from None
        # One parse each (orjson for the dict, msgspec for the check) costs less than
        # the Python rules; the shape then answers the string fields.
        shape = _shape_of(data)
        if shape is None:
            return activity_from_decoded(decoded)
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
                made = _speedups.with_shape
                if made is not None:  # the compiled path: the same slots, off the GC's list
                    return made(shape, raw)  # type: ignore[no-any-return]
                activity = _new(Activity)
                activity._d = activity._src = None
                activity._s = shape
                activity._json = raw
                return activity
        return _made_by_rules(raw)

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


def _made_by_rules(raw: bytes) -> Activity:
    """The activity of ``raw`` (one activity's JSON that the C schema did not take, or
    took with a context it did not know) as the Python rules check it."""
    activity = activity_from_decoded(_loads(raw))
    activity._json = raw
    return activity


_speedups.bind(Activity, (
    _dumps, _json_default, _shape_one, _ShapeRefused, _UNSET, _GOOD_CONTEXTS,
    _context_ok, _made_by_rules, MAX_ACTIVITY_BYTES))


def _set_or_none(value: str | msgspec.UnsetType) -> str | None:
    return None if value is _UNSET else value


def _activity_from_state(raw: bytes) -> Activity:
    return Activity.from_json(raw)
