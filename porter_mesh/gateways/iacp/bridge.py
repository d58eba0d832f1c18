"""The IACP bridge's driver: a TCP listener, and one mesh node per connected forager.

The rules live in :mod:`porter_mesh.gateways.iacp.protocol`; this module only moves
bytes and activities. One asyncio loop runs everything:

* the listener (``asyncio.start_server``); each connection is read in chunks, cut into
  lines (:class:`~.protocol.LineSplitter`) and fed to its
  :class:`~.protocol.ForagerSession`, one line at a time, so a forager's registration
  (starting its node) finishes before its next line is read;
* the bridge's own node (role ``gateway``): it sees the roster, so a forager cannot take
  a name already on the mesh, and it publishes the bridge's view (``porter-mesh stats``
  shows it under ``iacp``) and counts every dropped line (``dropped.iacp.<reason>``);
* per forager, a node named after it (role ``worker``, its slots and tools advertised,
  handlers only, no inbox) with its data directory ``<data root>/<mesh>/<forager>``
  (delivery journal, knowledge replica unless knowledge is off, and the forager's
  record, :mod:`.record`); its deliveries and control messages go to the session. A
  delivery the session cannot act on yet (:class:`~.protocol.Owed`), or whose change to
  the record cannot be written, is declined with ``NotHandled``: the node keeps it owed
  and offers it again, so the bridge never acknowledges and drops;
* a ticker that gives every session the time (heartbeats, liveness, assign timeouts).

A forager's node leaves the mesh (saying goodbye) when the forager disconnects, expires
or is halted, so the mesh re-offers its tasks as for any worker that goes away.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pathlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import orjson

from porter_mesh.adapters.shard import Shard
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity, reject
from porter_mesh.core.peers import PeerEvent, PeerEventKind
from porter_mesh.errors import (
    ConfigError,
    KnowledgeError,
    NotHandled,
    PorterError,
    ProtocolError,
    StorageError,
)
from porter_mesh.gateways.iacp.protocol import (
    Assign,
    BridgeSettings,
    Close,
    Dropped,
    Event,
    ForagerSession,
    IdMint,
    Leave,
    LineSplitter,
    Lookup,
    MeshSend,
    Output,
    Owed,
    Phase,
    Register,
    SendLine,
    SetDraining,
    Store,
    assign_from_record,
    assign_to_record,
    encode_message,
)
from porter_mesh.gateways.iacp.record import ForagerRecord, load_record, save_record
from porter_mesh.node.config import NodeConfig, knowledge_dir
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Message, Node

__all__ = ["IacpBridge", "event_line"]

log = logging.getLogger("porter_mesh.iacp")

_READ_CHUNK = 64 * 1024
#: Bytes queued to a forager that does not read before its connection is closed.
_MAX_WRITE_BUFFER = 4 * 1024 * 1024
_TICK = 0.1
#: Drop reasons logged so far, per connection, are kept up to this many.
_MAX_LOGGED = 64


class _Forager:
    """One connection: its session, and its node while it is on the mesh."""

    def __init__(self, bridge: IacpBridge, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, peer: str) -> None:
        self.bridge = bridge
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self.session = ForagerSession(bridge.settings, bridge.mint, peer=peer,
                                      now=time.monotonic(), draining=bridge.draining)
        self.splitter = LineSplitter(bridge.settings.max_line_bytes)
        self.node: Node | None = None
        self.knowledge: Knowledge | None = None
        self.closing = False
        self.logged: set[str] = set()
        self._leaving: set[asyncio.Task[None]] = set()
        #: What is on disk for this forager (``None``: nothing kept, no data directory).
        self._record: ForagerRecord | None = None
        self._data_dir: pathlib.Path | None = None

    # -- the connection ------------------------------------------------------------------

    async def serve(self) -> None:
        try:
            while not self.closing:
                try:
                    data = await self.reader.read(_READ_CHUNK)
                except (ConnectionError, OSError):
                    break
                if not data:
                    break
                self.bridge.counters["bytes.in"] += len(data)
                for line in self.splitter.feed(data):
                    self.bridge.counters["lines.in"] += 1
                    outs = self.session.receive_line(line, now=time.monotonic(),
                                                     wall=time.time())
                    # IACP acknowledges nothing, so a forager's line is not refused when
                    # its record cannot be kept: the mesh side is what must not lose.
                    self.keep(strict=False)
                    await self.carry_out(outs)
                    if self.closing:
                        break
        finally:
            outs = self.session.disconnected(time.monotonic())
            self.keep(strict=False)
            self.carry_out_now(outs)
            await self.aclose()

    async def carry_out(self, outs: list[Output]) -> None:
        """Carry out ``outs``, awaiting a registration (only lines cause one)."""
        for out in outs:
            if isinstance(out, Register):
                await self.carry_out(await self.register(out))
                if self.node is not None and self.session.phase is Phase.JOINED:
                    # What the session declined while it was joining (the journal's
                    # owed messages, an Offer resent meanwhile) is offered again now.
                    self.node.redeliver()
            else:
                self.carry_out_now([out])

    def carry_out_now(self, outs: list[Output]) -> None:
        for out in outs:
            if isinstance(out, SendLine):
                self.write(encode_message(out.message))
            elif isinstance(out, MeshSend):
                self.mesh_send(out.channel, out.activity)
            elif isinstance(out, Dropped):
                self.dropped(out)
            elif isinstance(out, Event):
                self.bridge.emit(out.kind, out.fields)
            elif isinstance(out, Store):
                self.store(out.activity)
            elif isinstance(out, Lookup):
                self.carry_out_now(self.session.tool_reply(out.query, self.bridge.adverts(),
                                                           wall=time.time()))
            elif isinstance(out, SetDraining):
                if self.node is not None:
                    self.node.draining = out.on
            elif isinstance(out, Leave):
                self.leave(out.reason)
            elif isinstance(out, Close):
                self.close(out.reason)
            elif isinstance(out, Owed):
                log.debug("iacp %s: %s", self.session.name or self.peer, out.reason)
            else:  # Register from a timer or the mesh cannot happen
                raise AssertionError(f"unexpected output {out!r}")

    def write(self, data: bytes) -> None:
        transport = self.writer.transport
        if self.writer.is_closing():
            return
        if transport.get_write_buffer_size() > _MAX_WRITE_BUFFER:
            self.close(f"the forager does not read ({_MAX_WRITE_BUFFER} bytes queued)")
            return
        self.writer.write(data)
        self.bridge.counters["lines.out"] += 1

    def dropped(self, out: Dropped) -> None:
        who = self.session.name or self.peer
        self.bridge.counters["dropped." + out.reason] += 1
        self.bridge.count_drop(out.reason, self.session.name or "?")
        if out.reason not in self.logged and len(self.logged) < _MAX_LOGGED:
            self.logged.add(out.reason)
            log.warning("iacp %s: %s (further %s from this connection are only counted)",
                        who, out.detail, out.reason)
        else:
            log.debug("iacp %s: %s", who, out.detail)
        self.bridge.emit("dropped", {"forager": self.session.name, "peer": self.peer,
                                     "reason": out.reason, "detail": out.detail})

    def close(self, reason: str) -> None:
        if self.closing:
            return
        self.closing = True
        log.info("iacp %s: closing the connection: %s", self.session.name or self.peer, reason)
        with contextlib.suppress(Exception):
            self.writer.close()

    async def aclose(self) -> None:
        self.closing = True
        with contextlib.suppress(Exception):
            self.writer.close()
        await self.leave_now("disconnected")
        for task in list(self._leaving):
            with contextlib.suppress(BaseException):
                await task
        self.bridge.forget(self)

    # -- the mesh side -------------------------------------------------------------------

    async def register(self, reg: Register) -> list[Output]:
        wall = time.time()
        problem = self.bridge.name_problem(reg.name, self)
        if problem is not None:
            return self.session.refused(problem, wall=wall)
        try:
            carried = await self.join(reg)
        except StorageError as exc:
            self.dropped(Dropped("storage", f"{reg.name} cannot join now: {exc}"))
            return self.session.deferred(f"{reg.name} cannot join now: {exc}")
        except PorterError as exc:
            return self.session.refused(f"refused: {reg.name} cannot join the mesh: {exc}",
                                        wall=wall)
        now = time.monotonic()
        outs = self.session.joined(now=now, wall=time.time())
        outs += self.session.restore(carried, now=now, wall=time.time())
        self.keep(strict=False)
        return outs

    def _carried_over(self, record: ForagerRecord) -> list[Assign]:
        """The assigns an earlier bridge process left open for this forager."""
        now, out = time.monotonic(), []
        for item in record.assigns:
            try:
                out.append(assign_from_record(item, now=now))
            except ProtocolError as exc:
                log.warning("iacp %s: an assign in its record is skipped: %s",
                            self.session.name, exc)
        return out

    async def join(self, reg: Register) -> list[Assign]:
        """Start the forager's node; returns the assigns carried over from an earlier
        bridge process.

        Raises:
            StorageError: its record (with the new node's incarnation) cannot be written.
            PorterError: the node cannot start.
        """
        for leaving in list(self._leaving):  # the node of an earlier join, still closing
            with contextlib.suppress(BaseException):
                await leaving
        bridge = self.bridge
        data_dir = bridge.forager_dir(reg.name)
        config = bridge.config.with_changes(
            name=reg.name, role="worker", slots=reg.slots, tools=reg.tools,
            channels=(C.CHANNEL_REVIEW,), inbox_size=0, data_dir=data_dir)
        node = Node(config)
        carried: list[Assign] = []
        if data_dir is not None:
            # The new incarnation is on disk before anyone can see it, so that a bridge
            # restarted after a crash knows this node as its own (see record.py).
            old = load_record(data_dir)
            carried = self._carried_over(old)
            record = old.with_incarnation(node.incarnation)
            save_record(data_dir, record)
            self._record, self._data_dir = record, data_dir
        # The handler is there before the node starts, so the journal's owed messages
        # are offered at once; until the session has joined it declines them (Owed).
        node.add_handler(self.on_message)
        node.add_control_listener(self.on_control)
        knowledge = None
        try:
            if data_dir is not None and bridge.knowledge:
                shard = Shard(knowledge_dir(data_dir), agent=reg.name)
                knowledge = Knowledge(node, shard)
                knowledge.start()
            await node.astart()
        except BaseException:
            if knowledge is not None:
                await knowledge.aclose()
            await node.aclose()
            raise
        self.node, self.knowledge = node, knowledge
        bridge.serving[reg.name] = self
        slots = f"{reg.slots} slot(s)"
        node.async_publish(C.CHANNEL_LOG, Activity.from_dict({
            "type": "Announce", "actor": reg.name,
            "summary": f"{reg.name} online as worker ({slots}; an IACP 1.1 forager at "
                       f"{self.peer} through {bridge.node.name})"}))
        return carried

    def on_message(self, msg: Message) -> None:
        """Hand a delivered activity to the session.

        Raises:
            NotHandled: the session cannot act on it now (the forager has not joined, or
                its connection is going), or what it changed cannot be kept on disk: the
                node keeps the message owed and offers it again, so nothing is
                acknowledged and dropped.
        """
        name = self.session.name or self.peer
        if self.closing or self.writer.is_closing():
            raise NotHandled(f"{name}'s connection is closing; the {msg.activity.type} "
                             "waits for the forager's next connection")
        checkpoint = self.session.checkpoint()
        outs = self.session.on_activity(msg.channel, msg.sender, msg.activity,
                                        now=time.monotonic(), wall=time.time())
        owed = next((o for o in outs if isinstance(o, Owed)), None)
        if owed is not None:
            raise NotHandled(owed.reason)
        try:
            self.keep(strict=True)
        except StorageError as exc:
            self.session.rollback(checkpoint)
            self.dropped(Dropped("storage", f"the {msg.activity.type} from {msg.sender} "
                                 f"is declined until it can be kept: {exc}"))
            raise NotHandled(str(exc)) from None
        self.carry_out_now(outs)

    def keep(self, *, strict: bool) -> None:
        """Write the forager's record if its carried-over assigns changed.

        Args:
            strict: raise when the write fails (a mesh message is being handled: it is
                then declined); otherwise log it once and count it.

        Raises:
            StorageError: ``strict`` and the record could not be written.
        """
        record, data_dir = self._record, self._data_dir
        if record is None or data_dir is None:
            return
        assigns = [assign_to_record(a) for a in self.session.carried()]
        if assigns == record.assigns:
            return
        new = ForagerRecord(list(record.incarnations), assigns)
        try:
            save_record(data_dir, new)
        except StorageError as exc:
            if strict:
                raise
            self.dropped(Dropped("storage", f"the forager's record is not up to date: "
                                 f"{exc}"))
            return
        self._record = new

    def on_control(self, kind: str, sender: str, body: dict[str, Any]) -> None:
        self.carry_out_now(self.session.on_control(kind, sender, now=time.monotonic(),
                                                   wall=time.time()))

    def mesh_send(self, channel: str, activity: Activity) -> None:
        node = self.node
        if node is None:
            return
        try:
            if channel.startswith(C.DIRECT_PREFIX):
                fut = node.async_send_nowait(channel, activity)
                fut.add_done_callback(lambda f: self._sent(f, channel, activity))
            else:
                node.async_publish(channel, activity)
        except PorterError as exc:
            log.warning("iacp %s: could not send %s on %s: %s", node.name, activity.type,
                        channel, exc)

    def _sent(self, fut: asyncio.Future[None], channel: str, activity: Activity) -> None:
        if fut.cancelled() or fut.exception() is None:
            return
        log.warning("iacp %s: %s on %s was not delivered: %s", self.session.name,
                    activity.type, channel, fut.exception())

    def store(self, activity: Activity) -> None:
        if self.knowledge is None:
            self.dropped(Dropped("no-knowledge", "mem.sync: the bridge keeps no knowledge "
                                 "replica (started with --no-knowledge); the Remember is only "
                                 "published on log"))
            self.mesh_send(C.CHANNEL_LOG, activity)
            return
        try:
            self.knowledge.async_remember(activity)
        except KnowledgeError as exc:
            self.dropped(Dropped("bad-memory", f"mem.sync refused by the replica: {exc}"))

    def leave(self, reason: str) -> None:
        task = asyncio.ensure_future(self.leave_now(reason))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def leave_now(self, reason: str) -> None:
        node, knowledge = self.node, self.knowledge
        self.node = self.knowledge = None
        if node is None:
            return
        log.info("iacp %s leaves the mesh: %s", node.name, reason)
        self.bridge.left(node)
        if self.bridge.serving.get(node.name) is self:
            del self.bridge.serving[node.name]
        if knowledge is not None:
            with contextlib.suppress(Exception):
                await knowledge.aclose()
        await node.aclose()


class IacpBridge:
    """Serve IACP 1.1 foragers on TCP; each becomes a worker on the mesh.

    Args:
        config: the settings of the bridge's own node (name, mesh, interfaces, seeds,
            discovery); the foragers' nodes copy them with their own name and role.
        host / port: where to listen (port 0: the OS picks).
        settings: the protocol's timings and limits.
        data_root: where foragers' data directories go (``<data_root>/<mesh>/<name>``,
            holding each one's delivery journal, knowledge replica and record; see
            :mod:`.record`); ``None`` keeps nothing on disk (no knowledge, and a
            restarted bridge cannot take its foragers back).
        knowledge: keep a knowledge replica per forager (otherwise ``mem.sync`` is only
            published).
        on_event: called with ``(kind, fields)`` for each thing worth reporting.

    Raises:
        ConfigError: a setting is invalid.
    """

    def __init__(self, config: NodeConfig, *, host: str = "127.0.0.1", port: int = 7421,
                 settings: BridgeSettings | None = None,
                 data_root: pathlib.Path | None = None, knowledge: bool = True,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"--listen port {port} is not a TCP port (0-65535)")
        self.config = config
        self.host, self.port = host, port
        self.settings = settings or BridgeSettings()
        self.data_root = data_root
        self.knowledge = knowledge
        self.on_event = on_event
        self.mint = IdMint(secrets.randbits(24) << 8)
        self.counters: collections.Counter[str] = collections.Counter()
        self.node = Node(config.with_changes(role="gateway", channels=(), inbox_size=0))
        self.draining = False
        #: Foragers on the mesh, by name.
        self.serving: dict[str, _Forager] = {}
        self._connections: set[_Forager] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # Incarnations of foragers' nodes that left: the roster may still show them for a
        # moment, and their name is free again.
        self._gone: dict[str, int] = {}
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._halted: asyncio.Event | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def _on_own_message(self, msg: Message) -> None:
        """A direct message to the bridge's own node: it holds no task, so an Offer or a
        Question is answered with a Reject that says where work goes (nothing is taken
        silently); anything else is counted and let go."""
        node = self.node
        node.count_drop("iacp.not-a-forager", msg.sender)
        if msg.activity.type not in ("Offer", "Question"):
            return
        answer = reject(node.name, f"{node.name} is the IACP bridge and takes no work "
                        "itself; send it to a forager by name (porter-mesh peers lists them)",
                        context=msg.activity.context)
        with contextlib.suppress(PorterError):
            fut = node.async_send_nowait(f"{C.DIRECT_PREFIX}{msg.sender}", answer)
            # A seat that has gone cannot be answered; that is no error of the bridge.
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def astart(self) -> tuple[str, int]:
        """Join the mesh and listen; returns the bound ``(host, port)``.

        Raises:
            ConfigError: the address cannot be bound, or the node cannot start.
        """
        self._halted = asyncio.Event()
        self.node.add_handler(self._on_own_message)
        self.node.add_control_listener(self._on_control)
        self.node.add_peer_listener(self._on_peer)
        self.node.view_sections["iacp"] = self.view
        await self.node.astart()
        try:
            self._server = await asyncio.start_server(self._accept, self.host, self.port)
        except OSError as exc:
            await self.node.aclose()
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}"
                              "; choose another --listen address (port 0 picks a free one)"
                              ) from None
        sock = self._server.sockets[0].getsockname()
        self.host, self.port = sock[0], sock[1]
        self._ticker = asyncio.ensure_future(self._tick_loop())
        log.info("iacp bridge %s listening on %s:%d", self.node.name, self.host, self.port)
        self.emit("listening", {"host": self.host, "port": self.port, "node": self.node.name})
        return self.host, self.port

    async def aclose(self) -> None:
        """Stop listening, close every connection (their nodes leave), leave the mesh."""
        if self._server is not None:
            self._server.close()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(BaseException):
                await self._ticker
        for forager in list(self._connections):
            forager.close("the bridge is stopping")
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
        await self.node.aclose()

    async def wait_halted(self) -> None:
        """Wait until a ``halt`` addressed to the bridge (or to everyone) arrives."""
        assert self._halted is not None, "bridge not started"
        await self._halted.wait()

    # -- what the foragers ask of the bridge -------------------------------------------------

    def name_problem(self, name: str, asking: _Forager) -> str | None:
        """Why ``name`` cannot join, or ``None`` when it is free."""
        mesh = self.config.mesh
        other = self.serving.get(name)
        if other is not None and other is not asking:
            return (f"refused: the name {name} is already on mesh {mesh!r} (another forager "
                    f"at {other.peer}); give this forager another name")
        if name == self.node.name:
            return f"refused: {name} is the bridge's own name on mesh {mesh!r}; choose another"
        peer = self.node.peer(name)
        if peer is not None and not self._was_ours(name, peer.incarnation):
            return (f"refused: the name {name} is already on mesh {mesh!r} (role "
                    f"{peer.advert.role}); give this forager another name")
        return None

    def forager_dir(self, name: str) -> pathlib.Path | None:
        """The forager's data directory (``None`` when the bridge keeps no data)."""
        if self.data_root is None:
            return None
        return self.data_root / self.config.mesh / name

    def _was_ours(self, name: str, incarnation: int) -> bool:
        """Whether ``name``'s node of ``incarnation`` was one this bridge ran: it left
        (the roster still shows it for a moment), or an earlier bridge process ran it
        on this data directory (killed, it said no goodbye)."""
        if self._gone.get(name) == incarnation:
            return True
        directory = self.forager_dir(name)
        return directory is not None and incarnation in load_record(directory).incarnations

    def adverts(self) -> dict[str, list[str]]:
        """Every agent on the mesh (and the bridge's foragers) with its advertised tools."""
        out = {p.name: list(p.advert.tools) for p in self.node.peers()}
        for name, forager in self.serving.items():
            out[name] = list(forager.session.tools)
        return out

    def left(self, node: Node) -> None:
        self._gone[node.name] = node.incarnation

    def forget(self, forager: _Forager) -> None:
        self._connections.discard(forager)

    def emit(self, kind: str, fields: dict[str, Any] | Any) -> None:
        self.counters["event." + kind] += 1
        if self.on_event is not None:
            try:
                self.on_event(kind, dict(fields))
            except Exception:
                log.exception("event listener failed")

    def count_drop(self, reason: str, forager: str) -> None:
        self.node.count_drop("iacp." + reason, forager)

    def view(self) -> dict[str, Any]:
        """The ``iacp`` section of the bridge node's view (``porter-mesh stats``)."""
        foragers = []
        for f in sorted(self._connections, key=lambda f: (f.session.name or "", f.peer)):
            s = f.session
            foragers.append({
                "name": s.name, "peer": f.peer, "phase": s.phase.value, "slots": s.slots,
                "tools": list(s.tools), "open": len(s.open_assigns), "evasive": s.evasive,
                "draining": s.draining,
                "skew": round(s.skew, 1) if s.skew is not None else None,
            })
        return {"listen": f"{self.host}:{self.port}", "foragers": foragers,
                "counters": dict(self.counters)}

    # -- internals ----------------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        addr = writer.get_extra_info("peername")
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        forager = _Forager(self, reader, writer, peer)
        self._connections.add(forager)
        self.counters["connections"] += 1
        self.emit("connected", {"peer": peer})
        task = asyncio.ensure_future(self._serve(forager))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, forager: _Forager) -> None:
        try:
            await forager.serve()
        except Exception:
            log.exception("iacp connection %s failed", forager.peer)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(_TICK)
            now, wall = time.monotonic(), time.time()
            for forager in list(self._connections):
                deadline = forager.session.next_deadline()
                if deadline is None or deadline > now:
                    continue
                try:
                    outs = forager.session.tick(now=now, wall=wall)
                    forager.keep(strict=False)
                    forager.carry_out_now(outs)
                except Exception:
                    log.exception("iacp tick failed for %s", forager.peer)

    def _on_control(self, kind: str, sender: str, body: dict[str, Any]) -> None:
        if kind == "drain":
            self.draining = True
            now, wall = time.monotonic(), time.time()
            for forager in list(self._connections):
                forager.carry_out_now(forager.session.on_control(kind, sender, now=now,
                                                                 wall=wall))
        elif kind == "halt":
            now, wall = time.monotonic(), time.time()
            for forager in list(self._connections):
                forager.carry_out_now(forager.session.on_control(kind, sender, now=now,
                                                                 wall=wall))
            self.emit("halted", {"by": sender})
            if self._halted is not None:
                self._halted.set()

    def _on_peer(self, event: PeerEvent) -> None:
        self.emit("peer", {"peer": event.peer.name, "kind": event.kind.value,
                           "reason": event.reason})
        if event.kind is PeerEventKind.LEFT:
            gone = self._gone.get(event.peer.name)
            if gone == event.peer.incarnation:
                del self._gone[event.peer.name]


def event_line(kind: str, fields: dict[str, Any]) -> bytes:
    """One JSON line for ``--events``: ``{"ev": kind, ...fields}``."""
    return orjson.dumps({"ev": kind, **fields}) + b"\n"

