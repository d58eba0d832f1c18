"""The wire form of activities: one payload (:func:`parse_activity`, with the profile's
plain-text fallback) and a batch, one JSON array (:func:`activities_from_json_array`,
:func:`activities_to_json_array`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, cast

from porter_mesh.core import speedups as _speedups
from porter_mesh.core.as2.model import (
    Activity,
    _Batch,
    _new,
    _one_json,
    _utf8,
    activity_from_decoded,
)
from porter_mesh.core.as2.rules import (
    _GOOD_CONTEXTS,
    _bad_json,
    _dumps,
    _fail,
    _JSONDecodeError,
    _loads,
    _too_large,
)
from porter_mesh.core.as2.schema import (
    _UNSET,
    _context_ok,
    _shape_many,
    _ShapeRefused,
)
from porter_mesh.core.constants import (
    MAX_ACTIVITY_BYTES,
    MAX_BATCH,
    MAX_MESSAGE_BYTES,
)
from porter_mesh.errors import ActivityError

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
    data = _one_json(data)
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
    return activity_from_decoded(decoded)


def _shaped_many(data: bytes) -> list[Activity] | None:
    """The activities of a batch if every element passes the C schema, else ``None``.

    The caller has checked the batch's total size. A batch over the single-activity
    limit goes to the Python path, which measures each element.

    Where the time goes, per element of a 64-activity batch of the profile's Announce
    (``bench/bench_codec.py``, "payload decode (64)", about 0.47 us): the msgspec decode
    about 0.27 us, and the wrapper about 0.17 us, of which about 0.12 us is allocating
    the :class:`Activity` itself and the rest its slot stores. Folding the context loop
    into the wrapping loop (one pass instead of two) was measured and made no difference
    beyond noise. The compiled path (:mod:`porter_mesh.core.speedups`) wraps in C, about
    0.03 us per element, and leaves the activities off the garbage collector's list,
    which saved more than the wrapping itself once an application holds them a while.
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
    wrap = _speedups.wrap_shapes
    if wrap is not None:  # the compiled path: the same slots, off the GC's list
        return wrap(shapes, batch)
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
        _too_many(len(decoded))
    # Elements can only break the single-activity byte limit if the batch itself does.
    measure = len(data) > MAX_ACTIVITY_BYTES
    if not measure:
        # The usual batch: one comprehension, no per-element bookkeeping. An invalid element is
        # rare; the loop below then finds it again and says which it is.
        wrap = activity_from_decoded
        try:
            return [wrap(item) for item in decoded]
        except ActivityError:
            pass
    out: list[Activity] = []
    for index, item in enumerate(decoded):
        try:
            activity = activity_from_decoded(item)
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


def _too_many(count: int) -> NoReturn:
    raise ActivityError(
        f"batch holds {count} activities, over the limit of {MAX_BATCH}; "
        "split it into several messages",
        expected=f"at most {MAX_BATCH} activities",
        reason="too-many",
    )


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
        _too_many(len(items))
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
