"""The optional compiled hot path (``_speedups.c``), and its switch.

Three steps run once per activity sent or received: making the :class:`Activity` of a
checked activity (:meth:`Activity.from_dict`, which on this path is the extension's
function itself: its steps are a few C calls, whose Python glue cost some 160 ns of the
~1.3 us of publishing an activity), wrapping each element of a checked batch
(``codec._shaped_many``) and making the delivered-message tuple of each
(``Inbox.deliver``). The extension does them in C and, unlike Python, takes each new
object off the cyclic garbage collector's list: none of them can be part of a reference
cycle (the C file says why), and left tracked the messages an application holds between
two reads of its inbox are walked by every collection and promoted until they trigger
full collections of the whole heap. Measured on the node benchmark
(``docs/performance.md``), that collector work was the largest single share of
receiving a broadcast.

The extension is built at install when a C compiler is present (``setup.py``) and is
never required: without it, or with ``PORTER_MESH_PURE=1`` in the environment, the
same steps run in Python (``wrap_shapes``, ``with_shape`` and ``messages`` are then
``None`` and the callers take their inline Python path). Both paths make equal activities; the unit
tests run the codec's tests on each.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

#: Set to ``1`` to run the pure Python path even when the extension is built.
PURE_ENV: Final = "PORTER_MESH_PURE"


def _load() -> ModuleType | None:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        from porter_mesh.core import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _speedups  # type: ignore[no-any-return]


_compiled: Final = _load()

#: ``wrap_shapes(shapes, batch)``: the activities of a checked batch, or ``None``.
wrap_shapes: Callable[[list[Any], Any], list[Any]] | None = None
#: ``with_shape(shape, raw)``: the activity of one checked JSON value, or ``None``.
with_shape: Callable[[Any, bytes], Any] | None = None
#: ``messages(cls, channel, sender, activities, env, seq, direct, offset, redelivered)``:
#: one ``cls`` tuple per activity, ``(channel, sender, activity, env, seq + i, direct,
#: offset + i or -1, redelivered)``, or ``None``.
messages: Callable[..., list[Any]] | None = None

_activity_class: type | None = None
#: The model's own ``from_dict`` (a classmethod) and the extension's, as one.
_python_from_dict: Any = None
_compiled_from_dict: Any = None


def available() -> bool:
    """Whether the compiled extension was built and not switched off by ``PORTER_MESH_PURE``."""
    return _compiled is not None


def bind(activity_class: type, from_dict_parts: tuple[Any, ...]) -> None:
    """Give the extension the class it makes (called once, by the model).

    Args:
        activity_class: :class:`~porter_mesh.core.as2.model.Activity`.
        from_dict_parts: what the compiled ``from_dict`` calls, in its order: ``dumps``,
            its ``default``, the C schema's decoder, the exceptions by which it refuses,
            ``msgspec.UNSET``, the set of contexts found valid, the Python check of a new
            one, the Python rules' maker of an activity from JSON bytes, and the largest
            activity in bytes.
    """
    global _activity_class, _python_from_dict, _compiled_from_dict
    _activity_class = activity_class
    _python_from_dict = activity_class.__dict__["from_dict"]
    if _compiled is not None:
        _compiled.bind(activity_class)
        _compiled.bind_from_dict(_python_from_dict.__func__, *from_dict_parts)
        _compiled_from_dict = classmethod(_compiled.from_dict)
    use_compiled(True)


def use_compiled(on: bool) -> bool:
    """Switch between the compiled and the pure Python path (for tests and benchmarks).

    Args:
        on: whether to use the extension (when it is available).

    Returns:
        Whether the compiled path is now in use.
    """
    global wrap_shapes, with_shape, messages
    compiled = _compiled if on else None
    if compiled is not None:
        wrap_shapes, with_shape = compiled.wrap_shapes, compiled.with_shape
        messages = compiled.messages
    else:
        wrap_shapes = with_shape = messages = None
    if _activity_class is not None:
        # Activity.from_dict is the extension's function itself on the compiled path:
        # no Python frame at all for the common case.
        _activity_class.from_dict = (  # type: ignore[attr-defined]
            _compiled_from_dict if compiled is not None else _python_from_dict)
    return compiled is not None


def in_use() -> bool:
    """Whether activities are now made by the compiled path."""
    return with_shape is not None
