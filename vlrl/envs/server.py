"""`vlrl serve-env NAME`: any vlrl environment as an OpenEnv-compatible HTTP and WebSocket server (FastAPI on uvicorn),
so a trainer in another process or language runs its episodes; clients: `vlrl.envs.remote.RemoteEnv` (HTTP sessions),
`vlrl.envs.openenv_client.OpenEnvEnv` (OpenEnv's WebSocket); `openenv validate --url` passes it.

vlrl's protocol, one session per episode (a GSPO group plays its episodes side by side):

    GET  /health                 -> {"status": "healthy", "ok": true, "env": NAME, "sessions": 2, "max_sessions": 64}
    GET  /task_info[?options=J]  -> the environment's task_info() (actions, per-turn cap, observation format)
    POST /reset {"seed": 3, "session": ID?, "options": {...}?}  -> {"session", "episode_id", "observation": OBS, "task"}
    POST /step  {"session": ID, "action": "<SOLUTION>move_left, do</SOLUTION>"}   (or "action": {"reply": ...})
                                 -> {"observation": OBS, "reward": 1.0, "done": false, "info": {...}}
    GET  /metrics?session=ID     -> the episode's metrics() ({"success", "return", "length", ...})
    POST /close {"session": ID}  -> {"closed": true}
    OBS = {"image": "data:image/png;base64,..." or null, "text": "the state summary"}

OpenEnv's (openenv 0.10's contract): GET /metadata, /schema (action {"reply": text}), /state[?session=ID],
/openapi.json, POST /mcp (JSON-RPC 2.0, no tools), and WebSocket /ws, a session per connection: {"type": "reset" |
"step" | "state" | "close", "data": {...}} answered {"type": "observation" | "state" | "error", "data": {...}}.

Hardening: with ENVIRONMENT_API_KEY set, every request needs it (`Authorization: Bearer KEY` or `X-API-Key`), else
401. Every refusal is {"error": "what, and the fix"}, and the server goes on: 400 (bad JSON, field or options, checked
before anything is built), 404 (unknown path or session, or an expired idle one), 405, 409 (a step after the end or
past the cap), 413 (a body or message over 1 MB), 429 (sessions capped), 500 (the environment raised: the reason).
A client that hangs up in the middle of its body is a 400 nobody hears, never a traceback in the server's log.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import socket
import threading

try:  # at module level: FastAPI reads the routes' annotations (strings here) from this module's names
    from fastapi import Request, WebSocket
except ImportError:  # the envs extra is missing; create_app says so
    Request = WebSocket = None

from vlrl.base.errors import EnvError, MissingExtra
from vlrl.envs.sessions import IDLE_S, MAX_SESSIONS, MAX_STEPS, EnvService, Refused, plain

MAX_BODY = 1 << 20  # a reply of a few thousand tokens is ~20 kB; anything near 1 MB is a mistake
API_KEY_VARIABLE = "ENVIRONMENT_API_KEY"
ENDPOINTS = ("/health", "/task_info", "/metadata", "/schema", "/state", "/reset", "/step", "/metrics", "/close",
             "/mcp", "/ws")


def _fastapi():
    try:
        import fastapi
        import uvicorn
    except ImportError:
        raise MissingExtra("`vlrl serve-env` needs FastAPI and uvicorn: pip install 'vlrl[envs]'") from None
    return fastapi, uvicorn


def authorized(headers, key: str | None) -> bool:
    """Whether request headers carry the API key (`Authorization: Bearer KEY` or `X-API-Key: KEY`); any request is
    authorized when no key is set. Compared in constant time.

    >>> authorized({"authorization": "Bearer s3cret"}, "s3cret"), authorized({"x-api-key": "nope"}, "s3cret")
    (True, False)
    """
    if not key:
        return True
    given = headers.get("x-api-key") or ""
    bearer = headers.get("authorization") or ""
    if bearer.lower().startswith("bearer "):
        given = given or bearer[7:].strip()
    return bool(given) and hmac.compare_digest(given.encode(), key.encode())


class Guard:
    """ASGI middleware in front of every route: the API key (401) and the body's size (413, counted as it arrives,
    so a body without Content-Length cannot grow past the limit either)."""

    def __init__(self, app, key: str | None, max_body: int):
        self.app, self.key, self.max_body = app, key, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not authorized(headers, self.key):
            message = (f"this server needs its API key ({API_KEY_VARIABLE}): send `Authorization: Bearer KEY` or "
                       "`X-API-Key: KEY`")
            if scope["type"] == "websocket":
                if "websocket.http.response" not in scope.get("extensions", {}):  # a server that cannot say 401
                    return await send({"type": "websocket.close", "code": 1008, "reason": "401: API key missing"})
                return await _reply(send, 401, message, "websocket.")
            return await _reply(send, 401, message)
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        try:
            declared = int(headers.get("content-length") or 0)
        except ValueError:
            return await _reply(send, 400, "Content-Length is not a number")
        if declared > self.max_body:
            return await _reply(send, 413, f"the body has {declared} bytes, more than the {self.max_body} accepted")
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise Refused(413, f"the body has more than the {self.max_body} bytes accepted")
            return message

        return await self.app(scope, counted, send)


async def _reply(send, status: int, message: str, prefix: str = "") -> None:
    """{"error": message} with `status`, as an HTTP answer (or, prefix "websocket.", as the refusal of a WebSocket
    handshake: ASGI's denial response)."""
    data = json.dumps({"error": message}).encode()
    await send({"type": f"{prefix}http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": f"{prefix}http.response.body", "body": data})


def create_app(service: EnvService, *, api_key: str | None = None, max_body: int = MAX_BODY,
               sweep_s: float | None = None):
    """The FastAPI application of `service` behind its guard (see the module docstring).

    Args:
        service: the sessions (`vlrl.envs.sessions.EnvService`).
        api_key: the key requests must carry; None: ENVIRONMENT_API_KEY, when set.
        max_body: the largest body or WebSocket message, in bytes.
        sweep_s: seconds between sweeps of idle sessions (default: a tenth of the idle time, 1..60 s).

    Returns:
        An ASGI application (`app.state.service` is the service).
    """
    fastapi, _ = _fastapi()
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    import vlrl
    from vlrl.envs.openenv_protocol import mcp_answer, metadata_of, schema_of, websocket_session

    key = api_key if api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    sweep_s = sweep_s or min(60.0, max(1.0, service.idle_s / 10))

    async def sweeper():
        while True:
            await asyncio.sleep(sweep_s)
            await run_in_threadpool(service.expire)

    async def lifespan(app):
        task = asyncio.create_task(sweeper())
        yield
        task.cancel()
        service.shutdown()

    app = fastapi.FastAPI(title=f"vlrl environment: {service.name}", version=vlrl.__version__, lifespan=lifespan)
    app.state.service = service

    def answer(payload: dict, status: int = 200):
        return JSONResponse(json.loads(json.dumps(payload, default=plain)), status_code=status)

    @app.exception_handler(Refused)
    async def refused(request, err: Refused):
        return answer({"error": str(err)}, err.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        path = request.url.path
        if err.status_code == 405:
            allowed = (err.headers or {}).get("allow") or (err.headers or {}).get("Allow") or "another method"
            return answer({"error": f"{path} takes {allowed}, not {request.method}"}, 405)
        if err.status_code == 404:
            return answer({"error": f"no endpoint {path}; the server answers {', '.join(ENDPOINTS)}"}, 404)
        return answer({"error": str(err.detail)}, err.status_code)

    @app.exception_handler(Exception)
    async def failed(request, err: Exception):  # a bug of ours: the request fails, the server goes on
        return answer({"error": f"the server failed: {type(err).__name__}: {err}"}, 500)

    async def body_of(request) -> dict:
        try:
            raw = await request.body()
        except ClientDisconnect:  # the client hung up mid-body: nothing ran, and the answer goes nowhere
            raise Refused(400, "the connection closed before the whole body arrived") from None
        if not raw.strip():
            raise Refused(400, "the body is empty; send a JSON object, e.g. {\"seed\": 3}")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise Refused(400, f"the body is not JSON ({err}); send a JSON object") from None
        if not isinstance(body, dict):
            raise Refused(400, f"the body must be a JSON object, got {type(body).__name__}")
        return body

    @app.get("/health")
    def health():
        return service.health()

    @app.get("/task_info")
    async def task_info(options: str | None = None):
        if options is not None:
            try:
                options = json.loads(options)
            except ValueError:
                raise Refused(400, "options must be JSON, e.g. ?options={\"size\":128}") from None
        return answer(await run_in_threadpool(service.describe_task, options))

    @app.get("/metadata")
    def metadata():
        return metadata_of(service)

    @app.get("/schema")
    def schema():
        return schema_of()

    @app.get("/state")
    async def state(session: str | None = None):
        return answer(await run_in_threadpool(service.state, session))

    @app.get("/metrics")
    async def metrics(session: str | None = None):
        return answer(await run_in_threadpool(service.metrics, session))

    @app.post("/reset")
    async def reset(request: Request):
        return answer(await run_in_threadpool(service.reset, await body_of(request)))

    @app.post("/step")
    async def step(request: Request):
        return answer(await run_in_threadpool(service.step, await body_of(request)))

    @app.post("/close")
    async def close(request: Request):
        await run_in_threadpool(service.close, (await body_of(request)).get("session"))
        return {"closed": True}

    @app.post("/mcp")
    async def mcp(request: Request):
        return mcp_answer(await request.body())

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket_session(websocket, service, max_body)

    return Guard(app, key, max_body)


class EnvServer:
    """A running (or ready) server: `url`, `service`, `start()` in a thread, `stop()`; also a context manager.

    Args:
        app: the ASGI application (`create_app`, or any other: an OpenEnv app in the tests).
        sock: the listening socket it serves on.
        service: the sessions, shut down on `stop()` (None: nothing to shut down).
        quiet: no access log.
    """

    def __init__(self, app, sock: socket.socket, service: EnvService | None = None, quiet: bool = True):
        _, uvicorn = _fastapi()
        self.service, self.socket = service, sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(app, log_level="warning", access_log=not quiet, lifespan="on",
                                ws_max_size=MAX_BODY, timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        """Serves in this thread until Ctrl-C (or `stop()` from another)."""
        self.server.run(sockets=[self.socket])

    def start(self) -> EnvServer:
        """Serves in a daemon thread; returns once it accepts connections."""
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise EnvError(f"the environment server at {self.url} stopped while starting")
            threading.Event().wait(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.socket.close()
        if self.service is not None:
            self.service.shutdown()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def make_server(name: str, options: dict | None = None, *, port: int = 8766, host: str = "127.0.0.1",
                max_sessions: int = MAX_SESSIONS, max_steps: int = MAX_STEPS, idle_s: float = IDLE_S,
                api_key: str | None = None, max_body: int = MAX_BODY, quiet: bool = True) -> EnvServer:
    """A server of environment `name` built with `options`, bound to `host` (localhost by default); port 0 picks a
    free port. Bad options raise ConfigError and a taken port EnvError here, before it serves.

    Returns:
        The `EnvServer`, bound, not yet serving: `start()` (a thread) or `run()` (this thread); `url` is its
        address.
    """
    service = EnvService(name, options or {}, max_sessions=max_sessions, max_steps=max_steps, idle_s=idle_s)
    app = create_app(service, api_key=api_key, max_body=max_body)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise EnvError(f"cannot listen on {host}:{port} ({err.strerror}); pass another --port, or 0 for a free "
                       "one.") from None
    sock.listen(2048)  # the standard library's 5 reset connections of a 32-client burst
    return EnvServer(app, sock, service, quiet=quiet)


def serve(name: str, options: dict | None = None, *, port: int = 8766, max_sessions: int = MAX_SESSIONS,
          max_steps: int = MAX_STEPS, idle_s: float = IDLE_S, log=print) -> None:
    """`vlrl serve-env`: serves until Ctrl-C, then closes every session."""
    server = make_server(name, options, port=port, max_sessions=max_sessions, max_steps=max_steps, idle_s=idle_s,
                         quiet=False)
    keyed = " (API key required)" if os.environ.get(API_KEY_VARIABLE) else ""
    log(f"{name}: {server.url}{keyed}   OpenEnv: openenv:{server.url}   (Ctrl-C stops it)")
    try:
        server.run()
    finally:
        server.socket.close()
        server.service.shutdown()

