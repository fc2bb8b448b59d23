#!/usr/bin/env python3
"""A small MCP server over stdio for the failure modes of the External MCP tests.

It speaks JSON-RPC 2.0 by hand (standard library only) because the failures it produces
are ones an SDK refuses to emit: a tool without inputSchema, an invalid tool name, invalid
UTF-8 in a result, a single line of hundreds of MB. Options:
  --crash-at-start      write to stderr and exit 3 before the handshake
  --log FILE            append every received method (and cancelled request ids) to FILE
  --drop-file FILE      when FILE appears, drop tool `remove_me` and send list_changed
  --page-size N         tools per tools/list page (default 4, so pagination is exercised)
  --flood-file FILE     when FILE appears, drop tool `remove_me` and send list_changed 2,000
                        times at once (logged as `flooded` before the first)
  --die-after-list      exit right after answering the first tools/list (connects, is listed, dies);
                        logs `connect-at <unix time>` at each initialize
  --spray-file FILE     while FILE exists, send notifications/progress for progress tokens 0-299
                        (numbers and strings) with the message `injected`, for calls it never had
"""
import json
import os
import sys
import threading
import time

args = sys.argv[1:]


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


if "--crash-at-start" in args:
    sys.stderr.write("fault_server: fatal: cannot open configuration /nonexistent/config.toml\n")
    sys.stderr.flush()
    sys.exit(3)

LOG = opt("--log")
DROP_FILE = opt("--drop-file")
FLOOD_FILE = opt("--flood-file")
SPRAY_FILE = opt("--spray-file")
PAGE = int(opt("--page-size", "4"))
out_lock = threading.Lock()
dropped = False


def log(text):
    if LOG:
        with open(LOG, "a") as f:
            f.write(text + "\n")


def send_raw(data: bytes):
    with out_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def send(obj):
    send_raw(json.dumps(obj).encode() + b"\n")


def schema(props=None, required=None):
    s = {"type": "object", "properties": props or {}}
    if required:
        s["required"] = required
    return s


def tools():
    t = [
        {"name": "echo", "title": "Echo", "description": "Echo the given text back",
         "inputSchema": schema({"text": {"type": "string"}}, ["text"]),
         "annotations": {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False}},
        {"name": "crash", "description": "Exit the server in the middle of the call", "inputSchema": schema()},
        {"name": "hang", "description": "Never answer", "inputSchema": schema()},
        {"name": "big", "description": "Return a large text result",
         "inputSchema": schema({"megabytes": {"type": "integer"}}, ["megabytes"])},
        {"name": "huge_line", "description": "Write one response line of the given size without a newline until the end",
         "inputSchema": schema({"megabytes": {"type": "integer"}}, ["megabytes"])},
        {"name": "badutf8", "description": "Return text containing invalid UTF-8", "inputSchema": schema()},
        {"name": "progress", "description": "Report progress three times, then answer", "inputSchema": schema()},
        {"name": "progress_flood", "description": "Report progress 5,000 times at once with 2 KB messages, then answer",
         "inputSchema": schema()},
        {"name": "fail", "description": "Answer with isError", "inputSchema": schema()},
        {"name": "image", "description": "Return text, an image and structured content", "inputSchema": schema()},
        {"name": "broken_no_schema", "description": "A tool without inputSchema"},
        {"name": "bad name!", "description": "A tool with an invalid name", "inputSchema": schema()},
        {"name": "broken_schema_type", "description": "inputSchema is not an object", "inputSchema": "string"},
    ]
    if not dropped:
        t.append({"name": "remove_me", "description": "A tool the server drops later", "inputSchema": schema()})
    return t


def watch_drop():
    global dropped
    while not dropped:
        if DROP_FILE and os.path.exists(DROP_FILE):
            dropped = True
            log("dropped remove_me")
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            return
        time.sleep(0.05)


def watch_flood():
    global dropped
    while not os.path.exists(FLOOD_FILE):
        time.sleep(0.05)
    dropped = True
    log("flooded")
    for _ in range(2000):
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})


def spray():
    while not os.path.exists(SPRAY_FILE):
        time.sleep(0.02)
    while os.path.exists(SPRAY_FILE):
        for token in range(300):
            for t in (token, str(token)):
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": t, "progress": 1, "message": "injected"}})
        time.sleep(0.01)


def text_result(text):
    return {"content": [{"type": "text", "text": text}], "isError": False}


def call(req_id, name, arguments, meta):
    if name == "echo":
        send({"jsonrpc": "2.0", "id": req_id, "result": text_result(arguments.get("text", ""))})
    elif name == "crash":
        sys.stderr.write("fault_server: segmentation fault while handling crash\n")
        sys.stderr.flush()
        os._exit(11)
    elif name == "hang":
        log(f"hanging {req_id}")
    elif name == "big":
        text = "x" * (int(arguments["megabytes"]) * 1024 * 1024)
        send({"jsonrpc": "2.0", "id": req_id, "result": text_result(text)})
    elif name == "huge_line":
        head = ('{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"' % json.dumps(req_id)).encode()
        chunk = b"y" * (1024 * 1024)
        with out_lock:
            sys.stdout.buffer.write(head)
            for _ in range(int(arguments["megabytes"])):
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.write(b'"}]}}\n')
            sys.stdout.buffer.flush()
    elif name == "badutf8":
        prefix = ('{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"caf' % json.dumps(req_id)).encode()
        send_raw(prefix + b"\xe9 \xff\xfe ok" + b'"}]}}\n')
    elif name == "progress":
        token = (meta or {}).get("progressToken")
        for i in range(1, 4):
            if token is not None:
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": token, "progress": i, "total": 3, "message": f"step {i}"}})
            time.sleep(0.05)
        send({"jsonrpc": "2.0", "id": req_id, "result": text_result("done")})
    elif name == "progress_flood":
        token = (meta or {}).get("progressToken")
        for i in range(1, 5001):
            if token is not None:
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": token, "progress": i, "total": 5000, "message": "é" * 1000}})
        time.sleep(0.5)
        send({"jsonrpc": "2.0", "method": "notifications/progress",
              "params": {"progressToken": token, "progress": 5000, "total": 5000, "message": "done"}})
        send({"jsonrpc": "2.0", "id": req_id, "result": text_result("done")})
    elif name == "fail":
        send({"jsonrpc": "2.0", "id": req_id, "result": {"content": [{"type": "text", "text": "quota exceeded for key k-42"}], "isError": True}})
    elif name == "image":
        send({"jsonrpc": "2.0", "id": req_id, "result": {
            "content": [{"type": "text", "text": "a red dot"},
                        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                        {"type": "resource", "resource": {"uri": "mem://dot", "mimeType": "text/plain", "text": "dot"}}],
            "structuredContent": {"color": "red", "size": 1}}})
    elif name == "remove_me":
        send({"jsonrpc": "2.0", "id": req_id, "result": text_result("still here")})
    else:
        send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32602, "message": f"unknown tool {name}"}})


def main():
    if DROP_FILE:
        threading.Thread(target=watch_drop, daemon=True).start()
    if FLOOD_FILE:
        threading.Thread(target=watch_flood, daemon=True).start()
    if SPRAY_FILE:
        threading.Thread(target=spray, daemon=True).start()
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method = msg.get("method")
        req_id = msg.get("id")
        params = msg.get("params") or {}
        log(f"{method} {json.dumps(params.get('requestId')) if method == 'notifications/cancelled' else ''}".strip())
        if method == "initialize" and "--die-after-list" in args:
            log(f"connect-at {time.time()}")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": req_id, "result": {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "fault-server", "version": "1.0.0"}}})
        elif method == "tools/list":
            all_tools = tools()
            start = int(params.get("cursor") or 0)
            page = all_tools[start:start + PAGE]
            result = {"tools": page}
            if start + PAGE < len(all_tools):
                result["nextCursor"] = str(start + PAGE)
            send({"jsonrpc": "2.0", "id": req_id, "result": result})
            if "--die-after-list" in args and "nextCursor" not in result:
                sys.exit(0)
        elif method == "tools/call":
            threading.Thread(target=call, args=(req_id, params.get("name"), params.get("arguments") or {},
                                                params.get("_meta")), daemon=True).start()
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": req_id, "result": {}})
        elif req_id is not None:
            send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
