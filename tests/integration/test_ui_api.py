"""The dashboard's API as a browser or script uses it: ``porter-mesh ui`` as a real
process, real agents on the mesh, aiohttp's client over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from tests.integration.harness import NodeProcess

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

BURST = Path(__file__).with_name("ui_burst_proc.py")
_ids = itertools.count()
T = TypeVar("T")


class LineProcess:
    """A child process whose stdout lines are collected by a thread (stderr kept too)."""

    def __init__(self, cmd: list[str], name: str) -> None:
        self.name = name
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self._err: list[bytes] = []
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode(errors="replace")[-3000:]

    def wait_line(self, pred: Callable[[bytes], bool], timeout: float, what: str) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no {what} within {timeout}s; {self.stderr}")
            try:
                line = self.lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"{self.name} exited (rc={self.proc.wait(5)}) before "
                                     f"{what}; stderr: {self.stderr}")
            if pred(line):
                return line

    def write(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        for t in self._threads:
            t.join(5)
        return self.proc.returncode


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "porter_mesh.cli.main", *args]


class UI(LineProcess):
    """``porter-mesh ui --port 0`` and the address it printed."""

    def __init__(self, mesh: str, data_dir: Path, *extra: str) -> None:
        super().__init__(cli("ui", "--port", "0", "--mesh", mesh, "--data-dir", str(data_dir),
                             *extra), "porter-ui")
        line = self.wait_line(lambda b: b.startswith(b"porter-ui: open "), 30, "URL").decode()
        self.url = line.split("open ", 1)[1].strip()
        parts = urlsplit(self.url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.netloc = parts.netloc
        self.token = parts.query.removeprefix("token=")
        self.auth = {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def mesh() -> str:
    return f"ui{os.getpid()}-{next(_ids)}"


@pytest.fixture
def worker(mesh: str, tmp_path: Path, ui: UI) -> Iterator[LineProcess]:
    proc = LineProcess(cli("agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace",
                           str(tmp_path / "ws"), "--data-dir", str(tmp_path / "w1")), "w1")
    try:
        yield proc
    finally:
        proc.stop()


def run(coro_fn: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
    async def main() -> T:
        async with aiohttp.ClientSession() as session:
            return await coro_fn(session)
    return asyncio.run(main())


async def get(session: aiohttp.ClientSession, ui: UI, path: str) -> Any:
    async with session.get(ui.base + path, headers=ui.auth) as resp:
        assert resp.status == 200, (path, resp.status, await resp.text())
        return await resp.json()


async def post(session: aiohttp.ClientSession, ui: UI, path: str, body: dict[str, Any],
               status: int = 200) -> Any:
    async with session.post(ui.base + path, json=body, headers=ui.auth) as resp:
        data = await resp.json()
        assert resp.status == status, (path, body, resp.status, data)
        return data


async def until(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """Poll ``check`` until it returns something truthy (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not seen within {timeout}s (last: {last!r})")


async def events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str | None, Any]]:
    """Server-sent events as (event, id, decoded data)."""
    name, event_id, data = "message", None, []
    while True:
        raw = await resp.content.readline()
        if not raw:
            return
        line = raw.decode().rstrip("\n")
        if not line:
            if data:
                yield name, event_id, orjson.loads("\n".join(data))
            name, event_id, data = "message", None, []
        elif line.startswith(":") or line.startswith("retry:"):
            continue
        else:
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "id":
                event_id = value
            elif field == "data":
                data.append(value)


class Stream:
    """A background reader of ``/api/stream`` that keeps every event."""

    def __init__(self, session: aiohttp.ClientSession, ui: UI, headers: dict[str, str]
                 | None = None) -> None:
        self.session, self.ui = session, ui
        self.headers = {**ui.auth, **(headers or {})}
        self.got: list[tuple[str, str | None, Any]] = []
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stream:
        self._resp = await self.session.get(self.ui.base + "/api/stream", headers=self.headers,
                                            timeout=aiohttp.ClientTimeout(total=None))
        assert self._resp.status == 200
        assert self._resp.headers["Content-Type"].startswith("text/event-stream")
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        async for item in events(self._resp):
            self.got.append(item)
            self.changed.set()

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self._resp.close()

    def records(self) -> list[dict[str, Any]]:
        return [r for name, _, data in self.got if name == "messages" for r in data]

    async def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"stream: {what} not within {timeout}s; "
                                     f"{len(self.got)} events")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


# ---------------------------------------------------------------------------- security


def test_token_host_origin_and_methods(ui: UI) -> None:
    async def body(session: aiohttp.ClientSession) -> None:
        base = ui.base
        async with session.get(base + "/api/peers") as resp:
            assert resp.status == 401
            assert (await resp.json())["error"] == "token"
        async with session.get(base + "/api/peers",
                               headers={"Authorization": "Bearer wrong-token"}) as resp:
            assert resp.status == 401
        async with session.get(base + "/api/stream") as resp:
            assert resp.status == 401
        peers = await get(session, ui, "/api/peers")
        assert peers["self"] == "porter-ui" and isinstance(peers["peers"], list)
        async with session.get(base + "/") as resp:
            assert resp.status == 401 and "token" in await resp.text()
        async with session.get(base + "/?token=wrong-token", allow_redirects=False) as resp:
            assert resp.status == 401
        # The cookie flow, in a session of its own (a browser).
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.get(f"{base}/?token={ui.token}", allow_redirects=False) as resp:
                assert resp.status == 302 and resp.headers["Location"] == "/"
                cookie = resp.headers["Set-Cookie"]
                assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
            async with browser.get(base + "/api/peers") as resp:
                assert resp.status == 200
            async with browser.get(base + "/") as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
        # DNS rebinding: a foreign Host is refused even with the token.
        for host in ("evil.example", f"evil.example:{ui.netloc.rsplit(':', 1)[1]}"):
            async with session.get(base + "/api/peers", headers={**ui.auth, "Host": host}) as r:
                assert r.status == 403 and (await r.json())["error"] == "host"
        async with session.get(base + "/", headers={"Host": "evil.example"}) as resp:
            assert resp.status == 403
        # Cross-site POSTs are refused; the page's own origin and scripts are not.
        note = {"channel": "log", "text": "hello from the test"}
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            async with session.post(base + "/api/send", json=note,
                                    headers={**ui.auth, **headers}) as resp:
                assert resp.status == 403, headers
                assert (await resp.json())["error"] == "origin"
        async with session.post(base + "/api/send", json=note,
                                headers={**ui.auth, "Origin": ui.base}) as resp:
            assert resp.status == 200, await resp.text()
        # State changes are POST only; errors are JSON with a reason.
        for path in ("/api/send", "/api/control", "/api/recall", "/api/remember"):
            async with session.get(base + path, headers=ui.auth) as resp:
                assert resp.status == 405, path
                error = await resp.json()
                assert error["error"] == "method-not-allowed" and "POST" in error["reason"]
        async with session.post(base + "/api/peers", json={}, headers=ui.auth) as resp:
            assert resp.status == 405
        async with session.get(base + "/api/nothing", headers=ui.auth) as resp:
            assert resp.status == 404 and "reason" in await resp.json()
        async with session.post(base + "/api/send", data=b"channel=log",
                                headers={**ui.auth, "Content-Type": "text/plain"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"] == "content-type"
        async with session.post(base + "/api/send", data=b"{not json",
                                headers={**ui.auth, "Content-Type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["error"] == "json"
        big = {"channel": "log", "text": "x" * (300 * 1024)}
        async with session.post(base + "/api/send", json=big, headers=ui.auth) as resp:
            assert resp.status == 413 and "reason" in await resp.json()
        for bad, code in (({"channel": "log"}, "field"),
                          ({"channel": "control", "text": "halt"}, "message"),
                          ({"channel": "log", "text": "x", "type": "Delete"}, "type"),
                          ({"channel": "nowhere", "text": "x"}, "message"),
                          ({"channel": "log", "text": 5}, "field")):
            assert (await post(session, ui, "/api/send", bad, 400))["error"] == code
        missing = await post(session, ui, "/api/send", {"channel": "@nobody", "text": "hi"}, 404)
        assert missing["error"] == "agent" and "nobody" in missing["reason"]
        assert (await post(session, ui, "/api/control", {"kind": "reboot"}, 400))["error"]
        assert (await post(session, ui, "/api/control", {"kind": "drain", "to": "nobody"},
                           404))["error"] == "agent"
        async with session.get(base + "/api/messages?limit=0", headers=ui.auth) as resp:
            assert resp.status == 400
        async with session.get(base + "/api/messages?before=nope", headers=ui.auth) as resp:
            assert resp.status == 404
        info = await get(session, ui, "/api/info")
        assert info["name"] == "porter-ui" and "porter.chapeaux.io/vocab#about" in info["query"]

    run(body)


# ---------------------------------------------------------------------------- with an agent


async def inbox_reply(session: aiohttp.ClientSession, ui: UI, context: str,
                      kind: str) -> dict[str, Any] | None:
    page = await get(session, ui, f"/api/messages?inbox=1&context={context}")
    return next((m for m in page["messages"] if m["type"] == kind), None)


async def task_card(session: aiohttp.ClientSession, ui: UI, context: str,
                    pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    tasks = (await get(session, ui, "/api/tasks"))["tasks"]
    return next((t for t in tasks if t["context"] == context and pred(t)), None)


async def peer_state(session: aiohttp.ClientSession, ui: UI, name: str) -> str | None:
    peers = (await get(session, ui, "/api/peers"))["peers"]
    return next((p["state"] for p in peers if p["name"] == name), None)


def test_every_answer_says_no_referrer(ui: UI) -> None:
    """The page is opened with the token in its URL: no answer, error or file may let a
    browser pass that URL on as a Referer (to a link's site, say)."""
    async def body(session: aiohttp.ClientSession) -> None:
        base, auth = ui.base, ui.auth
        requests: list[tuple[str, str, dict[str, str], int]] = [
            ("GET", f"/?token={ui.token}", {}, 302),
            ("GET", "/?token=wrong-token", {}, 401),
            ("GET", "/", auth, 200),
            ("GET", "/static/app.js", {}, 200),
            ("GET", "/static/no-such-file.js", {}, 404),
            ("GET", "/no-such-page", {}, 404),
            ("GET", "/api/peers", {}, 401),
            ("GET", "/api/peers", auth, 200),
            ("GET", "/api/no-such-route", auth, 404),
            ("GET", "/api/send", auth, 405),
            ("GET", "/api/peers", {**auth, "Host": "evil.example"}, 403),
            ("POST", "/api/send", {**auth, "Origin": "http://evil.example"}, 403),
        ]
        for method, path, headers, status in requests:
            async with session.request(method, base + path, headers=headers,
                                       allow_redirects=False) as resp:
                assert resp.status == status, (method, path, resp.status)
                assert resp.headers.get("Referrer-Policy") == "no-referrer", (method, path)
        async with session.get(base + "/api/stream", headers=auth) as resp:
            assert resp.status == 200
            assert resp.headers.get("Referrer-Policy") == "no-referrer"
    run(body)


def test_offer_reply_review_and_control(ui: UI, worker: LineProcess) -> None:
    async def body(session: aiohttp.ClientSession) -> None:
        w1 = await until(lambda: _peer(session, ui, "w1"), 30, "w1 on the roster")
        assert w1["role"] == "worker" and w1["state"] == "alive" and w1["slots"] == 1
        assert w1["incarnation"] and w1["address"].startswith("127.0.0.1:")
        async with Stream(session, ui) as stream:
            sent = await post(session, ui, "/api/send", {
                "channel": "@w1", "type": "Offer", "text": "Add GET /users endpoint\n"
                "Return a page of users as JSON."})
            context = sent["context"]
            assert context.startswith("urn:porter:task:")
            offer = sent["record"]
            assert offer["direct"] and offer["recipient"] == "w1" and offer["type"] == "Offer"
            reply = await until(lambda: inbox_reply(session, ui, context, "Accept"), 30,
                                "w1's Accept in the inbox")
            assert reply["sender"] == "w1" and reply["inbox"] and reply["direct"]
            assert reply["recipient"] == "porter-ui" and reply["channel"] == "task:porter-ui"
            # The worker asks for review on 'review'; the task was the human's, so the card
            # waits for the human.
            card = await until(lambda: task_card(session, ui, context,
                                                 lambda t: t["review"] is not None), 30,
                               "the review request on the card")
            assert card["state"] == "in-review" and card["holder"] == "w1"
            assert card["review"]["from"] == "w1" and card["offered_by"] == "porter-ui"
            no_reason = await post(session, ui, "/api/review",
                                   {"context": context, "decision": "reject"}, 400)
            assert no_reason["error"] == "reason"
            await post(session, ui, "/api/review", {
                "context": context, "decision": "reject",
                "reason": "Missing input validation on pagination params"})
            # The worker fixes it and asks again; the human approves from the card.
            await until(lambda: task_card(session, ui, context, lambda t: t["review"]
                                          is not None and t["state"] == "in-review"
                                          and "changes-requested" in
                                          [s["state"] for s in t["path"]]), 30,
                        "the second review request")
            await post(session, ui, "/api/review", {"context": context, "decision": "approve"})
            done = await until(lambda: task_card(session, ui, context,
                                                 lambda t: t["state"] == "completed"), 10,
                               "completed")
            assert [s["state"] for s in done["path"]] == [
                "submitted", "working", "in-review", "changes-requested", "working",
                "in-review", "completed"]
            assert (await post(session, ui, "/api/review",
                               {"context": context, "decision": "approve"}, 409))
            # The worker's closing Announce; every record of the task came on the stream.
            await until(lambda: _find(session, ui, context, "Announce", "w1"), 30,
                        "the worker's closing Announce")
            page = await get(session, ui, f"/api/messages?context={context}")
            ids = [m["id"] for m in page["messages"]]
            await stream.wait(lambda: set(ids) <= {r["id"] for r in stream.records()}, 10,
                              "the task's records")
            assert len(ids) == len(set(ids))
            # The worker's copy of the dashboard's own direct Offer is not a second record.
            assert [m["type"] for m in page["messages"] if m["sender"] == "porter-ui"] == [
                "Offer", "Reject", "Accept"]
            names = {name for name, _, _ in stream.got}
            assert {"messages", "peers", "tasks"} <= names
            streamed_tasks = [t for name, _, data in stream.got if name == "tasks" for t in data]
            assert any(t["context"] == context and t["state"] == "completed"
                       for t in streamed_tasks)
            # The worker's finding reached the dashboard's replica.
            rows = await until(lambda: _recall_rows(session, ui), 30, "w1's finding")
            assert any(about == "api-design" for about, _ in rows)
        # Control: drain shows on the roster; halt ends the agent, which leaves the roster.
        await post(session, ui, "/api/control", {"kind": "drain", "to": "w1"})
        await until(lambda: _state_is(session, ui, "w1", "draining"), 15, "w1 draining")
        await post(session, ui, "/api/control", {"kind": "halt", "to": "w1"})
        assert await asyncio.to_thread(worker.proc.wait, 20) == 0
        # Its goodbye is one best-effort broadcast on the way out (a loaded machine may
        # close the socket first): without it the dashboard expires the agent instead.
        await until(lambda: _gone(session, ui, "w1"), 30, "w1 gone")

    run(body)


async def _peer(session: aiohttp.ClientSession, ui: UI, name: str) -> dict[str, Any] | None:
    peers = (await get(session, ui, "/api/peers"))["peers"]
    return next((p for p in peers if p["name"] == name), None)


async def _state_is(session: aiohttp.ClientSession, ui: UI, name: str, state: str) -> bool:
    return await peer_state(session, ui, name) == state


async def _gone(session: aiohttp.ClientSession, ui: UI, name: str) -> bool:
    return await peer_state(session, ui, name) in ("left", "expired")


async def _find(session: aiohttp.ClientSession, ui: UI, context: str, kind: str,
                sender: str) -> dict[str, Any] | None:
    page = await get(session, ui, f"/api/messages?context={context}&type={kind}&agent={sender}")
    return next((m for m in page["messages"] if m["sender"] == sender), None)


async def _recall_rows(session: aiohttp.ClientSession, ui: UI) -> list[list[str]] | None:
    info = await get(session, ui, "/api/info")
    result = await post(session, ui, "/api/recall", {"query": info["query"]})
    assert result["columns"] == ["about", "finding"]
    return result["rows"] or None


# ---------------------------------------------------------------------------- knowledge


def test_recall_remember_and_refusals(ui: UI) -> None:
    async def body(session: aiohttp.ClientSession) -> None:
        saved = await post(session, ui, "/api/remember", {
            "about": "urn:porter:file:server.ts", "finding": "depends on <express> & \"http\"",
            "context": "urn:porter:task:k1"})
        assert saved["ok"] and saved["id"].startswith("urn:porter:obs:")
        known = await get(session, ui, "/api/knowledge?limit=10")
        obs = known["observations"]
        assert [o["finding"] for o in obs] == ["depends on <express> & \"http\""]
        assert obs[0]["by"] == "porter-ui" and obs[0]["context"] == "urn:porter:task:k1"
        assert obs[0]["id"] == saved["id"] and known["size"] >= 5
        rows = await _recall_rows(session, ui)
        assert rows == [["urn:porter:file:server.ts", "depends on <express> & \"http\""]]
        refused = {
            "SELECT * WHERE { SERVICE <http://127.0.0.1:9/> { ?s ?p ?o } }": "SERVICE",
            "LOAD <http://127.0.0.1:9/data.ttl>": "LOAD",
            "INSERT DATA { <urn:a> <urn:b> <urn:c> }": "",
            "SELECT ?x WHERE { ?x ": "",
        }
        for query, word in refused.items():
            error = await post(session, ui, "/api/recall", {"query": query}, 400)
            assert error["error"] == "query" and word in error["reason"], error
        # The remembered fact also went out on log, and is in the timeline.
        page = await get(session, ui, "/api/messages?type=Remember")
        assert [m["sender"] for m in page["messages"]] == ["porter-ui"]
        assert (await post(session, ui, "/api/remember", {"about": "x"}, 400))["error"]

    run(body)


# ---------------------------------------------------------------------------- history


def test_history_survives_a_restart(mesh: str, tmp_path: Path) -> None:
    data = tmp_path / "ui-data"
    first = UI(mesh, data)
    try:
        async def before(session: aiohttp.ClientSession) -> dict[str, Any]:
            for i in range(30):
                await post(session, first, "/api/send", {"channel": "log", "text": f"note {i}"})
            offer = await post(session, first, "/api/send",
                               {"channel": "task", "type": "Offer", "text": "Anyone: tidy up"})
            page = await get(session, first, "/api/messages?limit=1000")
            assert len(page["messages"]) == 31
            return offer
        offer = run(before)
    finally:
        assert first.stop() == 0, first.stderr
    second = UI(mesh, data)
    try:
        async def after(session: aiohttp.ClientSession) -> None:
            page = await get(session, second, "/api/messages?limit=10")
            assert page["more"] and page["messages"][-1]["id"] == offer["record"]["id"]
            older = await get(session, second,
                              f"/api/messages?limit=1000&before={page['messages'][0]['id']}")
            texts = [m["summary"] for m in older["messages"] + page["messages"]]
            assert texts == [f"note {i}" for i in range(30)] + ["Anyone: tidy up"]
            tasks = (await get(session, second, "/api/tasks"))["tasks"]
            assert [(t["context"], t["state"]) for t in tasks] == [(offer["context"], "submitted")]
            # A stream resumed after an old id gets the gap from the log.
            every = older["messages"] + page["messages"]
            resume = {"Last-Event-ID": every[-4]["id"]}
            async with Stream(session, second, resume) as stream:
                await stream.wait(lambda: len(stream.records()) >= 3, 10, "the gap")
                assert [r["summary"] for r in stream.records()] == [
                    "note 28", "note 29", "Anyone: tidy up"]
        run(after)
    finally:
        assert second.stop() == 0, second.stderr


# ---------------------------------------------------------------------------- load


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``path`` for the test (skips unless root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file into ``directory`` until its file system is full; return it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(4096):  # bounded: 4096 x 4 KiB, more than the tmpfs holds
            os.write(fd, b"x" * 4096)
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_keeps_the_dashboard_serving_and_loses_nothing(mesh: str,
                                                                  tmp_path: Path) -> None:
    """The message log's file system fills up while the user sends notes: every send is
    answered, the page keeps serving them from memory, the API says the log is failing
    (with the free space), stderr says it once; when space returns the log catches up,
    every note on disk exactly once, no line torn."""
    data = tmp_path / "ui-data"
    with tiny_tmpfs(data / "ui"):
        ui = UI(mesh, data)
        try:
            async def body(session: aiohttp.ClientSession) -> None:
                await post(session, ui, "/api/send", {"channel": "log", "text": "before"})
                log_file = data / "ui" / "messages.jsonl"
                await until(async_true(lambda: log_file.exists()
                                       and b"before" in log_file.read_bytes()), 10,
                            "the first note on disk")
                filler = fill(data / "ui")
                texts = [f"while full {i}" for i in range(20)]
                for text in texts:
                    await post(session, ui, "/api/send", {"channel": "log", "text": text})

                async def failing() -> dict[str, Any] | None:
                    health = (await get(session, ui, "/api/peers"))["log"]
                    return health if not health["ok"] and health["failures"] >= 2 else None
                health = await until(failing, 10, "the log reported failing, twice")
                assert health["path"] == str(log_file) and health["unwritten"] >= 1
                assert "No space left" in health["error"] and health["free_bytes"] < 4096
                # The page works from memory meanwhile.
                page = await get(session, ui, "/api/messages?limit=100")
                assert [m["summary"] for m in page["messages"]] == ["before", *texts]

                filler.unlink()  # space returns

                async def healed() -> dict[str, Any] | None:
                    health = (await get(session, ui, "/api/peers"))["log"]
                    return health if health["ok"] and health["unwritten"] == 0 else None
                await until(healed, 10, "the log written again")
                lines = log_file.read_bytes().splitlines()
                summaries = [orjson.loads(line)["summary"] for line in lines]  # none torn
                assert summaries == ["before", *texts]
            run(body)
        finally:
            assert ui.stop() == 0, ui.stderr
    errors = [line for line in ui.stderr.splitlines() if "cannot write" in line]
    assert len(errors) == 1 and "free there" in errors[0], ui.stderr
    assert "is written again" in ui.stderr


def async_true(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def run_check() -> bool:
        return check()
    return run_check


def test_a_burst_arrives_whole_in_batches(ui: UI, mesh: str) -> None:
    rate, seconds = 1000, 3.0
    burst = LineProcess([sys.executable, str(BURST), "--mesh", mesh, "--rate", str(rate),
                         "--seconds", str(seconds)], "burst")
    try:
        burst.wait_line(lambda b: b"ready" in b, 30, "burst ready")

        async def body(session: aiohttp.ClientSession) -> None:
            async with Stream(session, ui) as stream:
                burst.write(b"go\n")
                total = int(rate * seconds)

                def mine() -> list[dict[str, Any]]:
                    return [r for r in stream.records() if r["sender"] == "burst"
                            and r["summary"].startswith("burst ")]
                await stream.wait(lambda: len(mine()) >= total, 60, f"{total} records")
                records = mine()
                assert len({r["id"] for r in records}) == total == len(records)
                assert [r["summary"] for r in records] == [f"burst {i}" for i in range(total)]
                batches = [data for name, _, data in stream.got if name == "messages"
                           and any(r["sender"] == "burst" for r in data)]
                # About ten events a second, never one per record.
                assert 3 <= len(batches) <= total / 10, len(batches)
                print(f"{total} records in {len(batches)} events")
            page = await get(session, ui, "/api/messages?agent=burst&limit=1000")
            assert len(page["messages"]) == 1000 and page["more"]
            assert page["messages"][-1]["summary"] == f"burst {total - 1}"

        run(body)
        line = burst.wait_line(lambda b: b"done" in b, 30, "burst done")
        assert orjson.loads(line)["sent"] == int(rate * seconds)
    finally:
        burst.stop()


def test_user_mistakes_are_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = [
        (["--token", "short"], "--token"),
        (["--port", "70000"], "--port"),
        (["--history", "0"], "--history"),
        # Protected mode: refused before anything is bound (TEST-NET address).
        (["--interface", "192.0.2.1"], "protected mode"),
    ]
    for extra, words in cases:
        out = subprocess.run(cli("ui", "--port", "0", "--mesh", "uierr", "--data-dir",
                                 str(tmp_path), *extra),
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items()
                                  if not k.startswith("PORTER_MESH_")})
        assert out.returncode == 2, (extra, out.stderr)
        assert words in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stdout == ""


def test_one_dashboard_per_data_dir(ui: UI, mesh: str, tmp_path: Path) -> None:
    out = subprocess.run(cli("ui", "--port", "0", "--mesh", mesh, "--data-dir",
                             str(tmp_path / "ui-data")),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "another porter-mesh ui" in out.stderr and "Traceback" not in out.stderr


def test_a_skewed_clock_shows_on_the_roster(ui: UI, mesh: str) -> None:
    skewed = NodeProcess("skewed", mesh=mesh, prefix=["faketime", "-f", "+5s"])
    try:
        async def body(session: aiohttp.ClientSession) -> None:
            await until(lambda: _state_is(session, ui, "skewed", "alive"), 30, "skewed alive")

            async def says_skew() -> bool:
                skewed.command(op="publish", channel="log", text="tick")
                return await _state_is(session, ui, "skewed", "clock-skew")
            await until(says_skew, 30, "clock-skew")
        run(body)
    finally:
        skewed.stop()
