"""W3C Trace Context as the envelope carries it: ``traceparent`` and ``tracestate``.

A message that belongs to a traced task carries the context of the span that sent it
(https://www.w3.org/TR/trace-context/): ``traceparent`` is
``"<version>-<trace id>-<parent id>-<flags>"`` (2, 32, 16 and 2 lowercase hex digits,
55 characters for version ``00``), ``tracestate`` an optional vendor list of at most 32
``key=value`` members. The envelope keeps both as the exact strings it received, so a
context crosses the mesh byte for byte; this module only checks their shape.

Pure: the codec calls :func:`valid_traceparent` and :func:`valid_tracestate` on every
traced envelope, and the tracing layer builds and reads :class:`TraceContext` values.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

__all__ = [
    "MAX_TRACESTATE_CHARS",
    "TraceContext",
    "format_traceparent",
    "parse_traceparent",
    "valid_traceparent",
    "valid_tracestate",
]

#: The W3C limit on a tracestate header a vendor must propagate (512 characters).
MAX_TRACESTATE_CHARS: Final = 512

# Version 00 is exactly 55 characters; a later version may append fields after a dash
# (the spec's forward compatibility rule); version ff is forbidden. All-zero trace and
# parent ids are invalid.
_TRACEPARENT: Final = re.compile(
    r"(?!ff)([0-9a-f]{2})-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})(-.*)?",
    re.ASCII | re.DOTALL,
)
# Printable ASCII without the list separator's neighbours that a header cannot hold.
_TRACESTATE: Final = re.compile(r"[\x20-\x7e]*", re.ASCII)


class TraceContext(NamedTuple):
    """The trace context a message carries.

    Attributes:
        traceparent: the W3C ``traceparent`` string.
        tracestate: the W3C ``tracestate`` string, or ``None`` when there is none.
    """

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        """The 32 hex digits of the trace id."""
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        """The 16 hex digits of the parent (sending) span's id."""
        return self.traceparent[36:52]


def valid_traceparent(value: object) -> bool:
    """Whether ``value`` is a well-formed ``traceparent`` string.

    Args:
        value: anything (it may come from the network).

    Returns:
        ``True`` for a string of the W3C form; version ``00`` must be exactly 55
        characters, a later version at least that.
    """
    if type(value) is not str or not 55 <= len(value) <= 256:
        return False
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return False
    return match.group(1) != "00" or match.group(5) is None


def valid_tracestate(value: object) -> bool:
    """Whether ``value`` is an acceptable ``tracestate`` string (printable ASCII, at
    most :data:`MAX_TRACESTATE_CHARS` characters, not empty).

    Args:
        value: anything.

    Returns:
        The verdict. Its members are the vendors' business and are not parsed.
    """
    return (
        type(value) is str
        and 0 < len(value) <= MAX_TRACESTATE_CHARS
        and _TRACESTATE.fullmatch(value) is not None
    )


def parse_traceparent(value: str) -> tuple[int, int, int]:
    """Split a ``traceparent`` into numbers.

    Args:
        value: a string that passes :func:`valid_traceparent`.

    Returns:
        ``(trace_id, span_id, flags)`` as integers.

    Raises:
        ValueError: the string is not a valid ``traceparent``; say where it came from
            and pass one of the form ``00-<32 hex>-<16 hex>-<2 hex>``.
    """
    if not valid_traceparent(value):
        raise ValueError(
            f"{value!r} is not a W3C traceparent; expected 00-<32 hex trace id>-"
            f"<16 hex parent id>-<2 hex flags>, e.g. "
            f"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        )
    return int(value[3:35], 16), int(value[36:52], 16), int(value[53:55], 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """Build a version ``00`` ``traceparent``.

    Args:
        trace_id: non-zero 128-bit trace id.
        span_id: non-zero 64-bit span id.
        flags: the trace flags (bit 0: sampled).

    Returns:
        The 55-character string.

    Raises:
        ValueError: an id is zero or out of range.
    """
    if not (0 < trace_id < 1 << 128 and 0 < span_id < 1 << 64 and 0 <= flags < 256):
        raise ValueError("trace id and span id must be non-zero and in range")
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
