"""The mesh's protocol as pure sessions: rules that take decoded frames and explicit
times and say what to do, with no socket, no event loop and no clock of their own.

* :mod:`.keys`: the receiver's idempotency-key window (wall time passed in);
* :mod:`.receiving`: the verdict on each arrival of a direct message (new, duplicate,
  held, or refused for want of room), which the node carries out.
"""
