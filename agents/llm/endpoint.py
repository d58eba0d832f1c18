"""The HTTP client to the model: one OpenAI-compatible chat-completions endpoint.

HTTP goes through httpx, with every policy decision kept here (the official ``openai``
SDK retries on its own terms, follows no rule of ours for a 200 whose body is not JSON,
and brings pydantic along); JSON goes through orjson.

``url`` is read the way the OpenAI clients read their ``base_url``: a URL whose path ends
in ``/chat/completions`` is used as given; any other URL is a base, and
``/chat/completions`` is appended to its path (``http://127.0.0.1:8000/v1`` becomes
``http://127.0.0.1:8000/v1/chat/completions``). Only ``http`` and ``https`` are accepted.
Requests go to that URL and nowhere else: redirects are refused (an error names the
target, so the operator can configure it directly) and the environment is not read
(``trust_env=False``: no ``HTTP_PROXY``/``ALL_PROXY``, no ``.netrc``). ``api_key``, when
given, is sent as a bearer token.

One :meth:`ChatEndpoint.post` is one request, no retry: every failure is a
:class:`ModelError` that says whether a retry may help (``retryable``), whether nothing
will without a configuration change (``fatal``), and how long the server asked to wait.
The retry policy is the brain's (:mod:`agents.llm.brain`).

A request can be abandoned from another thread (the task it works for was cancelled):
the caller passes ``post`` a :class:`threading.Event` and, once it is set, calls
:meth:`ChatEndpoint.abandon`, which shuts down the endpoint's connections. The thread
blocked in ``post`` wakes at once (a shut-down socket ends its read; closing the client
from another thread would not) and gets :class:`CallAbandoned`; an answer that arrived
anyway is dropped. The endpoint knows its sockets from httpx's ``trace`` extension, which
reports every connection it opens (plain and TLS).
"""

from __future__ import annotations

import contextlib
import email.utils
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from agents.llm.conversation import clip
from porter_mesh.errors import ConfigError, PorterError
from porter_mesh.tools.schemas import ToolSpec, to_openai

__all__ = [
    "MAX_RESPONSE_BYTES",
    "CallAbandoned",
    "ChatEndpoint",
    "Completion",
    "ModelError",
    "chat_completions_url",
    "openai_tools",
]

#: The most response body read from the endpoint (bytes).
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
#: Status codes that will not change by retrying later: stop the brain.
_FATAL_STATUS: Final = frozenset({401, 403, 404})
#: Client-side status codes that are worth retrying.
_RETRY_STATUS: Final = frozenset({408, 409, 425, 429})


class ModelError(PorterError):
    """A chat-completions call failed.

    Attributes:
        status: the HTTP status, or ``None`` when none was received.
        retryable: trying the same request again may succeed.
        fatal: no later request can succeed without a configuration change.
        retry_after: seconds the server asked to wait, if it said.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        fatal: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.fatal = fatal
        self.retry_after = retry_after


class CallAbandoned(ModelError):
    """The request was abandoned by its caller (:meth:`ChatEndpoint.abandon`): not a
    failure of the endpoint, and never retried."""

    def __init__(self, url: str) -> None:
        super().__init__(f"request to {url} abandoned: its task was stopped")


def chat_completions_url(url: str) -> str:
    """The chat-completions URL for an endpoint or base URL.

    Args:
        url: ``http(s)://host[:port]/...``; a path ending in ``/chat/completions`` is
            kept, any other path gets ``/chat/completions`` appended.

    Returns:
        The URL requests are sent to.

    Raises:
        ConfigError: not an http(s) URL with a host, or it carries a user name or
            password (give the key as ``api_key``).
    """
    try:
        parts = urllib.parse.urlsplit(url.strip())
        host = parts.hostname
    except ValueError as exc:
        raise ConfigError(f"LLM URL {url!r} cannot be parsed ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"LLM URL {url!r} must start with http:// or https:// "
            "(e.g. http://127.0.0.1:8000/v1)"
        )
    if not host:
        raise ConfigError(f"LLM URL {url!r} has no host (e.g. http://127.0.0.1:8000/v1)")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "LLM URL must not carry a user name or password; give the key as api_key"
        )
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def openai_tools(specs: Iterable[ToolSpec], *, strict: bool = True) -> list[dict[str, Any]]:
    """The ``tools`` field of a request: :func:`~porter_mesh.tools.schemas.to_openai`,
    by default in OpenAI's strict mode (``strict: true``, every property required, the
    optional ones nullable)."""
    return to_openai(specs, strict=strict)


def _body_excerpt(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return clip(text, 300) if text else "(empty body)"


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # unreadable: the backoff applies
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer of the endpoint.

    Attributes:
        message: the assistant message of the first choice.
        finish_reason: why the model stopped (``stop``, ``length``, ``tool_calls``,
            ``content_filter``...), or ``None`` when the server did not say.
        tokens_in: ``usage.prompt_tokens`` (0 when not reported).
        tokens_out: ``usage.completion_tokens`` (0 when not reported).
    """

    message: Mapping[str, Any]
    finish_reason: str | None
    tokens_in: int
    tokens_out: int



class ChatEndpoint:
    """The chat-completions endpoint of one model.

    Args:
        url: the endpoint or base URL (see the module docstring).
        model: the model name sent with every request.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        request_timeout: seconds one HTTP request may take, body included.
        temperature: sent when given; the server's default otherwise.
        max_tokens: sent as ``max_tokens`` when given.

    Raises:
        ConfigError: a bad URL or an empty model name.
    """

    def __init__(self, *, url: str, model: str, api_key: str | None = None,
                 request_timeout: float = 60.0, temperature: float | None = None,
                 max_tokens: int | None = None) -> None:
        self.url = chat_completions_url(url)
        if not model.strip():
            raise ConfigError("model name is empty; give the name the endpoint serves")
        self.model = model
        self._api_key = api_key
        self.request_timeout = request_timeout
        self.temperature = temperature
        self.max_tokens = max_tokens
        self._client: httpx.Client | None = None
        # Every socket the client opened (pruned as they close), so that abandon() can
        # shut down the one in use, reused keep-alive connections included.
        self._sockets: list[socket.socket] = []
        self._sockets_lock = threading.Lock()
        self._stop: threading.Event | None = None  # the request in flight's event

    def request_body(self, messages: Sequence[Mapping[str, Any]],
                     tools: list[dict[str, Any]]) -> bytes:
        """The JSON body of a request: the conversation, the tools, ``tool_choice: auto``,
        and ``max_tokens``/``temperature`` when set."""
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
        }
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        body: bytes = orjson.dumps(payload)
        return body

    def _http(self) -> httpx.Client:
        if self._client is None:
            # trust_env=False: no proxy, netrc or certificate settings from the
            # environment; requests go to the configured URL only, unredirected.
            self._client = httpx.Client(
                follow_redirects=False, trust_env=False,
                timeout=httpx.Timeout(self.request_timeout),
                headers={"Content-Type": "application/json", "Accept": "application/json"},
            )
        return self._client

    def close(self) -> None:
        """Close the HTTP connections (a later request opens new ones)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        with self._sockets_lock:
            self._sockets.clear()

    def abandon(self) -> None:
        """Cut the request in flight short; safe from any thread.

        Set the event given to :meth:`post` first: ``post`` then raises
        :class:`CallAbandoned`, whether it was waiting for the answer, about to send the
        request, or already had the answer. This shuts down every connection of the
        endpoint (the server sees the client go) so that the waiting thread wakes now.
        """
        with self._sockets_lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def _trace(self, event: str, info: Mapping[str, Any]) -> None:
        """httpx's trace hook: keep each socket the client opens."""
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self._sockets_lock:
            self._sockets[:] = [s for s in self._sockets if s.fileno() != -1]
            self._sockets.append(sock)
            stop = self._stop
        if stop is not None and stop.is_set():
            _shut(sock)  # abandoned while connecting: abandon() may have missed it

    def post(self, body: bytes, *, stop: threading.Event | None = None) -> Completion:
        """Send one request (no retry).

        Args:
            body: from :meth:`request_body`.
            stop: once set (and :meth:`abandon` called), the request is abandoned.

        Returns:
            The first choice's answer.

        Raises:
            CallAbandoned: ``stop`` was set before the answer was read.
            ModelError: the request failed; its attributes say whether to retry.
        """
        with self._sockets_lock:
            self._stop = stop
        try:
            if stop is not None and stop.is_set():
                raise CallAbandoned(self.url)
            completion = self._post(body)
        except ModelError:
            if stop is not None and stop.is_set():
                self.close()  # its connection is shut down: never reuse it
                raise CallAbandoned(self.url) from None
            raise
        finally:
            with self._sockets_lock:
                self._stop = None
        if stop is not None and stop.is_set():
            self.close()
            raise CallAbandoned(self.url)
        return completion

    def _post(self, body: bytes) -> Completion:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        deadline = time.monotonic() + self.request_timeout
        try:
            with self._http().stream("POST", self.url, content=body, headers=headers,
                                     extensions={"trace": self._trace}) as response:
                if response.status_code != 200:
                    raise self._status_error(response)
                data = self._read(response, deadline)
        except httpx.ConnectError as exc:
            raise ModelError(f"cannot reach {self.url}: {exc}", retryable=True) from None
        except httpx.TimeoutException:
            raise ModelError(f"request to {self.url} timed out", retryable=True) from None
        except httpx.HTTPError as exc:
            raise ModelError(f"request to {self.url} failed ({type(exc).__name__}: {exc})",
                             retryable=True) from None
        return self._parse(data)

    def _read(self, response: httpx.Response, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes(65536):
            if time.monotonic() > deadline:
                raise ModelError(f"request to {self.url} timed out", retryable=True)
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise ModelError(
                    f"response from {self.url} is larger than {MAX_RESPONSE_BYTES} bytes",
                    retryable=True,
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def _status_error(self, response: httpx.Response) -> ModelError:
        status = response.status_code
        if response.is_redirect or 300 <= status < 400:
            target = response.headers.get("Location", "?")
            return ModelError(
                f"HTTP {status} from {self.url}: redirects are not followed; configure "
                f"the final URL ({target}) instead",
                status=status, fatal=True,
            )
        excerpt = "(body unreadable)"
        try:
            head = b""
            for chunk in response.iter_bytes(2048):
                head += chunk
                if len(head) >= 2048:
                    break
            excerpt = _body_excerpt(head[:2048])
        except httpx.HTTPError:
            pass
        retryable = status >= 500 or status in _RETRY_STATUS
        return ModelError(
            f"HTTP {status} from {self.url}: {excerpt}",
            status=status,
            retryable=retryable,
            fatal=status in _FATAL_STATUS,
            retry_after=_retry_after(response.headers.get("Retry-After")),
        )

    def _parse(self, data: bytes) -> Completion:
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ModelError(
                f"response from {self.url} is not JSON: {_body_excerpt(data)}", retryable=True
            ) from None
        message = None
        finish: str | None = None
        tokens_in = tokens_out = 0
        if isinstance(document, dict):
            choices = document.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                message = choices[0].get("message")
                reason = choices[0].get("finish_reason")
                finish = reason if isinstance(reason, str) else None
            usage = document.get("usage")
            if isinstance(usage, dict):
                tokens_in = _count(usage.get("prompt_tokens"))
                tokens_out = _count(usage.get("completion_tokens"))
        if not isinstance(message, dict):
            error = document.get("error") if isinstance(document, dict) else None
            detail = f" (error: {clip(str(error), 200)})" if error else ""
            raise ModelError(
                f"response from {self.url} has no choices[0].message{detail}", retryable=True
            )
        return Completion(message, finish, tokens_in, tokens_out)


def _shut(sock: socket.socket) -> None:
    """Shut a socket down both ways: a thread blocked reading it wakes with end of file."""
    with contextlib.suppress(OSError):  # already closed or never connected: nothing to cut
        sock.shutdown(socket.SHUT_RDWR)


def _count(value: Any) -> int:
    """A token count from ``usage`` (anything else counts as 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
