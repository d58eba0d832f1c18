"""The C fast path of validation: the shapes nearly every activity has, as msgspec structs.

Nothing here decides validity on its own: a value this schema refuses goes to the Python
rules (:mod:`.rules`), which accept a superset and write the precise error.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from porter_mesh.core.as2.rules import (
    _GOOD_CONTEXTS,
    ActivityType,
    ObjectType,
    _check_context,
)
from porter_mesh.errors import ActivityError

# ------------------------------------------------------------ validation in C
#
# The shapes nearly every activity has, written as msgspec structs so that JSON bytes
# are checked in one C call: the required strings, the profile's optional fields, and
# objects two levels deep (an object whose items may be leaf objects). No unknown fields,
# no nulls, no numbers. Anything this schema refuses, whatever the reason, goes to the
# Python validator (:mod:`.rules`), which accepts a superset and writes the precise error; so the
# schema may only ever be stricter than the rules it shadows (a property test holds it to
# that). Only the task-id rule of ``context`` stays in Python, checked on the decoded
# value (for a repeated key both decoders keep the last).

# The type lists are the rules' (one list each); a nested object may be of either.
_ActivityType = ActivityType
_NestedType = Literal[ActivityType, ObjectType]
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
