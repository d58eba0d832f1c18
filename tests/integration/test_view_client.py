"""Asking peers for their view (``stats``) over real nodes on loopback, on a node that
also runs a knowledge replica: both protocols get their own ``unsupported`` answers."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from porter_mesh.adapters.shard import Shard
from porter_mesh.core.control import KIND_STATS, KIND_STATS_REPLY, KIND_UNSUPPORTED
from porter_mesh.core.envelope import encode_control
from porter_mesh.errors import PorterError, UnknownPeerError
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Node
from porter_mesh.node.views import ViewClient, ViewUnsupported

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.05)  # polling a condition with a deadline


async def _scenario(tmp_path: Path) -> None:
    mesh = f"views{os.getpid()}-{time.monotonic_ns()}"

    def node(name: str, *seeds: Node) -> Node:
        return Node(name=name, mesh=mesh, discovery=False, data_dir=tmp_path / name,
                    seeds=tuple(f"127.0.0.1:{s.router_port}" for s in seeds))

    asker = node("asker")
    knowledge = Knowledge(asker, Shard(tmp_path / "asker-kg", agent="asker"))
    client = ViewClient(asker)
    knowledge.start()
    try:
        await _exercise(asker, knowledge, client, node)
    finally:
        await knowledge.aclose()


async def _exercise(asker: Node, knowledge: Knowledge, client: ViewClient,
                    node: Callable[..., Node]) -> None:
    async with asker:
        plain, old, mute = node("plain", asker), node("old", asker), node("mute", asker)
        asked: list[str] = []

        def counted(env: object, payload: bytes, reply: Callable[[str, bytes], None]) -> None:
            asked.append("plain")
            reply(KIND_STATS_REPLY, orjson.dumps(plain.view()))

        plain.register_kind(KIND_STATS, counted)
        # A node of an older porter-mesh: it does not know the request.
        old.register_kind(KIND_STATS, lambda env, payload, reply: reply(
            KIND_UNSUPPORTED, encode_control({"k": KIND_STATS})))
        mute.register_kind(KIND_STATS, lambda env, payload, reply: None)
        async with plain, old, mute:
            await asker.wait_for_peers(["plain", "old", "mute"], 20)
            first, second = await asyncio.gather(client.ask("plain", 10),
                                                 client.ask("plain", 10))
            assert first["name"] == "plain" and first is second
            assert asked == ["plain"]  # one request in flight, shared
            assert not client.in_flight("plain")
            with pytest.raises(ViewUnsupported, match="old does not answer stats"):
                await client.ask("old", 10)
            with pytest.raises(TimeoutError, match=r"mute: no answer to stats within 0\.5s"):
                await client.ask("mute", 0.5)
            assert not client.in_flight("mute")
            with pytest.raises(UnknownPeerError):
                await client.ask("nobody", 1)
            answers = await client.ask_all(["plain", "old"], 10)
            assert answers["plain"]["name"] == "plain"  # type: ignore[index]
            assert isinstance(answers["old"], PorterError)
            # The replica got its own "unsupported" answers (none of them runs one).
            await _until(lambda: {"plain", "old", "mute"} <= knowledge.without_replica(), 20,
                         "the replica learning who runs no knowledge sync")


def test_views_and_knowledge_sync_share_the_unsupported_answers(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
