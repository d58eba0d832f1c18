"""Acknowledgements owed, and which of them ride on a direct message instead of going
alone.

Theory of operation
-------------------
A receiver owes an acknowledgement for each direct message it journaled (or, without a
journal, that the application took). It keeps them until the next flush, by the
sender's ROUTER identity, so that every acknowledgement owed to one sender after a read
goes in one ``ack`` message (the reply on the connection the messages came in on).

Most direct messages of a request/reply exchange are answered at once: the handler of
a request queues its reply to the same peer before the flush that would send the
acknowledgement. As TCP delays its ACK to carry it on the next data segment, the
acknowledgements owed to a peer then travel on that reply (a *carried*
acknowledgement) instead of in an ``ack`` message of their own: one message and one
wake-up less on each side per exchange. Nothing waits for a reply that does not come:
what no direct message carried by the end of the flush goes alone, in the same flush,
as before.

An acknowledgement is carried only:

* to the sender it is owed to, by name and incarnation (``carry(recipient,
  incarnation)`` with the incarnation the roster knows the recipient by): a peer that
  restarted must not settle its new messages with the old ones' numbers, so the carried
  acknowledgement also names the incarnation it is for and the receiver of it checks;
* when the sender announced that it reads carried acknowledgements (its advert's
  ``carried_acks``); a node of an earlier version gets ``ack`` messages only.

Nothing here decides *when* an acknowledgement is owed: the receiving rules and the
journal do, and only what they owe is added here, so a carried acknowledgement promises
no more than an ``ack`` message would (journaled first).

Pure: no sockets, no clock.
"""

from __future__ import annotations

__all__ = ["PendingAcks"]

#: Owners remembered between two flushes at most (a flood of new connections only
#: sends their acknowledgements alone).
_MAX_OWNERS = 4096


class PendingAcks(dict[bytes, list[int]]):
    """The acknowledgements owed until the next flush: the sequence numbers owed, by the
    sender's ROUTER identity (read it as a mapping; change it through the methods).

    A ``dict`` itself, so that ``bool(pending)`` (asked at every flush and after every
    read) costs no Python call.
    """

    __slots__ = ("_ident_of", "_owner")

    def __init__(self) -> None:
        super().__init__()
        # ROUTER identity -> (sender, incarnation) it was last seen for, and back.
        self._owner: dict[bytes, tuple[str, int]] = {}
        self._ident_of: dict[tuple[str, int], bytes] = {}

    def seen(self, ident: bytes, sender: str, incarnation: int) -> None:
        """A direct message from ``sender`` (``incarnation``) came in through ``ident``:
        acknowledgements owed to ``ident`` may ride on a message to that sender."""
        owner = (sender, incarnation)
        if self._owner.get(ident) == owner:
            return
        if len(self._owner) >= _MAX_OWNERS:
            self._forget_owners()
        old = self._owner.get(ident)
        if old is not None:
            self._ident_of.pop(old, None)
        self._owner[ident] = owner
        self._ident_of[owner] = ident

    def add(self, ident: bytes, seq: int) -> None:
        """Owe the acknowledgement of direct message ``seq`` to ``ident``."""
        seqs = self.get(ident)
        if seqs is None:
            self[ident] = [seq]
        else:
            seqs.append(seq)

    def carry(self, recipient: str, incarnation: int) -> tuple[bytes, list[int]] | None:
        """Take the acknowledgements owed to ``recipient`` in ``incarnation``, to ride on
        a direct message to it (the caller checked that it reads them). Returns the
        identity they were owed to and their sequence numbers, or None.

        Give them back with :meth:`add` if that message cannot be sent.
        """
        ident = self._ident_of.get((recipient, incarnation))
        if ident is None:
            return None
        seqs = self.pop(ident, None)
        if seqs is None:
            return None
        return ident, seqs

    def alone(self) -> list[tuple[bytes, list[int]]]:
        """Take everything still owed, to go in ``ack`` messages of its own, one per
        identity."""
        owed = list(self.items())
        self.clear()
        if len(self._owner) > _MAX_OWNERS // 2:
            self._forget_owners()
        return owed

    def _forget_owners(self) -> None:
        self._owner.clear()
        self._ident_of.clear()
