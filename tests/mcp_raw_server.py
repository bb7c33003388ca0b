"""A stdio MCP server written by hand (JSON-RPC lines, no SDK), for what the SDK's own server never sends; what it
does is set by its arguments: `badutf8` adds `bad`, whose answer holds bytes that are not UTF-8; `deep:N` adds
`sch`, whose input schema nests N objects (a listing pydantic cannot read past its recursion limit); `resource`
adds `res` and `blob`, which answer with an embedded text resource and a blob one; `big:MB` adds `big`, whose
answer is one line of MB megabytes; `jsonlog` writes a structured logger's JSON line (no "jsonrpc", no "id") at
start and before each answer; `pidfile:PATH` writes its process id there; `badlist` answers tools/list with a
listing that is not MCP's (`"tools": "nope"`); `rpcerror` adds `err`, answered with a JSON-RPC error of code
-32000 (the first of the codes JSON-RPC leaves to servers) and a message of two lines. `add` adds, always."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

opts = dict(a.partition(":")[::2] for a in sys.argv[1:])
out = sys.stdout.buffer
if "pidfile" in opts:
    with open(opts["pidfile"], "w") as f:
        f.write(str(os.getpid()))


def send(obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def schema() -> dict[str, Any]:
    s: dict[str, Any] = {"type": "string"}
    for _ in range(int(opts["deep"])):
        s = {"type": "object", "properties": {"x": s}}
    return {"type": "object", "properties": {"x": s}}


def tools() -> list[dict[str, Any]]:
    empty = {"type": "object", "properties": {}}
    found = [{"name": "add", "description": "Add two integers.", "inputSchema": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}]
    for key, names in (("badutf8", ["bad"]), ("resource", ["res", "blob"]), ("big", ["big"]), ("rpcerror", ["err"])):
        if key in opts:
            found += [{"name": n, "description": f"{n} tool", "inputSchema": empty} for n in names]
    if "deep" in opts:
        found.append({"name": "sch", "description": "A deep schema.", "inputSchema": schema()})
    return found


def answer(rid: Any, content: list[dict[str, Any]]) -> None:
    send({"jsonrpc": "2.0", "id": rid, "result": {"content": content}})


def log(text: str) -> None:
    if "jsonlog" in opts:  # as pino and other structured loggers write to stdout
        send({"level": 30, "time": 1764650000000, "msg": text})


log("listening")
while line := sys.stdin.buffer.readline():
    msg = json.loads(line)
    log(f"got {msg.get('method')}")
    method, rid = msg.get("method"), msg.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": msg["params"]["protocolVersion"],
              "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": "nope" if "badlist" in opts else tools()}})
    elif method == "tools/call":
        name, args = msg["params"]["name"], msg["params"].get("arguments") or {}
        if name == "add":
            answer(rid, [{"type": "text", "text": str(args["a"] + args["b"])}])
        elif name == "bad":
            out.write(b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode()
                      + b',"result":{"content":[{"type":"text","text":"ab\xff\xfe cd"}]}}\n')
            out.flush()
        elif name == "res":
            answer(rid, [{"type": "resource", "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain",
                                                           "text": "the notes say 42"}}])
        elif name == "blob":
            answer(rid, [{"type": "resource", "resource": {"uri": "file:///cat.png", "mimeType": "image/png",
                                                           "blob": "iVBORw0KGgo="}}])
        elif name == "err":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "custom error\nwith newline"}})
        elif name == "big":
            out.write(b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode() + b',"result":{"content":[{"type":'
                      b'"text","text":"' + b"x" * int(float(opts["big"]) * 1024 * 1024) + b'"}]}}\n')
            out.flush()
    elif rid is not None:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})
