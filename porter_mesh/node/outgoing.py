"""Sending: what the sending rules and the roster ask, carried out onto the sockets.

Theory of operation
-------------------
The pure rules (:mod:`porter_mesh.core.session.sending` and
:mod:`porter_mesh.core.session.roster`) answer every send, flush, acknowledgement and
timer with a list of actions. :meth:`Outgoing.carry_out` is the one place they are
carried out, in their order:

* a frame to send: a broadcast goes onto the PUB (a full PUB drops it, counted); a
  direct message goes onto the recipient's DEALER, with the acknowledgements owed to
  that recipient riding on it when its advert says it reads them
  (:mod:`porter_mesh.core.session.acks`). Once a DEALER refuses a message (its
  high-water mark), the recipient's later frames of the same list wait for their resend,
  so that the stream stays in order;
* a completion settled or failed (the caller's future);
* a link to open, close or open again, a roster change to tell, a peer's receiving
  state to forget (:mod:`porter_mesh.node.peering` does the socket work);
* a counter, a dropped message, a refusal for the audit log.

Every envelope this node sends is made here (:meth:`Outgoing.envelope`), stamped with
the node's hybrid clock.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

import zmq

from porter_mesh.core import constants as C
from porter_mesh.core.control import Ack, encode_ack
from porter_mesh.core.envelope import Envelope, encode_broadcast, encode_direct, make_msg_id
from porter_mesh.core.hlc import HybridClock
from porter_mesh.core.peers import PeerTable
from porter_mesh.core.session.acks import PendingAcks
from porter_mesh.core.session.frames import (
    BroadcastFrame,
    Count,
    DirectFrame,
    Fail,
    SendFrame,
    Settle,
)
from porter_mesh.core.session.receiving import Receiving
from porter_mesh.core.session.roster import (
    Connect,
    Disconnect,
    Drop,
    Forget,
    PeerChanged,
    Reconnect,
    Refuse,
    RosterAction,
)
from porter_mesh.core.session.sending import SendAction, Sender
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.node.completions import Completion, fail_all, send_error, settle
from porter_mesh.node.endpoints import Endpoints
from porter_mesh.node.inbox import wall_ms
from porter_mesh.node.links import PeerLink, Sockets
from porter_mesh.node.peering import Peering
from porter_mesh.node.zio import send_frames

__all__ = ["Outgoing"]

class Outgoing:
    """Carries out what the sending rules and the roster return (see the module
    docstring).

    Args:
        name, incarnation: this node's.
        max_pending: the outbox's bound per recipient (named in a refused send's error).
        counters: the node's counters, added to here.
        clock: the node's hybrid clock (every envelope's timestamp).
        sending, receiving: the pure rules.
        peers: the roster's table (whether a recipient reads carried acknowledgements).
        sockets: the node's sockets (after a send, the read loop looks again).
        links: the links to peers, by name.
        acks: the acknowledgements owed until the next flush.
        ends: this node's own sockets (broadcasts leave by its PUB, None before start
            and after close).
        peering: how the node reaches peers (links opened and closed, refusals).
        drop: counts and logs (once) a dropped message.
        refuse: counts and audits something a secured node must not accept.
    """

    def __init__(self, name: str, incarnation: int, *, max_pending: int,
                 counters: collections.Counter[str], clock: HybridClock,
                 sending: Sender[Completion], receiving: Receiving, peers: PeerTable,
                 sockets: Sockets, links: dict[str, PeerLink], acks: PendingAcks,
                 ends: Endpoints,
                 peering: Callable[[], Peering[Completion]],
                 drop: Callable[..., None], refuse: Callable[..., None]) -> None:
        self._name = name
        self._incarnation = incarnation
        self._max_pending = max_pending
        self._counters = counters
        self._clock = clock
        self._sending = sending
        self._receiving = receiving
        self._peers = peers
        self._sockets = sockets
        self._links = links
        self._acks = acks
        self._ends = ends
        self._peering = peering
        self._drop = drop
        self._refuse = refuse

    def envelope(self, channel: str, seq: int, count: int, *, recipient: str | None = None,
                 kind: str | None = None, ref: str | None = None,
                 msg_id: str | None = None, trace: TraceContext | None = None) -> Envelope:
        """An envelope of this node, stamped now."""
        return Envelope(
            C.PROTOCOL_VERSION, msg_id or make_msg_id(self._incarnation, channel, seq),
            self._name, channel, seq, self._incarnation, self._clock.now(wall_ms()),
            recipient, ref, count, kind, *(trace or (None, None)),
        )

    def carry_out(self, actions: Iterable[RosterAction | SendAction[Completion]]) -> None:
        """Carry out ``actions`` in their order (see the module docstring)."""
        blocked: set[str] | None = None
        pub = None
        sent = False
        for action in actions:
            # type() tests, not isinstance(): no call per action (every message has two).
            if type(action) is SendFrame:
                frame = action.frame
                if type(frame) is DirectFrame:
                    recipient = frame.recipient
                    link = self._links.get(recipient)
                    if link is None or (blocked is not None and recipient in blocked):
                        continue
                    env = self.envelope(C.DIRECT_PREFIX + recipient, frame.seq, frame.count,
                                        recipient=recipient, msg_id=frame.msg_id,
                                        trace=frame.trace)
                    frames = encode_direct(env, frame.payload)
                    carried = self.carry_acks(recipient, frames) if self._acks else None
                    if not self.send_frames(link.dealer, frames):
                        blocked = blocked or set()
                        blocked.add(recipient)
                        if carried is not None:
                            for seq in carried[1]:  # they go alone, with the flush
                                self._acks.add(carried[0], seq)
                    else:
                        sent = True
                elif isinstance(frame, BroadcastFrame):
                    pub = self._ends.pub
                    if pub is None:
                        continue
                    env = self.envelope(frame.channel, frame.seq, frame.count,
                                        kind=frame.kind, trace=frame.trace)
                    try:
                        send_frames(pub, encode_broadcast(env, frame.payload))
                    except zmq.Again:
                        self._counters["dropped.pub-hwm"] += frame.count
            elif type(action) is Settle:
                for done in action.tokens:
                    settle(done)
            elif isinstance(action, Fail):
                fail_all(action.tokens, send_error(
                    action, me=self._name, max_pending=self._max_pending,
                    refusal=self._peering().refusal(action.recipient)))
            elif type(action) is Count:
                self._counters[action.name] += action.n
            elif isinstance(action, PeerChanged):
                self._peering().changed(action.event)
            elif isinstance(action, Connect):
                self._peering().connect(action.advert)
            elif isinstance(action, Disconnect):
                self._peering().disconnect(action.name)
            elif isinstance(action, Reconnect):
                self._peering().disconnect(action.advert.name)
                self._peering().connect(action.advert)
            elif isinstance(action, Forget):
                self._receiving.forget(action.name)
            elif isinstance(action, Drop):
                self._drop(action.reason, action.peer, "%s", action.detail)
            else:
                assert isinstance(action, Refuse)
                self._refuse(action.event, action.peer, action.detail, key=action.key)
        if pub is not None:
            self._sockets.after_send(pub)
        if sent:
            self._sockets.busy()  # its acknowledgement, or an answer, may follow at once

    def carry_acks(self, recipient: str,
                   frames: list[bytes]) -> tuple[bytes, list[int]] | None:
        """Add to a direct message's ``frames`` the acknowledgements owed to its
        ``recipient``, if it reads them there (:mod:`porter_mesh.core.session.acks`).
        Returns what was taken, to give back if the message cannot be sent."""
        info = self._peers.get(recipient)
        advert = info.advert if info is not None else None
        if advert is None or not advert.carried_acks:
            return None
        carried = self._acks.carry(recipient, advert.incarnation)
        if carried is not None:
            frames.append(encode_ack(Ack(tuple(carried[1]), advert.incarnation)))
        return carried

    def send_frames(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> bool:
        """Send ``frames`` on ``sock`` without waiting; False (counted) if its
        high-water mark refused them."""
        try:
            send_frames(sock, frames)
        except zmq.Again:
            self._counters["backpressure.dealer"] += 1
            return False
        finally:
            self._sockets.after_send(sock)
        return True

    def send_control(self, sock: zmq.Socket[bytes], kind: str, payload: bytes, *,
                     ident: bytes | None = None) -> None:
        """Send one control message of ``kind`` on ``sock`` (to ``ident`` on a ROUTER)."""
        frames = encode_direct(self.envelope(C.CHANNEL_CONTROL, 0, 1, kind=kind), payload)
        if ident is not None:
            frames = [ident, *frames]
        self.send_frames(sock, frames)

    def publish_control(self, kind: str, payload: bytes) -> None:
        """Broadcast one control message on ``control``, next in its sequence."""
        if self._ends.pub is None:
            return
        self.carry_out([self._sending.broadcast(C.CHANNEL_CONTROL, payload, kind=kind)])
