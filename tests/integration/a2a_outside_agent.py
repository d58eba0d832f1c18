"""An A2A agent that is not on the mesh, written on the A2A SDK's server side.

Run as ``python a2a_outside_agent.py``: it serves on a free loopback port and prints
``serving http://127.0.0.1:PORT`` once it listens. Its skill: the first message is
answered with an artifact ``answer.txt`` holding the text in capitals; a text that
contains ``ask`` first asks which language (``input-required``) and puts the answer in
``language.txt``; a text that contains ``slow`` keeps the task working until it is
cancelled. With ``--hold`` every task stays working until it is cancelled (what the A2A
conformance kit expects of the agent it tests).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import uuid

import uvicorn
from a2a.helpers.proto_helpers import get_message_text
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from starlette.applications import Starlette

HOLD = "--hold" in sys.argv


def status(ctx: RequestContext, state: int, text: str) -> TaskStatusUpdateEvent:
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_AGENT,
                      parts=[Part(text=text)], task_id=ctx.task_id, context_id=ctx.context_id)
    return TaskStatusUpdateEvent(task_id=ctx.task_id, context_id=ctx.context_id,
                                 status=TaskStatus(state=state, message=message))


def artifact(ctx: RequestContext, name: str, text: str) -> TaskArtifactUpdateEvent:
    return TaskArtifactUpdateEvent(task_id=ctx.task_id, context_id=ctx.context_id,
                                   artifact=Artifact(artifact_id=name, name=name,
                                                     parts=[Part(text=text)]))


class Shouter(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = get_message_text(context.message) if context.message else ""
        if context.current_task is None:
            await event_queue.enqueue_event(Task(
                id=context.task_id, context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message] if context.message else []))
            await event_queue.enqueue_event(status(context, TaskState.TASK_STATE_WORKING,
                                                   "reading the task"))
            await event_queue.enqueue_event(artifact(context, "answer.txt", text.upper()))
            if "slow" in text or HOLD:
                await asyncio.Event().wait()  # until cancelled
            if "ask" in text:
                await event_queue.enqueue_event(status(
                    context, TaskState.TASK_STATE_INPUT_REQUIRED, "Which language?"))
                return
        else:
            await event_queue.enqueue_event(artifact(context, "language.txt", text))
        await event_queue.enqueue_event(status(context, TaskState.TASK_STATE_COMPLETED,
                                               "All done"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        print(f"cancelled {context.task_id}", flush=True)
        await event_queue.enqueue_event(status(context, TaskState.TASK_STATE_CANCELED,
                                               "cancelled"))


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="shouter", description="Shouts the task back", version="1.0.0",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        supported_interfaces=[AgentInterface(url=url + "/", protocol_binding="JSONRPC",
                                             protocol_version="1.0")],
        skills=[AgentSkill(id="shout", name="shout", description="capitals",
                           tags=["text"])])
    handler = DefaultRequestHandler(agent_executor=Shouter(), task_store=InMemoryTaskStore(),
                                    agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, "/")])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    sock.listen(16)
    print(f"serving {url}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
