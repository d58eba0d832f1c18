"""The profile's rules on decoded JSON: the type and field lists, and the checks that say
exactly what is wrong (the field's dotted path, what was expected, what came).

These are the rules written out in :mod:`porter_mesh.core.as2`'s docstring. The checks
run on plain dicts and lists; building the activity from a checked dict is the model's
(:mod:`.model`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Literal, NoReturn, cast, get_args

import orjson

from porter_mesh.core.constants import (
    MAX_JSON_DEPTH,
    TASK_URN_PREFIX,
)
from porter_mesh.core.taskid import is_task_id, parse_task_id
from porter_mesh.errors import ActivityError

#: Activity types of the profile, plus ``Note`` (review comments and the fallback). The
#: one list of them: :data:`ACTIVITY_TYPES` and the C schema's field types derive from it.
ActivityType = Literal[
    "Offer", "Accept", "Reject", "Create", "Update", "Delete",
    "Announce", "Question", "Invoke", "Remember", "Recall", "Note",
]
#: Object types of the profile (values of ``object``, ``result`` and collection items).
ObjectType = Literal["Document", "Collection", "Note", "Article"]

#: Activity types of the profile, as a set.
ACTIVITY_TYPES: Final[frozenset[str]] = frozenset(get_args(ActivityType))
#: Object types of the profile, as a set.
OBJECT_TYPES: Final[frozenset[str]] = frozenset(get_args(ObjectType))

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

#: Object fields the rules check, in the order builders write them.
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
    """Slow path of :func:`activity_from_decoded` for a value that failed its one-expression check.

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
