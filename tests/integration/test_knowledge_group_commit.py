"""Group commit of Remembers at its edges: a burst larger than one group, and a group's
sync cancelled under its callers (as ``asyncio.run`` cancels what is left at exit).

Two real nodes on 127.0.0.1, each with a replica on a real disk.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from porter_mesh.core.knowledge import Record
from porter_mesh.errors import KnowledgeError
from porter_mesh.node.knowledge import MAX_GROUP
from tests.integration.test_knowledge_closed import remember_activity as remember
from tests.integration.test_knowledge_closed import replica_pair

pytestmark = pytest.mark.timeout(120)




def test_a_burst_larger_than_a_group_goes_in_several_groups_every_one_kept(
        tmp_path: Path) -> None:
    burst = 2 * MAX_GROUP + 40

    async def run() -> None:
        async with replica_pair(tmp_path) as (_, theirs, mine):
            try:
                kept = await asyncio.wait_for(asyncio.gather(
                    *(mine.aremember(remember(f"finding {i}")) for i in range(burst))), 60)
                assert sorted(r.seq for r in kept) == list(range(1, burst + 1))
                # At most MAX_GROUP a group: the loop ran between them.
                assert mine.counters["remember.grouped"] == burst
                assert mine.counters["remember.groups"] >= 3
                await theirs._wait(lambda: theirs.shard.state.top_seq("second") == burst, 30)
            finally:
                await theirs.aclose()

    asyncio.run(run())


def test_a_cancelled_sync_answers_its_callers_and_the_next_remember_is_kept(
        tmp_path: Path) -> None:
    async def run() -> None:
        async with replica_pair(tmp_path) as (_, theirs, mine):
            try:
                first = [asyncio.ensure_future(mine.aremember(remember(f"a {i}")))
                         for i in range(8)]
                for _ in range(1000):  # until the first group's sync runs
                    if mine._syncing is not None:
                        break
                    await asyncio.sleep(0)
                assert mine._syncing is not None
                # More Remembers queue behind the running sync, for the next group.
                second = [asyncio.ensure_future(mine.aremember(remember(f"b {i}")))
                          for i in range(8)]
                await asyncio.sleep(0)
                mine._syncing.cancel()
                outcomes = await asyncio.wait_for(
                    asyncio.gather(*first, *second, return_exceptions=True), 20)
                # Every caller is answered: stored, or told it is not known durable.
                assert all(isinstance(o, (Record, KnowledgeError)) for o in outcomes), outcomes
                assert any(isinstance(o, KnowledgeError) for o in outcomes), outcomes
                # And the replica goes on: the next Remember is written, synced, sent.
                later = await asyncio.wait_for(mine.aremember(remember("later")), 20)
                top = later.seq
                await theirs._wait(lambda: theirs.shard.state.top_seq("second") >= top, 20)
            finally:
                await theirs.aclose()

    asyncio.run(run())
