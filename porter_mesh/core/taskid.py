"""Task identifiers: ``urn:porter:task:<short-id>``.

The profile correlates every message about one task through ``context`` set to a task
URN. The admin (whoever sends the first ``Offer``) mints the id; everyone else copies it.

What counts as a valid short id is deliberately wider than what :func:`new_task_id`
produces, so ids minted by other implementations (the profile's own examples use four
hex digits, ``urn:porter:task:a3f9``) are accepted: 1 to 64 ASCII letters, digits,
``-`` or ``_``.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

from porter_mesh.core.constants import TASK_URN_PREFIX
from porter_mesh.errors import ActivityError

__all__ = ["MAX_SHORT_ID", "TASK_ID_BITS", "is_task_id", "new_task_id", "parse_task_id"]

#: Longest short id accepted (characters).
MAX_SHORT_ID: Final = 64

#: Random bits in a minted short id.
TASK_ID_BITS: Final = 60

_PREFIX_LEN: Final = len(TASK_URN_PREFIX)
_SHORT_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_SHORT_ID}}}")
_B32: Final = "abcdefghijklmnopqrstuvwxyz234567"
_EXPECTED: Final = (
    f'"{TASK_URN_PREFIX}<short-id>" where <short-id> is 1-{MAX_SHORT_ID} ASCII letters, '
    'digits, "-" or "_"'
)


def new_task_id() -> str:
    """Mint a fresh task id, ``urn:porter:task:`` followed by 12 base32 characters.

    The short id carries 60 random bits from :mod:`secrets`, written as 12 characters of
    lowercase RFC 4648 base32 (``a-z``, ``2-7``; no padding). By the birthday bound the
    chance that any two of ``n`` ids collide is about ``n**2 / 2**61``: one in 2.3
    million for a million tasks, and about one in 30,000 for a busy mesh minting 1,000
    tasks an hour for a year (8.8 million ids). Ids are never reused on purpose, so a
    collision would merge two task threads; at these odds that is accepted.

    Returns:
        The task URN, e.g. ``"urn:porter:task:k3v7qa2mxb5d"``.
    """
    bits = secrets.randbits(TASK_ID_BITS)
    chars = [_B32[(bits >> shift) & 31] for shift in range(TASK_ID_BITS - 5, -1, -5)]
    return TASK_URN_PREFIX + "".join(chars)


def is_task_id(value: object) -> bool:
    """Tell whether ``value`` is a well-formed task URN.

    Args:
        value: anything; only strings can be task ids.

    Returns:
        ``True`` for ``urn:porter:task:<short-id>`` with a valid short id.
    """
    if not isinstance(value, str) or not value.startswith(TASK_URN_PREFIX):
        return False
    short = value[_PREFIX_LEN:]
    # The common case (alphanumeric ids such as the minted ones) skips the regex.
    if 0 < len(short) <= MAX_SHORT_ID and short.isascii() and short.isalnum():
        return True
    return _SHORT_ID.fullmatch(short) is not None


def parse_task_id(value: object) -> str:
    """Return the short id of a task URN.

    Args:
        value: a task URN such as ``"urn:porter:task:a3f9"``.

    Returns:
        The short id (``"a3f9"``).

    Raises:
        ActivityError: ``value`` is not a well-formed task URN (``reason="bad-task-id"``,
            ``field="context"``).
    """
    if is_task_id(value):
        assert isinstance(value, str)
        return value[_PREFIX_LEN:]
    shown = repr(value) if not isinstance(value, str) else f'"{value[:80]}"'
    raise ActivityError(
        f"context: expected a task id {_EXPECTED}, got {shown}; "
        "mint one with porter_mesh.core.taskid.new_task_id()",
        field="context",
        expected=f"a task id {_EXPECTED}",
        reason="bad-task-id",
    )
