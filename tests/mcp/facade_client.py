"""An MCP client (the official Python `mcp` SDK) driving Mira's own MCP server, for
tests/it/mcp_server.rs.

    facade_client.py URL SCENARIO [ARG...]   (the bearer token in MIRA_TOKEN)

URL is the server's `/mcp` endpoint (query included), or for the `stdio` scenario the base URL
handed to `mira mcp-stdio` (whose binary is MIRA_BIN). Every step prints one JSON line to
stdout, flushed, so the test can act between steps (grant in the API, kill a server) and
check what the client saw.
"""

import json
import os
import sys

import anyio
import httpx2
from mcp import Client, StdioServerParameters, types
from mcp.client.streamable_http import streamable_http_client


def out(**fields):
    print(json.dumps(fields), flush=True)


def result_json(r):
    text = "".join(c.text for c in r.content if getattr(c, "type", "") == "text")
    meta = (r.meta or {}).get("mira/invocation") if r.meta else None
    return {"is_error": bool(r.is_error), "text": text, "structured": r.structured_content, "meta": meta}


def tool_names(listed):
    return [t.name for t in listed.tools]


async def main():
    url, scenario, *args = sys.argv[1:]
    token = os.environ["MIRA_TOKEN"]
    elicitations = []
    changes = anyio.Event()

    async def accept(context, params):
        elicitations.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def decline(context, params):
        elicitations.append(params.message)
        return types.ElicitResult(action="decline")

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            changes.set()

    callback = {"edit-elicit": accept, "edit-decline": decline}.get(scenario)
    if scenario == "stdio":
        server = StdioServerParameters(
            command=os.environ["MIRA_BIN"],
            args=["mcp-stdio", "--server", url],
            env={"MIRA_TOKEN": token, "PATH": os.environ.get("PATH", "")},
        )
    else:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
        server = streamable_http_client(url, http_client=http)
    async with Client(server, elicitation_callback=callback, message_handler=on_message) as client:
        out(step="initialized", protocol=client.protocol_version)
        listed = await client.list_tools()
        out(step="listed", tools=tool_names(listed))
        if scenario in ("read", "stdio"):
            r = await client.call_tool("read_open", {"path": args[0]})
            out(step="called", result=result_json(r))
        elif scenario in ("edit-elicit", "edit-decline", "edit-wait"):
            progress = []

            async def on_progress(value, total, message):
                progress.append(message)

            r = await client.call_tool("write_file", {"path": args[0], "content": args[1]}, progress_callback=on_progress)
            out(step="called", result=result_json(r), elicitations=elicitations, progress=progress)
        elif scenario == "cancel":
            with anyio.move_on_after(float(args[2])):
                await client.call_tool("write_file", {"path": args[0], "content": args[1]})
                out(step="called")
            out(step="cancelled")
            await anyio.sleep(1)
        elif scenario == "find":
            r = await client.call_tool("mira_find_tools", {"task": args[0]})
            out(step="found", result=result_json(r))
            with anyio.move_on_after(10):
                await changes.wait()
            listed = await client.list_tools()
            out(step="relisted", changed=changes.is_set(), tools=tool_names(listed))
        elif scenario == "list-changed":
            # Relists on every notification until the tool named args[1] is gone.
            with anyio.move_on_after(float(args[0])):
                while True:
                    await changes.wait()
                    changes = anyio.Event()
                    names = tool_names(await client.list_tools())
                    out(step="relisted", tools=names)
                    if args[1] not in names:
                        break


anyio.run(main)
