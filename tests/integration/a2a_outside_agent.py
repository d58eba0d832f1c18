"""An A2A agent that is not on the mesh, written on the A2A SDK's server side.

Run as ``python a2a_outside_agent.py``: it serves on a free loopback port and prints
``serving http://127.0.0.1:PORT`` once it listens. Its skill: the first message is
answered with an artifact ``answer.txt`` holding the text in capitals; a text that
contains ``ask`` first asks which language (``input-required``) and puts the answer in
``language.txt``; a text that contains ``slow`` keeps the task working until it is
cancelled. With ``--hold`` every task stays working until it is cancelled (what the A2A
conformance kit expects of the agent it tests).

With ``--workspace DIR`` it is a coder for the demo's story instead: a task writes the
story's route and model into DIR (the team's shared workspace, where the demo's
reviewer reads them) and completes; a message that revises an earlier task (it names it
in ``referenceTaskIds``) does what the reviewer asked, validation and a test, and
completes again. Each task prints ``task <id> refs <ids> text <first line>``.
"""

from __future__ import annotations

import asyncio
import pathlib
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
WORKSPACE = (pathlib.Path(sys.argv[sys.argv.index("--workspace") + 1])
             if "--workspace" in sys.argv else None)
# The coder writes the story's own files (agents.scripted), from the repository.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))


def status(ctx: RequestContext, state: int, text: str) -> TaskStatusUpdateEvent:
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_AGENT,
                      parts=[Part(text=text)], task_id=ctx.task_id, context_id=ctx.context_id)
    return TaskStatusUpdateEvent(task_id=ctx.task_id, context_id=ctx.context_id,
                                 status=TaskStatus(state=state, message=message))


def artifact(ctx: RequestContext, name: str, text: str) -> TaskArtifactUpdateEvent:
    return TaskArtifactUpdateEvent(task_id=ctx.task_id, context_id=ctx.context_id,
                                   artifact=Artifact(artifact_id=name, name=name,
                                                     parts=[Part(text=text)]))


class Coder(AgentExecutor):
    """The demo's story done by an outside agent, in the team's workspace."""

    def __init__(self, workspace: pathlib.Path) -> None:
        self.workspace = workspace

    def write(self, path: str, text: str) -> None:
        target = self.workspace / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        from agents.scripted import USER_MODEL, USERS_ROUTE, USERS_TEST, VALIDATION

        message = context.message
        text = get_message_text(message) if message else ""
        refs = list(message.reference_task_ids) if message else []
        print(f"task {context.task_id} refs {','.join(refs) or '-'} text "
              f"{text.splitlines()[0] if text else ''}", flush=True)
        await event_queue.enqueue_event(Task(
            id=context.task_id, context_id=context.context_id,
            status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
            history=[message] if message else []))
        await event_queue.enqueue_event(status(context, TaskState.TASK_STATE_WORKING,
                                               "on it"))
        if refs and "validation" in text:
            route = (self.workspace / "src/routes/users.py").read_text()
            self.write("src/routes/users.py", route.replace(
                "def get_users(page: int = 1, limit: int = 10) -> dict[str, object]:\n",
                VALIDATION))
            self.write("tests/test_users.py", USERS_TEST)
            made, said = ("src/routes/users.py", "tests/test_users.py"), \
                "Validated page and limit; tests/test_users.py covers the edge cases"
        else:
            for init in ("src/__init__.py", "src/routes/__init__.py",
                         "src/models/__init__.py"):
                self.write(init, "")
            self.write("src/models/user.py", USER_MODEL)
            self.write("src/routes/users.py", USERS_ROUTE)
            made, said = ("src/routes/users.py", "src/models/user.py"), \
                "GET /users returns a page of users as JSON"
        for path in made:
            await event_queue.enqueue_event(artifact(
                context, path, (self.workspace / path).read_text()))
        await event_queue.enqueue_event(status(context, TaskState.TASK_STATE_COMPLETED, said))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(status(context, TaskState.TASK_STATE_CANCELED,
                                               "cancelled"))


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
    executor = Coder(WORKSPACE) if WORKSPACE is not None else Shouter()
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(),
                                    agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card),
                            *create_jsonrpc_routes(handler, "/")])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    sock.listen(16)
    print(f"serving {url}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
