"""The official A2A Python SDK (a2a-sdk 1.3) on both sides of aipgw, for tests/it/a2a.rs.

`agent`: an A2A agent on the SDK's own server (JSON-RPC, v1.0 and v0.3 method names on one
endpoint: enable_v0_3_compat=True) on a free loopback port, printed as `PORT <n>`.
Its executor, by the message text:
  "wait"      -> the task stops in input-required (open: it can be got, cancelled,
                 subscribed to);
  "stream N"  -> N artifact updates, then completed;
  "slow N"    -> the same, 0.3 s apart (a stream still live when a client resumes);
  other       -> completed at once.

`client`: the SDK's own JSON-RPC transports (v1.0 and v0.3) through the gateway with a
client certificate, owner and another caller: one JSON line per step, with what the SDK
returned or the error it raised.
"""

import asyncio
import json
import os
import socket
import ssl
import sys


def agent():
    import uvicorn
    from starlette.applications import Starlette

    from a2a.server.agent_execution import AgentExecutor
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_jsonrpc_routes
    from a2a.server.tasks import (
        InMemoryPushNotificationConfigStore,
        InMemoryTaskStore,
        TaskUpdater,
    )
    from a2a.helpers import new_task
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, Part, TaskState

    class Executor(AgentExecutor):
        async def execute(self, context, event_queue):
            text = context.get_user_input()
            updater = TaskUpdater(event_queue, context.task_id, context.context_id)
            if context.current_task is None:
                await event_queue.enqueue_event(
                    new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED,
                             history=[context.message])
                )
            await updater.start_work()
            if text == "wait":
                await updater.requires_input(
                    updater.new_agent_message([Part(text="what next?")])
                )
            elif text.startswith(("stream", "slow")):
                pause = 0.02 if text.startswith("stream") else 0.3
                for i in range(int(text.split()[1])):
                    await updater.add_artifact([Part(text=f"part {i}")], name=f"a{i}")
                    await asyncio.sleep(pause)
                await updater.complete()
            else:
                await updater.complete(updater.new_agent_message([Part(text="done")]))

        async def cancel(self, context, event_queue):
            updater = TaskUpdater(event_queue, context.task_id, context.context_id)
            await updater.cancel()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # Listening before the port is printed: a request sent at once waits in the backlog
    # until the server takes it, rather than being refused.
    sock.listen(128)
    url = f"http://127.0.0.1:{port}/"
    card = AgentCard(
        name="sdk agent",
        description="an A2A agent on the SDK's server, behind aipgw",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3"),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
    )
    handler = DefaultRequestHandler(
        agent_executor=Executor(),
        task_store=InMemoryTaskStore(),
        agent_card=card,
        push_config_store=InMemoryPushNotificationConfigStore(),
    )
    app = Starlette(routes=create_jsonrpc_routes(handler, "/", enable_v0_3_compat=True))
    print(f"PORT {port}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


def client():
    import httpx
    from google.protobuf.json_format import MessageToDict

    from a2a.client.transports.jsonrpc import JsonRpcTransport
    from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
    from a2a.types import (
        CancelTaskRequest,
        DeleteTaskPushNotificationConfigRequest,
        GetTaskPushNotificationConfigRequest,
        GetTaskRequest,
        ListTaskPushNotificationConfigsRequest,
        ListTasksRequest,
        Message,
        Part,
        Role,
        SendMessageRequest,
        SubscribeToTaskRequest,
        TaskPushNotificationConfig,
    )

    certs, url = os.environ["CERTS"], os.environ["URL"]

    def http(name, headers):
        ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
        ctx.load_cert_chain(
            os.path.join(certs, name + ".pem"), os.path.join(certs, name + ".key")
        )
        return httpx.AsyncClient(verify=ctx, timeout=20, headers=headers)

    def transport(generation, name):
        # The SDK's Client sets A2A-Version from the card's interface; the bare transports
        # are given it here: 1.0 for v1.0's methods, 0.3 (as the SDK's v0.3 client sends)
        # for v0.3's. The gateway passes it through unchanged.
        if generation == "v1":
            return JsonRpcTransport(http(name, {"A2A-Version": "1.0"}), None, url)
        return CompatJsonRpcTransport(http(name, {"A2A-Version": "0.3"}), None, url)

    def out(step, **fields):
        print(json.dumps({"step": step, **fields}), flush=True)

    def failure(e):
        return {"error": type(e).__name__, "text": str(e), "data": getattr(e, "data", None)}

    def message(text, task_id=None, context_id=None):
        m = Message(message_id=os.urandom(8).hex(), role=Role.ROLE_USER, parts=[Part(text=text)])
        if task_id:
            m.task_id = task_id
        if context_id:
            m.context_id = context_id
        return SendMessageRequest(message=m)

    def event_of(e):
        d = MessageToDict(e)
        kind = next(iter(d))
        body = d[kind]
        return {
            "kind": kind,
            "task": body.get("id") if kind == "task" else body.get("taskId"),
            "state": (body.get("status") or {}).get("state"),
        }

    async def step(name, call):
        try:
            r = await call
            out(name, result=MessageToDict(r) if r is not None else None)
        except Exception as e:
            out(name, **failure(e))

    async def run(g):
        owner, other = transport(g, "owner"), transport(g, "other")
        # send: the agent's Task answer makes the caller its owner
        r = await owner.send_message(message("wait"))
        task = r.task
        out(f"{g}/send", task=task.id, context=task.context_id, state=task.status.state)
        # get and subscribe by the owner
        await step(f"{g}/get", owner.get_task(GetTaskRequest(id=task.id)))
        try:
            async for e in owner.subscribe(SubscribeToTaskRequest(id=task.id)):
                out(f"{g}/subscribe", first=event_of(e))
                break
        except Exception as e:
            out(f"{g}/subscribe", **failure(e))
        # the other caller, on every task method, and on the owner's context
        calls = {
            "get": lambda: other.get_task(GetTaskRequest(id=task.id)),
            "cancel": lambda: other.cancel_task(CancelTaskRequest(id=task.id)),
            "push_set": lambda: other.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task.id, url="https://example.com/hook")
            ),
            "push_get": lambda: other.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task.id, id=task.id)
            ),
            "push_list": lambda: other.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task.id)
            ),
            "push_delete": lambda: other.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=task.id)
            ),
            "follow_up": lambda: other.send_message(message("more", task_id=task.id)),
            "same_context": lambda: other.send_message(
                message("hello", context_id=task.context_id)
            ),
        }
        if g == "v1":
            calls["list"] = lambda: other.list_tasks(ListTasksRequest(context_id=task.context_id))
            calls["list_all"] = lambda: other.list_tasks(ListTasksRequest())
        for name, call in calls.items():
            await step(f"{g}/other/{name}", call())
        try:
            async for e in other.subscribe(SubscribeToTaskRequest(id=task.id)):
                out(f"{g}/other/subscribe", first=event_of(e))
                break
        except Exception as e:
            out(f"{g}/other/subscribe", **failure(e))
        # the owner's follow-up and list pass; its cancel ends the task
        if g == "v1":
            await step(f"{g}/list", owner.list_tasks(ListTasksRequest(context_id=task.context_id)))
        await step(f"{g}/cancel", owner.cancel_task(CancelTaskRequest(id=task.id)))
        # stream: every event relayed, the first naming the task the caller now owns
        events = []
        async for e in owner.send_message_streaming(message("stream 3")):
            events.append(event_of(e))
        out(f"{g}/stream", events=events)
        streamed = events[0]["task"]
        await step(f"{g}/stream/other_get", other.get_task(GetTaskRequest(id=streamed)))
        await step(f"{g}/stream/get", owner.get_task(GetTaskRequest(id=streamed)))
        for t in (owner, other):
            await t.close()

    async def main():
        for g in ("v1", "v03"):
            await run(g)

    asyncio.run(main())


if __name__ == "__main__":
    {"agent": agent, "client": client}[sys.argv[1]]()
