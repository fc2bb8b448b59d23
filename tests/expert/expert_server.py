"""A scripted A2A 1.0 expert for the External Expert tests, built with a2a-sdk (JSON-RPC binding,
SSE streaming) and served by uvicorn.

    python expert_server.py --port P --state-dir D [--token T] [--no-streaming]
                            [--service-url URL] [--chunk-delay S]

The message text picks the behaviour:
  * contains "[slow]"  - the answer streams in 6 chunks, --chunk-delay seconds apart;
  * contains "[input]" - a new task asks a question (TASK_STATE_INPUT_REQUIRED); the follow-up
                         message on that task (same taskId) completes it with an answer naming
                         the reply;
  * contains "[cut]"   - two chunks stream, then the connection is closed mid-answer (no final
                         task state, no terminating chunk);
  * contains "[auth]"  - the task asks for authentication (TASK_STATE_AUTH_REQUIRED);
  * contains "[fail]"  - the task ends TASK_STATE_FAILED;
  * anything else      - the answer streams in 3 chunks and the task completes.
Every answer starts with "Expert answer to: <the message text>".

The card changes (its description, hence its hash) while the file D/card_variant exists: its
content is appended to the description. Every JSON-RPC request received is appended to
D/received.jsonl (method, message text, taskId, contextId, Authorization and A2A-Version
headers), so a test can tell whether anything was sent. With --token, every request (card
included) must carry "Authorization: Bearer T".
"""

import argparse
import asyncio
import json
import os
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from a2a.helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, Role, TaskState

CUT_MARK = b"__CUT_THE_STREAM_HERE__"


class ScriptedExpert(AgentExecutor):
    def __init__(self, chunk_delay: float):
        self.chunk_delay = chunk_delay

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        task = context.current_task
        continuing = task is not None
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        head = f"Expert answer to: {text}\n"
        if "[input]" in text and not continuing:
            await updater.requires_input(
                new_text_message("Which Rust edition does the crate target?", role=Role.ROLE_AGENT,
                                 context_id=task.context_id, task_id=task.id)
            )
            return
        if "[auth]" in text:
            await updater.requires_auth(
                new_text_message("Sign in to the partner archive first.", role=Role.ROLE_AGENT,
                                 context_id=task.context_id, task_id=task.id)
            )
            return
        if "[fail]" in text:
            await updater.failed(
                new_text_message("the expert cannot answer this", role=Role.ROLE_AGENT,
                                 context_id=task.context_id, task_id=task.id)
            )
            return
        if continuing:
            chunks = [head, f"With that edition ({text}) ", "use let-else and async closures."]
        elif "[slow]" in text:
            chunks = [head] + [f"slow part {i}. " for i in range(1, 6)]
        elif "[cut]" in text:
            chunks = [head, "cut part 1. ", "cut part 2. "]
        else:
            chunks = [head, "Prefer small crates. ", "Measure before tuning."]
        for i, chunk in enumerate(chunks):
            await updater.add_artifact([Part(text=chunk)], artifact_id="answer", name="answer",
                                       append=i > 0, last_chunk=False)
            if "[slow]" in text or "[cut]" in text:
                await asyncio.sleep(self.chunk_delay)
        if "[cut]" in text:
            # The middleware closes the connection when this chunk would be sent.
            await updater.add_artifact([Part(text=CUT_MARK.decode())], artifact_id="answer", append=True)
            await asyncio.sleep(5)
        await updater.add_artifact([Part(text="")], artifact_id="answer", append=True, last_chunk=True)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


class Guard:
    """ASGI middleware: the bearer token, the log of received requests, and the cut."""

    def __init__(self, app, state_dir: str, token: str | None):
        self.app = app
        self.state_dir = state_dir
        self.token = token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        if self.token and headers.get("authorization") != f"Bearer {self.token}":
            return await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        try:
            req = json.loads(body)
            m = req.get("params", {}).get("message", {})
            entry = {
                "method": req.get("method"),
                "text": "".join(p.get("text", "") for p in m.get("parts", [])),
                "taskId": m.get("taskId"),
                "contextId": m.get("contextId"),
                "messageId": m.get("messageId"),
                "authorization": headers.get("authorization"),
                "a2a_version": headers.get("a2a-version"),
            }
        except Exception:  # noqa: BLE001 - a bad request is logged as such
            entry = {"method": None, "text": None}
        with open(os.path.join(self.state_dir, "received.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")
        cut = b"[cut]" in body
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def guarded_send(message):
            if cut and message["type"] == "http.response.body" and CUT_MARK in message.get("body", b""):
                raise ConnectionAbortedError("expert_server: cutting the stream mid-answer")
            await send(message)

        return await self.app(scope, replay, guarded_send)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--token")
    ap.add_argument("--no-streaming", action="store_true")
    ap.add_argument("--service-url")
    ap.add_argument("--chunk-delay", type=float, default=0.3)
    args = ap.parse_args()
    service_url = args.service_url or f"http://127.0.0.1:{args.port}/"
    card = AgentCard(
        name="Rust Review Expert",
        description="Answers questions about Rust code (a scripted test expert).",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=service_url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=not args.no_streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="review", name="Rust review", description="Reviews Rust questions", tags=["rust"])],
    )
    variant = os.path.join(args.state_dir, "card_variant")

    async def modifier(c: AgentCard) -> AgentCard:
        if os.path.exists(variant):
            changed = AgentCard()
            changed.CopyFrom(c)
            with open(variant) as f:
                changed.description = c.description + " " + f.read().strip()
            return changed
        return c

    handler = DefaultRequestHandler(
        agent_executor=ScriptedExpert(args.chunk_delay), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = create_agent_card_routes(card, card_modifier=modifier) + create_jsonrpc_routes(handler, rpc_url="/")
    app = Guard(Starlette(routes=routes), args.state_dir, args.token)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    sys.exit(main())
