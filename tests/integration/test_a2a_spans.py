"""The A2A gateway's ``send`` spans over a real node on loopback: a send given up half
way (the client went away while the gateway waited for its agent) still ends its span,
as an error, instead of leaving it open in the ring for good."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from pathlib import Path

import pytest

pytest.importorskip("a2a.server", reason="the A2A SDK is not installed: pip install "
                    "'porter-mesh[a2a]'")
pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed: "
                    "pip install 'porter-mesh[otel]'")

from porter_mesh.core.as2 import Activity
from porter_mesh.gateways.a2a.server import A2AGateway
from porter_mesh.node.node import Node
from porter_mesh.tracing.seat import SeatSpans
from tests.integration.test_view_client import _until

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

_meshes = itertools.count()
CONTEXT = "urn:porter:task:a2aspan1"


async def _scenario(tmp_path: Path) -> None:
    mesh = f"a2aspans{os.getpid()}-{next(_meshes)}"
    spans = SeatSpans.start("gateway")
    assert spans is not None
    ring = spans.tracing.ring
    node = Node(name="gateway", mesh=mesh, discovery=False, data_dir=tmp_path / "gateway")
    gateway = A2AGateway(node, ["absent"], data_dir=None, settle=30.0, spans=spans)
    try:
        async with node:
            offer = Activity.from_dict({"type": "Offer", "actor": "gateway",
                                        "summary": "do it", "context": CONTEXT})
            sending = asyncio.ensure_future(gateway.deliver("task:absent", offer))
            # The gateway waits (up to settle) for the agent to appear, its span open.
            await _until(lambda: ring.stats()["open"] == 1, 20, "the send span opening")
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
            assert ring.stats()["open"] == 0
            [record] = ring.find(context=CONTEXT)
            assert record["name"] == "send task:absent" and record["status"] == "error"
            assert "CancelledError" in record["status_message"]
    finally:
        await gateway.aclose()


def test_a_send_given_up_half_way_ends_its_span(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
