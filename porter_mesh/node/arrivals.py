"""Reading the mesh: every message that arrives, checked and handed to the rule it is for.

Theory of operation
-------------------
Each socket is read through :meth:`~porter_mesh.node.links.Sockets.read` and each
message lands in one function here, by socket:

* a SUB (:meth:`Arrivals.read_sub`): broadcasts, the control channel among them, and
  the observer copies of direct messages;
* the ROUTER (:meth:`Arrivals.read_router`): direct messages to this node, hellos, and
  requests of the mesh's own kinds (knowledge sync, ``stats``);
* a DEALER to a peer or a probe (:meth:`Arrivals.read_dealer`): acknowledgements,
  welcomes, and answers to this node's requests.

Every message is decoded first (a malformed one is counted and logged once per sender
and reason, and the read goes on), then, on a secured node, checked against the name
its connection authenticated; the sender's clock is merged and the roster told it was
heard. What to do next is the receiving rules' answer (a
:class:`~porter_mesh.core.session.receiving.Receipt`): its steps are carried out in
their order, journal, deliver, acknowledge. The new direct messages of one read are
journaled together (:meth:`~porter_mesh.node.inbox.Inbox.accept`) and acknowledged with
the flush that follows the read, so one ``fdatasync`` and one acknowledgement message
serve a burst; when that flush sends the sender a direct message (a handler's reply),
the acknowledgements ride on it instead (:mod:`porter_mesh.core.session.acks`), and a
direct message that carries some for this node settles them here.

Control messages go by kind: heartbeats to the receiving rules (the sender's last
broadcast positions, so a lost last message is still counted), hello and welcome to
:mod:`porter_mesh.node.peering`, goodbyes to the roster, acknowledgements to the sending
rules, a registered kind (:meth:`Arrivals.register_kind`) to its handler, a request of a
kind nobody registered answered with ``unsupported`` (held for its handler instead while
that kind is expected: :meth:`Arrivals.expect`), and the rest (``drain``,
``halt``, the application's) to the node's control listeners.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import zmq

from porter_mesh.adapters.security import MeshSecurity
from porter_mesh.core import constants as C
from porter_mesh.core.advert import key_name
from porter_mesh.core.control import (
    KIND_ACK,
    KIND_BYE,
    KIND_HEARTBEAT,
    KIND_HELLO,
    KIND_UNSUPPORTED,
    KIND_WELCOME,
    Ack,
    Heartbeat,
    Introduction,
    Unsupported,
    decode_ack,
    decode_bye,
    decode_control,
    decode_heartbeat,
    decode_hello,
    decode_unsupported,
    decode_welcome,
    encode_ack,
    encode_unsupported,
    encode_welcome,
)
from porter_mesh.core.envelope import (
    Envelope,
    decode_broadcast,
    decode_direct,
    decode_payload,
    encode_direct,
    encode_topic,
)
from porter_mesh.core.hlc import HybridClock
from porter_mesh.core.session.acks import PendingAcks
from porter_mesh.core.session.keys import KEY_PREFIX
from porter_mesh.core.session.receiving import (
    LOST_BROADCAST,
    MISADDRESSED,
    UNKNOWN_SENDER,
    Receipt,
    Receiving,
    Step,
)
from porter_mesh.core.session.roster import Roster, RosterAction
from porter_mesh.core.session.sending import SendAction, Sender
from porter_mesh.errors import PorterError, ProtocolError
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.endpoints import Endpoints
from porter_mesh.node.inbox import Accepted, Inbox, wall_ms
from porter_mesh.node.links import PeerLink, Sockets, Target
from porter_mesh.node.peering import Peering
from porter_mesh.node.subscriptions import OBSERVE_PREFIX, Subscriptions
from porter_mesh.node.zio import recv_frames, recv_frames_from, send_frames

__all__ = ["Arrivals", "KindHandler", "OnceLog", "Reply", "count_for"]

log = logging.getLogger("porter_mesh.node")

_T = TypeVar("_T")
_Token = TypeVar("_Token")

#: Senders whose drops and losses are counted one by one (more are counted in total only).
_MAX_COUNTED_SENDERS = 1024
#: Messages held for a kind whose handler is still starting (:meth:`Arrivals.expect`); a
#: shard opens in well under a second, and a peer asks a few things of a newcomer.
MAX_HELD = 256

#: Answers the sender of a message of a registered kind: ``reply(kind, payload)``.
Reply = Callable[[str, bytes], None]
#: Handles a registered kind: ``handler(envelope, raw payload, reply)``.
KindHandler = Callable[[Envelope, bytes, Reply], None]


def count_for(counter: collections.Counter[str], sender: str, n: int = 1) -> None:
    """``counter[sender] += n``, for a bounded number of senders."""
    if sender in counter or len(counter) < _MAX_COUNTED_SENDERS:
        counter[sender] += n


class OnceLog:
    """Log a problem once per (reason, origin) at WARNING, then only count it (in total
    and per origin)."""

    def __init__(self, count: Callable[[str, str], None]) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._count = count

    def __call__(self, reason: str, origin: str, message: str, *args: object) -> None:
        self._count(reason, origin)
        key = (reason, origin)
        if key in self._seen or len(self._seen) > 10_000:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(message, *args)
            return
        self._seen.add(key)
        log.warning(message + " (further drops of this kind from %s are only counted)",
                    *args, origin)


def _pending(accepted: list[Accepted], env: Envelope) -> bool:
    """Whether ``env`` repeats a message of the current read that is not journaled yet
    (by sequence, or by idempotency key). Its acknowledgement waits for the original's:
    should the journal refuse that one (a full disk), acknowledging the repeat would
    acknowledge a message nobody kept. Only repeats get here, so the scan is rare."""
    sender, incarnation, seq, msg_id = env.sender, env.incarnation, env.seq, env.msg_id
    keyed = msg_id.startswith(KEY_PREFIX)
    for first, _, _, _, _ in accepted:
        if (first.sender == sender and first.incarnation == incarnation
                and (first.seq == seq or (keyed and first.msg_id == msg_id))):
            return True
    return False


class Arrivals(Generic[_Token]):
    """Reads a node's sockets and carries out what each arrival asks (see the module
    docstring).

    Args:
        config: the node's configuration.
        counters: the node's counters, added to here.
        lost_by: broadcasts lost per sending peer.
        sockets: the node's sockets and read loop.
        links: the node's links to peers, by name.
        acks: the acknowledgements waiting for the next flush.
        clock: the node's hybrid clock.
        roster, receiving, sending: the pure rules.
        inbox: what the application is owed.
        peering: how the node reaches peers (hellos and welcomes go there).
        subs: the channels this node receives.
        carry_out: carries out the actions the roster and the sending rules return.
        envelope: makes an envelope of this node: ``envelope(channel, seq, count,
            recipient=..., kind=...)``.
        send_frames: sends frames on a socket, counting backpressure; False if refused.
        send_control: sends a control message on a socket: ``send_control(sock, kind,
            payload, ident=...)``.
        ends: this node's own sockets (its SUB, ROUTER and PUB, the observer copies
            going to the PUB).
        drop: counts and logs (once) a dropped message.
        refuse: counts and audits something a secured node must not accept.
        app_control: told every other control message addressed to this node:
            ``app_control(kind, sender, body)``.
        incarnation: this node's incarnation (a carried acknowledgement must name it).
    """

    def __init__(self, config: NodeConfig, counters: collections.Counter[str], *,
                 lost_by: collections.Counter[str], sockets: Sockets,
                 links: dict[str, PeerLink], acks: PendingAcks, clock: HybridClock,
                 roster: Roster[_Token],
                 receiving: Receiving, sending: Sender[_Token], inbox: Inbox,
                 peering: Peering[_Token], subs: Subscriptions,
                 carry_out: Callable[[Iterable[RosterAction | SendAction[_Token]]], None],
                 envelope: Callable[..., Envelope],
                 send_frames: Callable[[zmq.Socket[bytes], list[bytes]], bool],
                 send_control: Callable[..., None],
                 ends: Endpoints,
                 drop: Callable[..., None], refuse: Callable[..., None],
                 app_control: Callable[[str, str, dict[str, Any]], None],
                 incarnation: int) -> None:
        self._incarnation = incarnation
        self._name = config.name
        self._counters = counters
        self._lost_by = lost_by
        self._sockets = sockets
        self._links = links
        self._clock = clock
        self._roster = roster
        self._receiving = receiving
        self._sending = sending
        self._inbox = inbox
        self._peering = peering
        self._subs = subs
        self._carry_out = carry_out
        self._envelope = envelope
        self._send_frames = send_frames
        self._send_control = send_control
        self._ends = ends
        self._drop = drop
        self._refuse = refuse
        self._app_control = app_control
        #: The keys: set when a secured node starts.
        self.security: MeshSecurity | None = None
        #: Registered kinds and the handlers of ``unsupported`` answers, by kind.
        self.kind_handlers: dict[str, KindHandler] = {KIND_UNSUPPORTED: self._on_unsupported}
        self.unsupported_handlers: dict[str, KindHandler] = {}
        #: Kinds whose handler comes later (:meth:`expect`), with what arrived for them.
        self._held: dict[str, list[tuple[Envelope, bytes, Reply, bool]]] = {}
        self._acks = acks

    # -- kinds on top of the node ------------------------------------------------------

    def expect(self, kind: str) -> None:
        """``kind``'s handler comes once its state is open: until :meth:`register`,
        messages of it are held (up to :data:`MAX_HELD`), not answered ``unsupported``."""
        if kind not in self.kind_handlers:
            self._held.setdefault(kind, [])

    def register(self, kind: str, handler: KindHandler) -> None:
        """Route ``kind`` to ``handler``; what was held for it is handed over on the
        loop's next turn (its registrar finishes setting up first)."""
        self.kind_handlers[kind] = handler
        held = self._held.pop(kind, None)
        if held:
            asyncio.get_running_loop().call_soon(self._hand_over, kind, held)

    def unregister(self, kind: str) -> None:
        """Stop routing ``kind``; requests held for it are answered ``unsupported``."""
        self.kind_handlers.pop(kind, None)
        self.unsupported_handlers.pop(kind, None)
        for _, _, reply, request in self._held.pop(kind, ()):
            if request:
                reply(KIND_UNSUPPORTED, encode_unsupported(Unsupported(kind)))

    def _hand_over(self, kind: str, held: list[tuple[Envelope, bytes, Reply, bool]]) -> None:
        for env, payload, reply, request in held:
            handler = self.kind_handlers.get(kind)
            if handler is not None:
                self._run_kind(handler, env, payload, reply)
            elif request:  # unregistered in the meantime
                reply(KIND_UNSUPPORTED, encode_unsupported(Unsupported(kind)))

    def send_kind(self, peer: str, kind: str, payload: bytes) -> None:
        """Send a message of a registered ``kind`` to a linked ``peer``."""
        env = self._envelope(C.CHANNEL_CONTROL, 0, 1, kind=kind, recipient=peer)
        self._send_frames(self._links[peer].dealer, encode_direct(env, payload))

    def read_sub(self, sock: zmq.Socket[bytes] | None = None,
                  peer: str | None = None) -> None:
        """Read the shared SUB, or (secured) the SUB of ``peer``."""
        if sock is None:
            sock = self._ends.sub
        if sock is not None:
            # partial, not a lambda: no Python frame of its own per message
            more = self._sockets.read(sock, recv_frames,
                                      functools.partial(self._on_broadcast, peer=peer))
            self._sockets.read_done(more, functools.partial(self.read_sub, sock, peer))

    def read_dealer(self, sock: zmq.Socket[bytes], peer: str | None,
                     seed_name: str | None = None, probe: Target | None = None) -> None:
        more = self._sockets.read(sock, recv_frames,
                                  functools.partial(self._on_dealer, peer=peer,
                                                    seed_name=seed_name, probe=probe))
        self._sockets.read_done(more, functools.partial(self.read_dealer, sock, peer, seed_name,
                                                probe))

    def read_router(self) -> None:
        sock = self._ends.router
        if sock is None:
            return
        accepted: list[Accepted] = []
        if self.security is None:
            more = self._sockets.read(sock, recv_frames,
                                      functools.partial(self._on_direct, accepted=accepted))
        else:
            more = self._sockets.read(sock, recv_frames_from,
                              lambda got: self._on_direct(got[0], accepted, got[1]))
        if more is not None and accepted:
            self._accept(accepted)
        self._sockets.read_done(more, self.read_router)

    def _on_broadcast(self, frames: list[bytes], peer: str | None = None) -> None:
        """One message from a SUB; ``peer``: the authenticated publisher (secured)."""
        if frames and frames[0].startswith(OBSERVE_PREFIX):
            self._on_observed(frames)
            return
        try:
            env, payload = decode_broadcast(frames)
        except ProtocolError as exc:
            self._drop(exc.reason, peer or "?", "dropped a broadcast that cannot be decoded: %s",
                       exc)
            return
        if peer is not None and self._spoofed(env, peer, f"{peer!r} published a message"):
            return
        known = self._heard(env, time.monotonic())
        if known and env.kind is not None:
            self._on_control(env, payload, None)
            return
        receipt = self._receiving.broadcast(env.sender, env.channel, env.incarnation,
                                            env.seq, env.count, known=known)
        if receipt.counter:
            if receipt is UNKNOWN_SENDER:
                self._drop("unknown-peer", env.sender,
                           "broadcast from %s (incarnation %x) which is not on the roster",
                           env.sender, env.incarnation)
                return
            self._count_receipt(receipt, env.sender)
        self._deliver(env, payload, direct=False)

    def _heard(self, env: Envelope, now: float) -> bool:
        """A message from ``env.sender``: merge its time into our clock, mark it heard
        (and carry out the roster changes that follow). Returns whether it is on the
        roster."""
        skew = self._clock.receive(env.hlc, wall_ms())
        known, actions = self._roster.heard(env.sender, env.incarnation, now, skew)
        if actions:
            self._carry_out(actions)
        return known

    def _count_receipt(self, receipt: Receipt, sender: str) -> None:
        """Add a receipt's count; lost broadcasts also per sender, the first logged."""
        n = receipt.n
        self._counters[receipt.counter] += n
        if receipt.counter == LOST_BROADCAST:
            first = sender not in self._lost_by and len(self._lost_by) < _MAX_COUNTED_SENDERS
            count_for(self._lost_by, sender, n)
            if first:
                log.warning("lost %d broadcast(s) from %s (a sequence gap: it sent faster "
                            "than this node read, or the link dropped); further losses from "
                            "%s are only counted (porter-mesh stats %s shows them)",
                            n, sender, sender, self._name)

    def _deliver(self, env: Envelope, payload: bytes, *, direct: bool) -> None:
        try:
            activities = decode_payload(payload, env.count)
        except ProtocolError as exc:
            self._drop(exc.reason, env.sender, "dropped %d activities from %s on %s: %s",
                       env.count, env.sender, env.channel, exc)
            return
        self._inbox.deliver(env, activities, direct=direct)

    def _on_observed(self, frames: list[bytes]) -> None:
        """A copy of a direct message, republished by its receiver for observers."""
        try:
            env, payload = decode_broadcast(frames)
        except ProtocolError as exc:
            self._drop(exc.reason, "?", "dropped an observed message: %s", exc)
            return
        self._deliver(env, payload, direct=True)

    def _accept(self, accepted: list[Accepted]) -> None:
        """Keep, deliver and acknowledge the new direct messages of one read (see
        :meth:`Inbox.accept`), then copy them to observers."""
        if not self._inbox.accept(accepted):
            return
        pub = self._ends.pub
        if pub is None or not self._ends.direct_watched():
            return
        for env, env_bytes, payload, _, _ in accepted:
            # A copy for observers (tail), only while one subscribes to it.
            with contextlib.suppress(zmq.Again):
                send_frames(pub, [encode_topic(env.channel), env_bytes, payload])
        self._sockets.after_send(pub)

    def _on_direct(self, frames: list[bytes],
                   accepted: list[Accepted], user: str | None = None) -> None:
        """One ROUTER message; ``user``: the authenticated sender name (secured)."""
        n = len(frames)
        if n < 2:
            self._drop("frames", user or "?", "dropped a direct message with %d frames", n)
            return
        ident = frames[0]
        # A third frame after the envelope and payload: acknowledgements carried (see
        # porter_mesh.core.session.acks).
        carried = frames.pop() if n == 4 else None
        try:
            env, payload = decode_direct(frames[1:])
        except ProtocolError as exc:
            origin = user or ident[:64].decode("utf-8", "replace")
            self._drop(exc.reason, origin, "dropped a direct message from %s: %s", origin, exc)
            return
        if user is not None and not self._authentic(env, user):
            return
        if env.kind is not None:
            self._on_control(env, payload, ident)
            return
        now = time.monotonic()
        known = self._heard(env, now)
        if carried is not None and known:
            # (From a sender off the roster nothing is taken, its acknowledgements neither.)
            self._on_carried(env, carried, now)
        self._acks.seen(ident, env.sender, env.incarnation)
        room, consumer, held_full = self._inbox.admission(accepted)
        receipt = self._receiving.direct_message(
            env.sender, env.incarnation, env.recipient or "", env.seq, env.count, env.msg_id,
            known=known, me=self._name, room=room, consumer=consumer, held_full=held_full,
            wall=time.time())
        steps = receipt.steps
        if receipt.counter:
            if receipt is UNKNOWN_SENDER:
                self._drop("unknown-peer", env.sender,
                           "direct message from %s which has not said hello", env.sender)
            elif receipt is MISADDRESSED:
                self._drop("misaddressed", env.sender,
                           "direct message from %s for %r reached %s",
                           env.sender, env.recipient, self._name)
            else:
                self._counters[receipt.counter] += receipt.n
        if Step.DELIVER in steps:
            try:
                activities = decode_payload(payload, env.count)
            except ProtocolError as exc:
                # Acknowledged all the same: resending a poison message cannot help.
                self._drop(exc.reason, env.sender, "dropped %d activities from %s: %s",
                           env.count, env.sender, exc)
                self._acks.add(ident, env.seq)
            else:
                # Journal, deliver, then acknowledge, for the whole read (_accept); without
                # a journal the acknowledgement waits for the message to be taken.
                accepted.append((env, frames[1], payload, activities, ident))
        elif steps and not _pending(accepted, env):
            self._acks.add(ident, env.seq)  # a duplicate: acknowledged again

    def _spoofed(self, env: Envelope, authentic: str | None, what: str, *,
                 owner: bool = False) -> bool:
        """Whether a message on a secured connection claims a sender other than the one
        the connection authenticated (``authentic``; ``owner``: compare the name whose
        key the claimed sender speaks with). A spoofed one is refused and audited."""
        claimed = key_name(env.sender) if owner else env.sender
        if claimed == authentic:
            return False
        self._refuse("spoofed-sender", authentic,
                     f"{what} claiming to be from {env.sender[:64]!r}")
        return True

    def _authentic(self, env: Envelope, user: str) -> bool:
        assert self.security is not None
        if self._spoofed(env, user, f"{user!r} sent a message", owner=True):
            return False
        if not self.security.store.trusts(user):
            # Connected before its key was removed from the trusted directory.
            self._refuse("revoked-key", user, f"message from {user!r}, whose key is no "
                         "longer trusted")
            return False
        return True

    def flush_acks(self) -> None:
        """Send the acknowledgements still owed at the end of a flush (no direct message
        carried them), one message per sender."""
        router = self._ends.router
        pending = self._acks.alone()
        if router is None:
            return
        for ident, seqs in pending:
            env = self._envelope(C.CHANNEL_CONTROL, 0, 1, kind=KIND_ACK)
            frames = [ident, *encode_direct(env, encode_ack(Ack(tuple(seqs))))]
            try:
                send_frames(router, frames)
            except zmq.ZMQError:
                self._counters["dropped.ack"] += 1
        self._sockets.after_send(router)

    def _on_dealer(self, frames: list[bytes], peer: str | None,
                   seed_name: str | None = None, probe: Target | None = None) -> None:
        """A reply on the DEALER to ``peer``, or on the ``probe`` DEALER of a re-contact
        target (a seed or a lost peer, expected to be ``seed_name`` when known)."""
        origin = peer or "seed"
        try:
            env, payload = decode_direct(frames)
            expected = peer or seed_name
            if self.security is not None and self._spoofed(
                    env, expected, f"the server of {expected!r} sent a reply"):
                return
            handler = self.kind_handlers.get(env.kind or "")
            if handler is not None and peer is not None:
                self._run_kind(handler, env, payload, self._reply_to(env))
                return
            if env.kind == KIND_ACK:
                answer: Ack | Introduction = decode_ack(payload)
            elif env.kind == KIND_WELCOME:
                answer = decode_welcome(payload)
            else:
                what = "non-control" if env.kind is None else repr(env.kind)
                self._drop("unexpected", origin, "unexpected %s reply from %s", what, origin)
                return
        except ProtocolError as exc:
            self._drop(exc.reason, origin, "dropped a reply from %s: %s", origin, exc)
            return
        if isinstance(answer, Ack):
            self._on_ack(env, answer)
            return
        self._peering.introduced(env, answer, probe)

    def _on_unsupported(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        kind = decode_unsupported(payload).kind  # a bad one is counted by _run_kind
        handler = self.unsupported_handlers.get(kind)
        if handler is None:
            self._drop("unexpected", env.sender, "unexpected 'unsupported' (for %r) from %s",
                       kind, env.sender)
            return
        handler(env, payload, reply)

    def _reply_to(self, env: Envelope, *, ident: bytes | None = None) -> Reply:
        def reply(kind: str, payload: bytes) -> None:
            router = self._ends.router
            if ident is not None and router is not None:
                out = self._envelope(C.CHANNEL_CONTROL, 0, 1, kind=kind, recipient=env.sender)
                self._send_frames(router, [ident, *encode_direct(out, payload)])
            elif env.sender in self._links:
                self.send_kind(env.sender, kind, payload)

        return reply

    def _run_kind(self, handler: KindHandler, env: Envelope, payload: bytes,
                  reply: Reply) -> None:
        try:
            handler(env, payload, reply)
        except PorterError as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            self._drop(f"{env.kind}.{reason}", env.sender, "refused %r from %s: %s", env.kind,
                       env.sender, exc)
        except Exception:
            log.exception("handler for %r failed on a message from %s", env.kind, env.sender)

    def _on_carried(self, env: Envelope, data: bytes, now: float) -> None:
        """Acknowledgements carried by a direct message from ``env.sender``: settled as an
        ``ack`` message's are, if they are for this incarnation of this node."""
        try:
            ack = decode_ack(data)
        except ProtocolError as exc:
            self._drop(exc.reason, env.sender, "dropped the acknowledgements carried by a "
                       "message from %s: %s", env.sender, exc)
            return
        if ack.incarnation != self._incarnation:
            # For an earlier process on this node's address: they are not ours to settle.
            self._counters["ack.carried-stale"] += 1
            return
        self._counters["ack.carried"] += 1
        self._carry_out(self._sending.acked(env.sender, ack.firsts, now))

    def _on_ack(self, env: Envelope, ack: Ack) -> None:
        now = time.monotonic()
        self._heard(env, now)
        self._carry_out(self._sending.acked(env.sender, ack.firsts, now))

    def _on_control(self, env: Envelope, payload: bytes, ident: bytes | None) -> None:
        handler = self.kind_handlers.get(env.kind or "")
        if handler is not None:
            self._run_kind(handler, env, payload, self._reply_to(env, ident=ident))
            return
        kind = env.kind or ""
        held = self._held.get(kind)
        if held is not None:
            # Its handler is still starting (a shard opening): kept for it, so that the
            # asker is neither turned away by 'unsupported' nor left to its timeout.
            if len(held) < MAX_HELD:
                held.append((env, payload, self._reply_to(env, ident=ident), ident is not None))
                self._counters["held.kind-starting"] += 1
            else:
                self._drop("kind-starting", env.sender, "dropped %r from %s: %d messages "
                           "already wait for its handler to start", kind, env.sender, MAX_HELD)
            return
        if ident is not None and kind not in (KIND_HELLO, KIND_UNSUPPORTED):
            # A request of a protocol this node does not run (e.g. knowledge sync to a
            # node without a shard): say so, so that the asker turns elsewhere at once.
            self._reply_to(env, ident=ident)(KIND_UNSUPPORTED,
                                             encode_unsupported(Unsupported(kind)))
            return
        if kind == KIND_HEARTBEAT:
            beat = self._decode_body(env, decode_heartbeat, payload)
            if beat is not None:
                self._on_heartbeat(env, beat)
        elif kind == KIND_HELLO and ident is not None:
            hello = self._decode_body(env, decode_hello, payload)
            if isinstance(hello, Introduction):
                self._peering.introduced(env, hello, None)
            router = self._ends.router
            if router is not None:
                self._send_control(router, KIND_WELCOME,
                                   encode_welcome(self._peering.introduction()), ident=ident)
        elif kind == KIND_BYE:
            if self._decode_body(env, decode_bye, payload) is not None:
                self._carry_out(self._roster.left(env.sender, env.incarnation,
                                                  time.monotonic()))
        else:
            # drain, halt, or a kind of the application's: its listeners decide.
            body = self._decode_body(env, decode_control, payload)
            if body is None or body.get("to") not in (None, self._name):
                return
            self._app_control(kind, env.sender, body)

    def _decode_body(self, env: Envelope, decode: Callable[[bytes], _T],
                     payload: bytes) -> _T | None:
        """A control body decoded by ``decode``; None (counted and logged once) when it
        is malformed."""
        try:
            return decode(payload)
        except ProtocolError as exc:
            self._drop(exc.reason, env.sender, "dropped control %r from %s: %s", env.kind,
                       env.sender, exc)
            return None

    def _on_heartbeat(self, env: Envelope, beat: Heartbeat) -> None:
        info = self._roster.peers.get(env.sender)
        if info is None or info.incarnation != env.incarnation:
            return
        info.draining = beat.draining
        for channel, last in beat.last_seqs.items():
            if self._subs.receives(channel):
                try:
                    receipt = self._receiving.position(env.sender, channel,
                                                       env.incarnation, last)
                except ProtocolError as exc:
                    self._drop(exc.reason, env.sender, "bad heartbeat from %s: %s",
                               env.sender, exc)
                    return
                info.last_seqs[channel] = last
                if receipt.counter:
                    self._count_receipt(receipt, env.sender)
