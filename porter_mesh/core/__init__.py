"""The pure protocol core.

Everything here takes bytes, values and an explicit ``now`` and returns values or events.
Nothing here imports ``zmq``, ``asyncio``, ``zeroconf`` or touches the disk, so every
module is unit-tested without a socket (a test in ``tests/unit`` guards this rule).
"""
