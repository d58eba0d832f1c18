"""A delivered message written out: one JSON object per line for programs, or one line
for people. ``porter-mesh tail``, ``request`` and ``node --print`` print these, and the
demo keeps its transcript in the JSON form.
"""

from __future__ import annotations

import time

import orjson

from porter_mesh.core.hlc import hlc_physical_ms
from porter_mesh.node.node import Message

__all__ = ["message_json", "message_line", "sent_at"]


def sent_at(msg: Message) -> float:
    """When the sender sent ``msg``, in Unix seconds (the physical part of its HLC)."""
    return hlc_physical_ms(msg.envelope.hlc) / 1000


def message_json(msg: Message) -> str:
    """A message as one JSON line: time, channel, sender, envelope fields, activity."""
    env = msg.envelope
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sent_at(msg)))
    return orjson.dumps({
        "time": f"{stamp}.{hlc_physical_ms(env.hlc) % 1000:03d}Z",
        "channel": msg.channel, "sender": msg.sender, "seq": msg.seq, "direct": msg.direct,
        "envelope": {"version": env.version, "msg_id": env.msg_id, "incarnation": env.incarnation,
                     "hlc": env.hlc, "recipient": env.recipient, "ref": env.ref,
                     "count": env.count},
        "activity": msg.activity.to_dict(),
    }).decode()


def message_line(msg: Message) -> str:
    """A message for people: local time, channel, sender, type, [context] summary."""
    act = msg.activity
    summary = act.summary or ""
    if not summary and isinstance(act.object, str):
        summary = act.object
    context = f" [{act.context}]" if act.context else ""
    ms = hlc_physical_ms(msg.envelope.hlc) % 1000
    clock = time.strftime("%H:%M:%S", time.localtime(sent_at(msg)))
    return (f"{clock}.{ms:03d} {msg.channel:<16} {msg.sender:<16} {act.type:<9}{context} "
            f"{summary}")
