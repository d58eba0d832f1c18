"""The compiled hot path (``porter_mesh.core._speedups``) and the pure Python one do the
same work: every codec test of ``test_as2`` and ``test_as2_schema`` runs here again on
each path, then the tests below compare the two directly, refuse the same bad input
for the same counted reasons on both, and check what only the compiled path does (its
objects are off the garbage collector's list).

Where the extension is not built the compiled half skips, saying why; a machine with a
C compiler and the Python headers must have built it (the last test), so a broken build
cannot pass unnoticed.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson
import pytest

from porter_mesh.core import speedups
from porter_mesh.core.as2 import Activity, activities_from_json_array
from porter_mesh.core.as2.rules import _GOOD_CONTEXTS
from porter_mesh.core.as2.schema import _shape_of
from porter_mesh.core.constants import MAX_ACTIVITY_BYTES, MAX_BATCH, MAX_MESSAGE_BYTES
from porter_mesh.core.envelope import Envelope, decode_payload
from porter_mesh.core.profile_examples import PROFILE_EXAMPLES
from porter_mesh.errors import ActivityError, ProtocolError
from porter_mesh.node.inbox import Message
from tests.unit.test_as2 import *  # noqa: F403  (collected again here, once per path)
from tests.unit.test_as2_schema import *  # noqa: F403

PATHS = ("compiled", "pure")
ROOT = Path(__file__).resolve().parents[2]
ANNOUNCE: dict[str, Any] = PROFILE_EXAMPLES["Status announcement"]


def _switch(path: str) -> None:
    if path == "compiled" and not speedups.available():
        reason = ("the compiled extension is not built here (or PORTER_MESH_PURE is set); "
                  "build it with `pip install -e .`")
        print(f"skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    assert speedups.use_compiled(path == "compiled") == (path == "compiled")


@pytest.fixture(scope="module", autouse=True, params=PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test of this module, the imported ones included, runs on both paths."""
    was = speedups.in_use()
    _switch(request.param)
    yield request.param
    speedups.use_compiled(was)


def _on(path: str, fn: Any) -> Any:
    """``fn()`` on ``path``, the module's path restored afterwards."""
    was = speedups.in_use()
    _switch(path)
    try:
        return fn()
    finally:
        speedups.use_compiled(was)


def _slots(activity: Activity) -> tuple[Any, ...]:
    return tuple(getattr(activity, name, "<unset>") for name in ("_d", "_json", "_s", "_i"))


def test_both_paths_make_equal_activities() -> None:
    # The examples the C schema takes (a batch of them is wrapped by the extension);
    # the others go to the Python rules on both paths.
    examples = [d for d in PROFILE_EXAMPLES.values() if _shape_of(orjson.dumps(d))]
    assert len(examples) > 5
    raw = orjson.dumps(examples)
    made = {p: _on(p, lambda: activities_from_json_array(raw)) for p in PATHS}
    assert [_slots(a) for a in made["compiled"]] == [_slots(a) for a in made["pure"]]
    assert all(a._src is not None for a in made["compiled"])  # the batch, decoded when read
    assert [a.to_dict() for a in made["compiled"]] == examples
    assert made["compiled"] == made["pure"]
    built = {p: _on(p, lambda: [Activity.from_dict(d) for d in examples]) for p in PATHS}
    assert [_slots(a) for a in built["compiled"]] == [_slots(a) for a in built["pure"]]
    assert built["compiled"] == built["pure"] == made["pure"]
    assert [a.to_json() for a in built["compiled"]] == [orjson.dumps(d) for d in examples]


def test_the_compiled_path_leaves_activities_and_messages_off_the_collectors_list(
        path: str) -> None:
    received = activities_from_json_array(orjson.dumps([ANNOUNCE] * 8))
    built = Activity.from_dict(ANNOUNCE)
    compiled = path == "compiled"
    assert {gc.is_tracked(a) for a in [*received, built]} == {not compiled}
    if compiled:
        env = Envelope(1, "m.1", "pub", "log", 7, 5, 9, None, None, len(received))
        assert speedups.messages is not None
        msgs = speedups.messages(Message, "log", "pub", received, env, 7, False, -1, False)
        assert not any(gc.is_tracked(m) for m in msgs)
        # Freed by reference counting alone, with the collector off.
        gc.disable()
        try:
            batch = received[0]._src  # every activity of the batch holds it
            assert sys.getrefcount(batch) == 2 + len(received)
            del msgs, received
            assert sys.getrefcount(batch) == 2  # ours and the argument's: all freed
        finally:
            gc.enable()


def test_messages_are_the_tuples_the_inbox_builds() -> None:
    if not speedups.available():
        pytest.skip("the compiled extension is not built here")
    compiled = speedups._compiled
    assert compiled is not None
    acts = activities_from_json_array(orjson.dumps([ANNOUNCE] * 8))
    env = Envelope(1, "m.1", "pub", "log", 40, 5, 9, None, None, len(acts))
    for offset, redelivered in ((-1, False), (0, False), (12, True)):
        got = compiled.messages(Message, "log", "pub", acts, env, 40, True, offset, redelivered)
        want = [Message("log", "pub", a, env, 40 + i, True,
                        offset + i if offset >= 0 else -1, redelivered)
                for i, a in enumerate(acts)]
        assert got == want and all(type(m) is Message for m in got)
        assert [hash(m) for m in got] == [hash(m) for m in want]
        assert got[0].activity is acts[0] and got[-1].seq == 40 + len(acts) - 1
    assert compiled.messages(Message, "log", "pub", [], env, 1, False, -1, False) == []
    for bad in ((dict, "log", "pub", acts, env, 1, False, -1, False),    # not a tuple class
                (Message, "log", "pub", tuple(acts), env, 1, False, -1, False),  # not a list
                (Message, "log", "pub", acts, env, "1", False, -1, False)):  # seq not an int
        with pytest.raises(TypeError):
            compiled.messages(*bad)
    with pytest.raises(TypeError):
        compiled.wrap_shapes((), None)


def _refusal(fn: Any) -> tuple[type[BaseException], str | None, str]:
    try:
        fn()
    except (ActivityError, ProtocolError) as exc:
        return type(exc), exc.reason, str(exc)
    raise AssertionError("accepted what must be refused")


BAD_CONTEXT = {**ANNOUNCE, "context": "urn:porter:task:"}
TOO_BIG = {**ANNOUNCE, "content": "x" * MAX_ACTIVITY_BYTES}


@pytest.mark.parametrize("payload, count, reason", [
    (orjson.dumps([ANNOUNCE] * 3)[:-9] + b"]", 3, "bad-json"),       # malformed batch
    (b'{"type": "Announce"}', 2, "not-an-object"),                   # not an array
    (b"[1,1,1,2]", 4, "not-an-object"),                              # elements not objects
    (orjson.dumps([ANNOUNCE, {"type": "Announce", "actor": "a"}]), 2, "missing-field"),
    (orjson.dumps([ANNOUNCE, BAD_CONTEXT]), 2, "bad-task-id"),       # a bad task context
    (orjson.dumps([ANNOUNCE] * 3), 2, "bad-count"),                  # count and array differ
    (orjson.dumps([ANNOUNCE] * (MAX_BATCH + 1)), MAX_BATCH, "too-many"),
    (orjson.dumps([TOO_BIG, ANNOUNCE]), 2, "too-large"),             # an oversized element
    (b"[" + b" " * MAX_MESSAGE_BYTES + b"]", 2, "too-large"),        # an oversized batch
])
def test_bad_input_is_refused_for_the_same_reason_on_both_paths(
        payload: bytes, count: int, reason: str) -> None:
    """What a node counts (``dropped.<reason>``) is the reason of this refusal."""
    refused = {p: _on(p, lambda: _refusal(lambda: decode_payload(payload, count)))
               for p in PATHS}
    assert refused["compiled"] == refused["pure"]
    assert refused["pure"][1] == reason


class _Exploding(Mapping[str, Any]):
    """A mapping value that fails when JSON asks for its items."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("this mapping cannot be read")

    def __len__(self) -> int:
        return 1


class _Sub(Activity):
    __slots__ = ()


def _outcome(fn: Any) -> tuple[Any, ...]:
    """What ``fn()`` made (its slots and JSON) or raised (type, reason, text)."""
    try:
        made = fn()
    except Exception as exc:  # both paths must raise the same
        return ("raised", type(exc), getattr(exc, "reason", None), str(exc))
    return ("made", type(made), _slots(made)[:3], made.to_json())


def test_from_dict_is_one_c_call_on_the_compiled_path_and_agrees_with_python(
        path: str) -> None:
    method = Activity.__dict__["from_dict"].__func__
    compiled = speedups._compiled
    assert (method is compiled.from_dict) if path == "compiled" and compiled else (
        method.__module__ == Activity.__module__)
    loop: dict[str, Any] = {**ANNOUNCE}
    loop["object"] = loop
    cases: list[Any] = [
        *PROFILE_EXAMPLES.values(),  # the C schema's shapes and those only the rules take
        MappingProxyType(ANNOUNCE),  # a mapping, not a dict: the Python method
        {**ANNOUNCE, "tag": ("a", "b")},  # a tuple becomes an array
        {**ANNOUNCE, "object": MappingProxyType(ANNOUNCE["object"])},  # via default=
        {**ANNOUNCE, "summary": ""},  # refused by the C schema and by the rules
        BAD_CONTEXT, TOO_BIG, {"type": "Announce", "actor": "a"},
        {**ANNOUNCE, "tag": {"a"}},  # a set: not JSON
        {1: "x"},  # a key JSON cannot hold
        loop,  # too deep
        {**ANNOUNCE, "object": _Exploding()},  # default= raises
        ["not", "a", "mapping"],
    ]
    got = {p: [_on(p, lambda c=c: _outcome(lambda: Activity.from_dict(c))) for c in cases]
           for p in PATHS}
    assert got["compiled"] == got["pure"]
    for p in PATHS:
        # A context never seen before: the Python rule checks it, then the C schema's
        # shape is kept, on each path.
        new = {**ANNOUNCE, "context": f"urn:porter:task:{p}{os.getpid():x}{id(cases):x}"}
        assert new["context"] not in _GOOD_CONTEXTS
        made = _on(p, lambda: Activity.from_dict(new))  # noqa: B023
        assert made._s is not None and made.to_json() == orjson.dumps(new)
        assert new["context"] in _GOOD_CONTEXTS
    kinds = [o[0] for o in got["pure"]]
    assert kinds.count("made") == len(PROFILE_EXAMPLES) + 3
    # Some examples are of shapes only the rules take (the C function hands them over).
    assert any(_shape_of(orjson.dumps(d)) is None for d in PROFILE_EXAMPLES.values())
    assert {o[1] for o in got["pure"] if o[0] == "raised"} == {ActivityError}
    # Called on a subclass, the compiled function hands over to the Python method.
    sub = {p: _on(p, lambda: _outcome(lambda: _Sub.from_dict(ANNOUNCE))) for p in PATHS}
    assert sub["compiled"] == sub["pure"]


def test_pure_env_switches_the_extension_off() -> None:
    code = ("from porter_mesh.core import speedups; "
            "from porter_mesh.core.as2 import Activity; "
            "print(speedups.available(), speedups.in_use())")
    env = {**os.environ, "PYTHONPATH": str(ROOT), speedups.PURE_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_extension_is_built_where_a_compiler_is() -> None:
    """An install with gcc and the Python headers builds the extension; a failed build
    would otherwise only show as a warning in pip's output and a slower node."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which("gcc") is None or not headers.exists():
        reason = "no gcc or no Python headers here: the pure Python path is expected"
        print(f"skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    if os.environ.get(speedups.PURE_ENV, "") not in ("", "0"):
        pytest.skip(f"{speedups.PURE_ENV} is set")
    installed = _installed_from()
    if installed != ROOT.as_uri():
        # A checkout run through PYTHONPATH beside another one's install was not built
        # by an install: only an install says whether the build works.
        reason = (f"porter-mesh is installed from {installed}, not from this checkout, "
                  "so no install built the extension here")
        print(f"skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    assert speedups.available(), (
        "porter_mesh.core._speedups is not built: run `pip install -e .` (setup.py builds it) "
        "and read the compiler's error in its output")


def _installed_from() -> str | None:
    """Where the installed porter-mesh comes from (a ``file:`` URL), if pip says (the
    build's ``porter_mesh.egg-info`` in the checkout, also on the path, does not)."""
    for dist in metadata.distributions(name="porter-mesh"):
        raw = dist.read_text("direct_url.json")
        url = json.loads(raw).get("url") if raw else None
        if isinstance(url, str):
            return url
    return None
