"""``porter-mesh validate`` and ``porter-mesh examples``, run as real processes."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import orjson

from porter_mesh.core.profile_examples import PROFILE_EXAMPLES

DATA = pathlib.Path(__file__).resolve().parent.parent / "data" / "profile_examples.json"


def porter(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "porter_mesh.cli.main", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_validate_the_examples_file() -> None:
    done = porter("validate", str(DATA))
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    lines = done.stdout.splitlines()
    assert lines == [orjson.dumps(example) for example in PROFILE_EXAMPLES.values()]


def test_validate_jsonl_reports_each_bad_line(tmp_path: pathlib.Path) -> None:
    good = orjson.dumps(PROFILE_EXAMPLES["Worker accepts"])
    bad_item = orjson.dumps(
        {
            "type": "Create",
            "actor": "w",
            "summary": "s",
            "object": {"type": "Collection", "items": [1]},
        }
    )
    spaced = b'  {"type": "Accept",  "actor": "w", "summary": "ok"}  '
    text = b"\n".join([good, b"", bad_item, b"just some text", b"[1, 2]", spaced, b""])
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(text)
    done = porter("validate", str(path))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [good, b'{"type":"Accept","actor":"w","summary":"ok"}']
    errors = done.stderr.decode().splitlines()
    assert errors[0] == (
        'line 3: object.items[0]: expected an object with a "type", or a string, got a number'
    )
    assert errors[1].startswith("line 4: not valid JSON (")
    assert "strict" in errors[1]
    assert errors[2].startswith("line 5: expected a JSON object, got an array")
    assert len(errors) == 3


def test_validate_reads_stdin_and_single_documents() -> None:
    pretty = orjson.dumps(PROFILE_EXAMPLES["Worker creates files"], option=orjson.OPT_INDENT_2)
    done = porter("validate", stdin=b"\n\n" + pretty)
    assert done.returncode == 0, done.stderr
    assert done.stdout == orjson.dumps(PROFILE_EXAMPLES["Worker creates files"]) + b"\n"

    broken = b'\n{\n  "type": "Offer",\n  "actor": "a"\n}\n'
    done = porter("validate", "-", stdin=broken)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().startswith("line 2: summary: expected a non-empty string")

    array = orjson.dumps([PROFILE_EXAMPLES["Worker accepts"], {"type": "Offer"}, 7])
    done = porter("validate", "-q", stdin=array)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        "item [1]: actor: expected a non-empty string (the sending agent's name), "
        "got nothing (the field is missing)",
        "item [2]: expected a JSON object, got a number; an activity is an object such as "
        '{"type": "Note", "actor": ..., "summary": ...}',
    ]


def test_validate_garbage_and_empty_input() -> None:
    done = porter("validate", stdin=b"\x00\xff\xfe garbage\n\x89PNG\r\n")
    assert done.returncode == 1 and done.stdout == b""
    assert [line.split(":")[0] for line in done.stderr.decode().splitlines()] == [
        "line 1",
        "line 2",
    ]
    done = porter("validate", stdin=b"\n  \n")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


def test_validate_unreadable_file(tmp_path: pathlib.Path) -> None:
    done = porter("validate", str(tmp_path / "missing.jsonl"))
    assert done.returncode == 2
    message = done.stderr.decode()
    assert "cannot read" in message and "missing.jsonl" in message and "check the path" in message
    done = porter("validate", str(tmp_path))
    assert done.returncode == 2 and "cannot read" in done.stderr.decode()


def test_validate_help_documents_strictness() -> None:
    done = porter("validate", "--help")
    assert done.returncode == 0
    assert b"strict" in done.stdout and b"fallback" in done.stdout


def test_examples_command() -> None:
    done = porter("examples")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    headings = [line for line in text.splitlines() if line.startswith("# ")]
    assert len(headings) == len(PROFILE_EXAMPLES)
    assert (
        "# Admin assigns a task: Offer architect -> worker-backend [urn:porter:task:a3f9] "
        "Add GET /users endpoint"
    ) in headings
    assert '  {\n    "type": "Offer",\n    "actor": "architect",' in text

    only = porter("examples", "approves")
    assert only.returncode == 0
    assert only.stdout.decode().splitlines()[0] == (
        "# Reviewer approves: Accept reviewer [urn:porter:task:a3f9] "
        "LGTM -- validation and tests look good"
    )
    none = porter("examples", "no-such-example")
    assert none.returncode == 2 and b"Worker accepts" in none.stderr


def test_examples_json_feeds_validate() -> None:
    listed = porter("examples", "--json")
    assert listed.returncode == 0
    assert orjson.loads(listed.stdout) == orjson.loads(DATA.read_bytes())
    checked = porter("validate", stdin=listed.stdout)
    assert checked.returncode == 0, checked.stderr
    assert len(checked.stdout.splitlines()) == len(PROFILE_EXAMPLES)
