"""Task ids: minting, recognising and parsing ``urn:porter:task:<short-id>``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from porter_mesh.core.taskid import (
    MAX_SHORT_ID,
    TASK_ID_BITS,
    is_task_id,
    new_task_id,
    parse_task_id,
)
from porter_mesh.errors import ActivityError


def test_minted_ids_have_the_documented_form() -> None:
    for _ in range(200):
        value = new_task_id()
        assert re.fullmatch(r"urn:porter:task:[a-z2-7]{12}", value), value
        assert is_task_id(value)
        assert parse_task_id(value) == value.removeprefix("urn:porter:task:")
    assert TASK_ID_BITS == 12 * 5


def test_minted_ids_are_unique_and_use_the_whole_alphabet() -> None:
    ids = {new_task_id() for _ in range(20_000)}
    assert len(ids) == 20_000
    used = set("".join(i.removeprefix("urn:porter:task:") for i in ids))
    assert used == set("abcdefghijklmnopqrstuvwxyz234567")


@pytest.mark.parametrize(
    "value",
    [
        "urn:porter:task:a3f9",
        "urn:porter:task:b7c2",
        "urn:porter:task:X",
        "urn:porter:task:a-b_c",
        "urn:porter:task:" + "z" * MAX_SHORT_ID,
    ],
)
def test_valid_ids(value: str) -> None:
    assert is_task_id(value)
    assert parse_task_id(value) == value[len("urn:porter:task:") :]


@pytest.mark.parametrize(
    "value",
    [
        "",
        "a3f9",
        "urn:porter:task:",
        "urn:porter:task:a b",
        "urn:porter:task:a/b",
        "urn:porter:task:\u00e9t\u00e9",
        "urn:porter:task:a3f9\n",
        "URN:porter:task:a3f9",
        "urn:porter:task:" + "z" * (MAX_SHORT_ID + 1),
        "urn:porter:tasks:a3f9",
        None,
        42,
        b"x",
    ],
)
def test_invalid_ids(value: object) -> None:
    assert not is_task_id(value)
    with pytest.raises(ActivityError) as info:
        parse_task_id(value)
    error = info.value
    assert error.field == "context" and error.reason == "bad-task-id"
    assert "urn:porter:task:<short-id>" in str(error) and "new_task_id" in str(error)


@given(st.text(max_size=80))
def test_is_task_id_agrees_with_parse(value: str) -> None:
    candidate = "urn:porter:task:" + value
    if is_task_id(candidate):
        assert parse_task_id(candidate) == value
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value)
    else:
        with pytest.raises(ActivityError):
            parse_task_id(candidate)
