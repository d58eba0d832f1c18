"""``porter-mesh remember ABOUT FINDING``: add an observation to the team's knowledge graph.

The command checks the fields, then joins the mesh as the human user (a seat
``porter-ui-<hex>``; the records it writes are ``porter-ui``'s) with a throw-away
replica (see :mod:`porter_mesh.cli.cmd_kgsync`), catches it up from a peer first (so
that the replica knows every record ``porter-ui`` wrote before, wherever, and never
reuses one of its sequence numbers), waits until the peers it found subscribe to
it, stores the observation, broadcasts it, and then asks a peer whether it holds the
record (a one-record pull), broadcasting again until one does. It exits 0 once a peer
holds it; 1 with the reason when no peer keeps a replica or none confirms in time; 2 for
a bad field. The observation's IRI is printed on stdout (``porter-mesh recall`` finds it;
``retract`` needs it).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from porter_mesh.cli.cmd_kgsync import (
    SECONDS_OPTIONS,
    add_online_options,
    catch_up,
    find_replica,
    online_replica,
)
from porter_mesh.cli.common import add_mesh_options, own_seat, refuse_negative, run
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.knowledge import Observation, Record, format_timestamp, observation_iri
from porter_mesh.errors import ActivityError, KnowledgeError, PorterError
from porter_mesh.node.knowledge import Knowledge

#: Seconds one confirmation probe waits for a peer's answer.
PROBE_TIMEOUT = 1.0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "remember", help="add an observation to the knowledge graph as porter-ui",
        description="Store ABOUT/FINDING as an observation by porter-ui and replicate it; "
        "exits 0 once a peer holds it.",
    )
    parser.add_argument("about", metavar="ABOUT",
                        help="what it is about, e.g. urn:porter:file:server.ts")
    parser.add_argument("finding", metavar="FINDING", help="the fact, in words")
    parser.add_argument("--severity", help="a short token: info, low, medium, high...")
    parser.add_argument("--context", metavar="TASK", help="the task, urn:porter:task:<id>")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for a peer to confirm (default %(default)s)")
    add_mesh_options(parser)
    add_online_options(parser)
    parser.set_defaults(func=main)


def build_activity(about: str, finding: str, severity: str | None,
                   context: str | None) -> Activity:
    """The ``Remember`` activity ``porter-mesh remember`` stores and logs.

    Raises:
        ActivityError: a field breaks the profile.
    """
    note: dict[str, Any] = {"type": "Note", "about": about, "content": finding}
    if severity:
        note["severity"] = severity
    data: dict[str, Any] = {"type": "Remember", "actor": own_seat(),
                            "summary": (finding.splitlines() or [finding])[0][:200] or about,
                            "object": note}
    if context:
        data["context"] = context
    return Activity.from_dict(data)


async def confirm(knowledge: Knowledge, record: Record, timeout: float, *,
                  kept: bool = False) -> str:
    """Ask peers, in turn, whether they hold ``record``; broadcast it again after each
    answer without it. The name of the first peer that holds it.

    Args:
        knowledge: porter-ui's replica.
        record: the record to confirm.
        timeout: seconds.
        kept: the replica is kept (``--data-dir``), so the record is not lost.

    Raises:
        KnowledgeError: no peer confirmed within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    attempt = 0
    while time.monotonic() < deadline:
        peers = sorted(p.name for p in knowledge.node.peers())
        if not peers:
            break
        peer = peers[attempt % len(peers)]
        attempt += 1
        try:
            left = max(0.05, min(PROBE_TIMEOUT, deadline - time.monotonic()))
            if await knowledge.peer_holds(peer, record.origin, record.seq, left):
                return peer
        except (TimeoutError, PorterError):
            pass  # no answer (or it left): ask again, maybe another peer
        knowledge.async_broadcast(record)
    if kept:
        raise KnowledgeError(
            f"the observation is stored in porter-ui's replica ({record.origin} "
            f"#{record.seq}) but no peer confirmed holding it within {timeout}s; it "
            "replicates when porter-ui next joins with this --data-dir (porter-mesh kgsync)")
    raise KnowledgeError(
        f"no peer confirmed holding the observation ({record.origin} #{record.seq}) within "
        f"{timeout}s; it was broadcast but may be stored nowhere: check with porter-mesh "
        "recall and run this command again (or raise --timeout)")


def main(args: argparse.Namespace) -> int:
    try:
        activity = build_activity(args.about, args.finding, args.severity, args.context)
        # Check the fields before joining the mesh, as the replica will.
        Observation(args.about, args.finding, C.HUMAN_AGENT, format_timestamp(time.time()),
                    args.context, args.severity)
    except (ActivityError, KnowledgeError) as exc:
        print(f"porter-mesh remember: {exc}", file=sys.stderr)
        return 2
    refused = refuse_negative(args, *SECONDS_OPTIONS)
    if refused is not None:
        return refused

    async def body() -> int:
        async with online_replica(args, writes=True) as knowledge:
            peers = await find_replica(knowledge, args.wait)
            await catch_up(knowledge, args.catchup_timeout, quiet=True)
            try:
                await knowledge.node.wait_for_subscribers(C.CHANNEL_CONTROL, len(peers),
                                                          args.wait)
            except TimeoutError as exc:  # the confirmation below rebroadcasts anyway
                print(f"porter-mesh remember: warning: {exc}", file=sys.stderr)
            record = knowledge.async_remember(activity)
            holder = await confirm(knowledge, record, args.timeout,
                                   kept=args.data_dir is not None)
        print(observation_iri(record.body.id))
        print(f"remembered as porter-ui #{record.seq}; {holder} holds it", file=sys.stderr)
        return 0

    return run(body)
