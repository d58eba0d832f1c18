"""The ActivityStreams 2.0 compact profile: activities, objects and their validator.

Agents speak a compact subset of AS2 (see the profile document): every message is a JSON
object with ``type``, ``actor`` and ``summary``, plus optional fields whose types the
profile's field reference fixes. This package turns bytes or dicts into immutable
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
construction (:func:`activity_from_decoded`, one function with the common shapes checked
in single expressions) costs about two thirds of a bare ``orjson.loads(orjson.dumps(...))`` of the
same dict (the profile's ``Announce``; ``bench/bench_codec.py`` measures it). Immutability
is therefore that of :class:`fractions.Fraction`: the public fields are read-only
properties and ``__slots__`` refuses new attributes, but there is no ``__setattr__``
override, because one would disable CPython's fast slot stores and cost about 0.12 us
per decoded activity. The private slots are private by convention only, and only to this
package: :mod:`.model` and :mod:`.codec` share them; every other module goes through
:meth:`Activity.to_json`, :func:`activity_from_decoded` and the codec functions.

The package
-----------
============  =================================================================
module        holds
============  =================================================================
``rules``     the type and field lists (each written once) and the Python checks
``schema``    the msgspec shapes: the C fast path, never more lenient than the rules
``model``     :class:`Activity` and :class:`ASObject`
``codec``     one payload with the fallback, and batches (JSON arrays)
``builders``  one function per activity type (``offer``, ``remember``...)
============  =================================================================

Every public name is importable from ``porter_mesh.core.as2`` itself.

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

from porter_mesh.core.as2.builders import (
    accept,
    announce,
    collection,
    create,
    delete,
    document,
    fallback_note,
    invoke,
    note,
    note_object,
    offer,
    question,
    recall,
    reject,
    remember,
    update,
)
from porter_mesh.core.as2.codec import (
    activities_from_json_array,
    activities_to_json_array,
    parse_activity,
    validate_activity,
)
from porter_mesh.core.as2.model import (
    Activity,
    ASObject,
    activity_from_decoded,
)
from porter_mesh.core.as2.rules import (
    ACTIVITY_FIELDS,
    ACTIVITY_TYPES,
    OBJECT_FIELDS,
    OBJECT_TYPES,
    ActivityType,
    ObjectType,
)

__all__ = [
    "ACTIVITY_FIELDS",
    "ACTIVITY_TYPES",
    "OBJECT_FIELDS",
    "OBJECT_TYPES",
    "ASObject",
    "Activity",
    "ActivityType",
    "ObjectType",
    "accept",
    "activities_from_json_array",
    "activities_to_json_array",
    "activity_from_decoded",
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
