"""OpenEnv's side of `vlrl serve-env` (the runtime contract of openenv 0.10, which `openenv validate --url` checks):
the metadata, the JSON schemas, the MCP endpoint and the WebSocket session, on top of `vlrl.envs.sessions`.

An action is {"reply": "<the model's reply>"}: vlrl's environments read their actions from the reply's solution
tags, so the reply travels whole. An observation is {"image": PNG data URL or null, "text": summary}, and a step's
metadata is the environment's `info` (with the episode's `metrics` once it is done).
"""

from __future__ import annotations

import json
import secrets

import vlrl
from vlrl.envs.sessions import EnvService, Refused, plain
from vlrl.grammar.answers import FORMAT

ACTION_SCHEMA = {"title": "VlrlAction", "type": "object", "additionalProperties": False, "required": ["reply"],
                 "properties": {"reply": {"type": "string", "description": "the model's reply: actions by name, "
                                          f"comma-separated, inside {FORMAT.answer('...')}"},
                                "metadata": {"type": "object"}}}
OBSERVATION_SCHEMA = {"title": "VlrlObservation", "type": "object",
                      "properties": {"image": {"type": ["string", "null"], "description": "a PNG data URL"},
                                     "text": {"type": "string", "description": "the state summary ('' if none)"},
                                     "reward": {"type": ["number", "null"]}, "done": {"type": "boolean"},
                                     "metadata": {"type": "object"}}}
STATE_SCHEMA = {"title": "VlrlState", "type": "object",
                "properties": {"episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer"},
                               "done": {"type": "boolean"}, "metrics": {"type": "object"}}}
ERROR_CODES = {400: "VALIDATION_ERROR", 404: "SESSION_ERROR", 409: "SESSION_ERROR", 429: "CAPACITY_REACHED",
               500: "EXECUTION_ERROR"}


def metadata_of(service: EnvService) -> dict:
    """GET /metadata: OpenEnv's name and description (the prompt's action description), and vlrl's action list."""
    return {"name": service.name, "description": service.description, "version": vlrl.__version__,
            "actions": service.task_info.get("actions", []),
            "max_actions_per_turn": service.task_info.get("max_actions_per_turn", 1)}


def schema_of() -> dict:
    """GET /schema: the action, observation and state JSON schemas."""
    return {"action": ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA}


def mcp_answer(raw: bytes) -> dict:
    """POST /mcp: a JSON-RPC 2.0 answer. vlrl's environments offer no MCP tools: `tools/list` is empty, any other
    method is "method not found", and a malformed request gets JSON-RPC's own error.

    >>> mcp_answer(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}')
    {'jsonrpc': '2.0', 'id': 1, 'result': {'tools': []}}
    >>> mcp_answer(b'{}')["error"]["code"]
    -32600
    """
    try:
        request = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        return {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error: the body is not JSON"}}
    request_id = request.get("id") if isinstance(request, dict) else None
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or not isinstance(request.get("method"), str):
        return {"jsonrpc": "2.0", "id": request_id,
                "error": {"code": -32600, "message": "Invalid Request: send {\"jsonrpc\": \"2.0\", \"method\": ...}"}}
    if request["method"] == "tools/list":
        return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": []}}
    return {"jsonrpc": "2.0", "id": request_id,
            "error": {"code": -32601, "message": f"Method not found: {request['method']} (this server has no tools)"}}


def reset_body(data: dict, session_id: str | None) -> dict:
    """A WebSocket reset's data as a /reset body: the seed (a fresh random one when none is given, as OpenEnv's
    environments draw one), and its options (`options`, else every other key, OpenEnv's custom reset parameters).

    >>> reset_body({"seed": 3, "size": 64}, None)
    {'seed': 3, 'session': None, 'options': {'size': 64}}
    """
    if not isinstance(data, dict):
        raise Refused(400, f"a reset's data must be a JSON object, e.g. {{\"seed\": 3}}, got {data!r}")
    options = data.get("options")
    if options is None:
        options = {k: v for k, v in data.items() if k not in ("seed", "episode_id", "session")} or None
    seed = data.get("seed")
    return {"seed": secrets.randbelow(2**31) if seed is None else seed, "session": session_id, "options": options}


async def websocket_session(websocket, service: EnvService, max_body: int) -> None:
    """WebSocket /ws: one session for the connection's life, closed when it ends (OpenEnv's message protocol)."""
    from fastapi.concurrency import run_in_threadpool
    from starlette.websockets import WebSocketDisconnect

    await websocket.accept()
    session_id = None

    async def send(kind: str, data: dict) -> None:
        await websocket.send_text(json.dumps({"type": kind, "data": data}, default=plain))

    try:
        while True:
            raw = await websocket.receive_text()
            try:
                if len(raw) > max_body:
                    raise Refused(413, f"the message has {len(raw)} bytes, more than the {max_body} accepted")
                try:
                    message = json.loads(raw)
                except ValueError as err:
                    await send("error", {"message": f"Invalid JSON: {err}", "code": "INVALID_JSON"})
                    continue
                kind = message.get("type") if isinstance(message, dict) else None
                data = message.get("data") or {} if isinstance(message, dict) else {}
                if kind == "reset":
                    result = await run_in_threadpool(service.reset, reset_body(data, session_id))
                    session_id = result["session"]
                    await send("observation", {"observation": result["observation"], "reward": None, "done": False,
                                               "metadata": {"episode_id": session_id, "task": result["task"]}})
                elif kind == "step":
                    if session_id is None:
                        raise Refused(409, "this connection has no episode yet; send {\"type\": \"reset\"} first")
                    result = await run_in_threadpool(service.step, {"session": session_id, "action": data})
                    metadata = dict(result["info"])
                    if result["done"]:
                        metadata["metrics"] = await run_in_threadpool(service.metrics, session_id)
                    await send("observation", {"observation": result["observation"], "reward": result["reward"],
                                               "done": result["done"], "metadata": metadata})
                elif kind == "state":
                    await send("state", await run_in_threadpool(service.state, session_id))
                elif kind == "close":
                    break
                else:
                    await send("error", {"message": f"Unknown message type: {kind!r} (reset, step, state, close)",
                                         "code": "UNKNOWN_TYPE"})
            except Refused as err:
                await send("error", {"message": str(err), "code": ERROR_CODES.get(err.status, "EXECUTION_ERROR"),
                                     "status": err.status})
    except WebSocketDisconnect:
        pass
    finally:
        if session_id is not None:
            await run_in_threadpool(service.close, session_id)
    try:
        await websocket.close()
    except (RuntimeError, WebSocketDisconnect):  # already closed by the client
        pass
