"""The mesh's protocol as pure sessions: rules that take decoded frames and explicit
times and say what to do, with no socket, no event loop and no clock of their own.

* :mod:`.frames`: the frames as typed values and the actions the sessions share;
* :mod:`.sending`: queues, runs, numbering and the outbox's outcomes (send, resend,
  settle, fail), which the node and the endpoint both drive;
* :mod:`.roster`: adverts vetted and what each change of the roster asks (connect,
  disconnect, forget a restarted peer's streams, fail a seat's sends);
* :mod:`.keys`: the receiver's idempotency-key window (wall time passed in);
* :mod:`.acks`: the acknowledgements owed until the next flush, and which of them ride
  on a direct message to their sender (a reply, the next request) instead of going
  alone;
* :mod:`.receiving`: what to do with each arrival, direct (new, duplicate, held, or
  refused for want of room) or broadcast (gaps and repeats counted), as ordered
  steps that the node and the endpoint both carry out;
* :mod:`.endpoint`: one node's end composed of those pure pieces, the sequence trackers
  and the roster (sending, receiving, broadcasts), returning ordered actions; the unit
  tests drive endpoints over an in-memory wire;
* :mod:`.sync`: knowledge sync (asked ranges, the catch-up queue, gap pulls, digests,
  refusals, timeouts) over the replica's state, returning ordered actions for the
  knowledge driver; its unit tests drive sessions over real shards on an in-memory wire.
"""
