"""A small OpenAI-compatible chat-completions server for tests: :class:`FakeLLM`.

It listens on 127.0.0.1 (an OS-chosen port) and answers each POST with the next entry of
its script, in order:

* a ``dict``: a full response when it has ``choices`` (build one with
  :func:`completion` to choose its ``finish_reason``), otherwise the assistant message
  (build one with :func:`reply` and :func:`tool_call`);
* :class:`Status`: an HTTP error status with a body;
* :class:`Raw`: any body with status 200 (not JSON, or JSON without ``choices``);
* :class:`Hang`: no answer for a while (past the client's timeout); the late answer is a
  plain reply that nobody reads, and the client's retry gets the next entry;
* :class:`Drop`: the connection is closed without an answer;
* :class:`Hold`: no answer until the test lets it go (:meth:`FakeLLM.release`) or the
  client closes its connection; a client that went away is recorded
  (:attr:`FakeLLM.disconnects`), which is how a test sees a request abandoned.

When the script is spent, ``when_done`` answers every further request (by default a
plain reply without tool calls). Several agents can share one fake: ``by_agent`` gives
each agent its own script, chosen by the system prompt's ``You are NAME (`` line; the
requests of other agents take the common script. Every request is recorded
(:attr:`FakeLLM.requests`) so a test can check what the client sent, e.g. the tool
results.

Used as a context manager; on exit, hanging answers are cut short and every thread is
joined.
"""

from __future__ import annotations

import itertools
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeVar

import orjson

__all__ = [
    "Drop",
    "FakeLLM",
    "Hang",
    "Hold",
    "Raw",
    "Received",
    "Status",
    "completion",
    "reply",
    "tool_call",
]

#: The longest a Hang entry may hold a request (seconds), whatever it asks for.
MAX_HANG = 30.0

T = TypeVar("T")

_ids = itertools.count(1)


@dataclass(frozen=True)
class Status:
    """Answer with an HTTP error status."""

    code: int
    body: bytes = b'{"error": {"message": "scripted failure"}}'
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Raw:
    """Answer 200 with this body as it is."""

    body: bytes


@dataclass(frozen=True)
class Hang:
    """Hold the request this long (bounded by :data:`MAX_HANG` and by closing)."""

    seconds: float = 10.0


@dataclass(frozen=True)
class Hold:
    """Hold the request until :meth:`FakeLLM.release`, then answer ``then``; a client
    that closes its connection first is recorded in :attr:`FakeLLM.disconnects`.
    Bounded by :data:`MAX_HANG` and by closing."""

    then: dict[str, Any] = field(default_factory=lambda: reply("held answer"))


@dataclass(frozen=True)
class Drop:
    """Close the connection without answering."""


Entry = dict[str, Any] | Status | Raw | Hang | Hold | Drop


@dataclass(frozen=True)
class Received:
    """One request the server got."""

    path: str
    headers: dict[str, str]
    body: Any  # the decoded JSON, or None when it was not JSON
    at: float = field(default_factory=time.monotonic)  # when it arrived


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None
              ) -> dict[str, Any]:
    """One OpenAI tool call; ``arguments`` as a dict (encoded) or a raw string (as is)."""
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {"id": call_id or f"call_{next(_ids)}", "type": "function",
            "function": {"name": name, "arguments": args}}


def reply(content: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with text and/or tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def completion(message: dict[str, Any], finish_reason: str | None = None,
               usage: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    """A full response; ``finish_reason`` defaults to what the message implies, and
    ``usage`` is ``(prompt_tokens, completion_tokens)``."""
    finish = finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    prompt, answer = usage
    return {"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion",
            "created": int(time.time()), "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": answer,
                      "total_tokens": prompt + answer}}


class _Server(ThreadingHTTPServer):
    # Non-daemon handler threads are joined by server_close: nothing outlives the fake.
    daemon_threads = False
    block_on_close = True
    fake: FakeLLM


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read the recorded requests instead

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            body = None
        fake = self.server.fake
        received = Received(self.path, dict(self.headers.items()), body)
        entry = fake._record(received)
        if isinstance(entry, Hold):
            if not self._hold(received):
                self.close_connection = True
                return
            entry = entry.then
        if isinstance(entry, Drop):
            self.close_connection = True
            return
        if isinstance(entry, Hang):
            fake._closing.wait(min(entry.seconds, MAX_HANG))
            entry = reply("late answer")
        if isinstance(entry, Status):
            self._send(entry.code, entry.body, entry.headers)
        elif isinstance(entry, Raw):
            self._send(200, entry.body)
        else:
            document = entry if "choices" in entry else completion(entry)
            self._send(200, orjson.dumps(document))

    def _hold(self, received: Received) -> bool:
        """Wait for a release (True) or the client's going away (False, recorded)."""
        fake = self.server.fake
        conn: socket.socket = self.connection
        deadline = time.monotonic() + MAX_HANG
        while not fake._released(received) and not fake._closing.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            # Readable with nothing to read: the client closed (or shut down) its end.
            # The short select bounds how late a release is seen.
            readable, _, _ = select.select([conn], [], [], min(0.05, left))
            if readable:
                try:
                    gone = conn.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    gone = True
                if gone:
                    fake._disconnected(received)
                    return False
        return True

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (a timed-out request): nothing to answer


class FakeLLM:
    """The scripted endpoint.

    Args:
        script: the answers, in order.
        when_done: the answer once the script is spent.
    """

    def __init__(self, script: Iterable[Entry] = (), *,
                 when_done: Entry | None = None,
                 by_agent: dict[str, Iterable[Entry]] | None = None) -> None:
        self._script = list(script)
        self._by_agent = {name: list(entries) for name, entries in (by_agent or {}).items()}
        self._when_done: Entry = when_done if when_done is not None else reply("Nothing to do.")
        self.requests: list[Received] = []
        #: Held requests whose client closed the connection, with when it was seen.
        self.disconnects: list[tuple[Received, float]] = []
        self._releases = 0  # held requests let go so far (in arrival order)
        self._held: list[Received] = []
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="fake-llm", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL, as an OpenAI client takes it."""
        return f"http://127.0.0.1:{self.port}/v1"

    def agent_of(self, received: Received) -> str | None:
        """The agent a request came from (by its system prompt), if it names one."""
        try:
            system = str(received.body["messages"][0]["content"])
        except (TypeError, KeyError, IndexError):
            return None
        for name in self._by_agent:
            if f"You are {name} (" in system:
                return name
        return None

    def _record(self, received: Received) -> Entry:
        with self._cond:
            self.requests.append(received)
            agent = self.agent_of(received)
            script = self._by_agent[agent] if agent is not None else self._script
            entry = script.pop(0) if script else self._when_done
            self._cond.notify_all()
            return entry

    def _released(self, received: Received) -> bool:
        with self._cond:
            if received not in self._held:
                self._held.append(received)
            return self._held.index(received) < self._releases

    def _disconnected(self, received: Received) -> None:
        with self._cond:
            self.disconnects.append((received, time.monotonic()))
            self._cond.notify_all()

    def release(self) -> None:
        """Let the oldest held request (:class:`Hold`) not yet let go be answered."""
        with self._cond:
            self._releases += 1

    def wait_for_disconnects(self, count: int, timeout: float) -> list[tuple[Received, float]]:
        """Block until ``count`` held requests saw their client go; fails the test on
        timeout."""
        return self._wait_count(self.disconnects, count, timeout, "client(s) go")

    def wait_until(self, predicate: Callable[[list[Received]], bool], timeout: float) -> bool:
        """Block until ``predicate(requests so far)`` holds (True) or ``timeout`` passes."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.requests), timeout)

    def wait_for_requests(self, count: int, timeout: float) -> list[Received]:
        """Block until ``count`` requests arrived; fails the test on timeout."""
        return self._wait_count(self.requests, count, timeout, "request(s)")

    def _wait_count(self, seen: list[T], count: int, timeout: float, what: str) -> list[T]:
        """A copy of ``seen`` once it has ``count`` entries; fails the test on timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(seen) >= count, timeout):
                raise AssertionError(f"fake LLM saw {len(seen)} {what}, expected {count} "
                                     f"within {timeout}s")
            return list(seen)

    @property
    def remaining(self) -> int:
        """Script entries not yet served."""
        with self._cond:
            return len(self._script)

    def close(self) -> None:
        """Stop serving, cut hanging answers short, join every thread."""
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FakeLLM:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
