"""`vlrl serve-env NAME`: any registered environment over HTTP on localhost, so a trainer in another process (or
another language) runs its episodes. `vlrl.envs.remote.RemoteEnv` is the client.

Each episode runs in a session: POST /reset opens one (or resets the one it names) and returns its id, POST /step
takes it. Sessions run side by side (a GSPO group plays its episodes at once), up to `max_sessions`; one idle
for `idle_s` seconds is closed when room is needed.

    GET  /health                 -> {"ok": true, "env": NAME, "sessions": 2, "max_sessions": 64}
    GET  /task_info[?options=J]  -> the environment's task_info() (actions, per-turn cap, observation format)
    POST /reset {"seed": 3, "session": ID?, "options": {...}?}
                                 -> {"session": ID, "observation": OBS, "task": task_info}
    POST /step  {"session": ID, "action": "<SOLUTION>move_left, do</SOLUTION>"}
                                 -> {"observation": OBS, "reward": 1.0, "done": false, "info": {...}}
    GET  /metrics?session=ID     -> the episode's metrics() ({"success", "return", "length", ...})
    POST /close {"session": ID}  -> {"closed": true}
    OBS = {"image": "data:image/png;base64,..." or null, "text": "the state summary"}

`options` are the environment's own keyword arguments over the server's (`--set`); a reset that names an unknown
or expired session opens a new one. Every refusal is {"error": "what, and the fix"} with its status: 400 (bad JSON,
a missing or ill-typed field, bad options), 404 (unknown path or session), 405 (wrong method), 409 (a step after
the episode ended), 413 (a body over 1 MB), 429 (all sessions busy), 500 (the environment raised: the reason). The
server goes on after each.
"""

from __future__ import annotations

import functools
import http.server
import json
import secrets
import sys
import threading
import time
import urllib.parse

from vlrl.envs import make
from vlrl.envs.base import Observation, to_data_url
from vlrl.errors import EnvError, VlrlError
from vlrl.serve import serve_until_interrupted

MAX_BODY = 1 << 20  # a reply of a few thousand tokens is ~20 kB; anything near 1 MB is a mistake
MAX_SESSIONS = 64
IDLE_S = 600.0


class Refused(Exception):
    """A request the server answers with `status` and {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Session:
    """One episode's environment, its lock (one request at a time), when it was last used and whether it ended."""

    def __init__(self, env):
        self.env, self.lock, self.used, self.done, self.started = env, threading.Lock(), time.monotonic(), False, False


class EnvService:
    """The sessions of one environment name, and the server's default options."""

    def __init__(self, name: str, options: dict, max_sessions: int = MAX_SESSIONS, idle_s: float = IDLE_S):
        self.name, self.options, self.max_sessions, self.idle_s = name, dict(options), max_sessions, idle_s
        probe = make(name, **self.options)  # bad options fail here, before the server listens
        self.task_info = probe.task_info()
        probe.close()
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()

    def build(self, options) -> object:
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise Refused(400, f"options must be a JSON object of the environment's settings, got {options!r}")
        try:
            return make(self.name, **{**self.options, **options})
        except VlrlError as err:
            raise Refused(400, str(err)) from None

    def open(self, env) -> str:
        with self.lock:
            if len(self.sessions) >= self.max_sessions:
                self._expire()
            if len(self.sessions) >= self.max_sessions:
                raise Refused(429, f"all {self.max_sessions} sessions are in use; close finished ones (POST /close)"
                                   " or start the server with a larger --max-sessions")
            session_id = secrets.token_hex(8)
            self.sessions[session_id] = Session(env)
            return session_id

    def _expire(self) -> None:
        now = time.monotonic()
        for session_id, session in list(self.sessions.items()):
            if now - session.used > self.idle_s and not session.lock.locked():
                self.sessions.pop(session_id).env.close()

    def get(self, session_id) -> Session:
        if not isinstance(session_id, str) or not session_id:
            raise Refused(400, "name the episode's session (the id POST /reset returned): {\"session\": ID, ...}")
        with self.lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise Refused(404, f"no session {session_id!r} (closed, expired after {self.idle_s:.0f} s idle, or "
                               "never opened); POST /reset to start an episode")
        session.used = time.monotonic()
        return session

    def close(self, session_id) -> None:
        with self.lock:
            session = self.sessions.pop(session_id, None)
        if session is not None:
            session.env.close()

    # --- the endpoints ----------------------------------------------------------------------------------------

    def reset(self, body: dict) -> dict:
        seed = body.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise Refused(400, f"POST /reset needs a whole-number seed: {{\"seed\": 3}}, got {seed!r}")
        session_id = body.get("session")
        with self.lock:
            known = isinstance(session_id, str) and session_id in self.sessions
        fresh = not known or body.get("options") is not None  # a new episode, or new options: a new environment
        if fresh:
            if known:
                self.close(session_id)
            session_id = self.open(self.build(body.get("options")))
        session = self.get(session_id)
        try:
            with session.lock:
                observation = _run(session.env.reset, seed)
                session.done, session.started = False, True
                task = session.env.task_info()
        except Refused:
            if fresh:
                self.close(session_id)
            raise
        return {"session": session_id, "observation": observation_json(observation), "task": task}

    def step(self, body: dict) -> dict:
        session = self.get(body.get("session"))
        reply = body.get("action")
        if not isinstance(reply, str):
            raise Refused(400, f"POST /step needs the model's reply as text: {{\"action\": \"...\"}}, got {reply!r}")
        with session.lock:
            if not session.started:
                raise Refused(409, "this session has no episode yet; POST /reset first")
            if session.done:
                raise Refused(409, "this episode is over; POST /reset with a seed to start another")
            step = _run(session.env.step, reply)
            session.done = bool(step.done)
        return {"observation": observation_json(step.observation), "reward": float(step.reward),
                "done": bool(step.done), "info": step.info}

    def metrics(self, query: dict) -> dict:
        session = self.get((query.get("session") or [None])[0])
        with session.lock:
            return _run(session.env.metrics)

    def describe_task(self, query: dict) -> dict:
        if "options" not in query:
            return self.task_info
        try:
            options = json.loads(query["options"][0])
        except ValueError:
            raise Refused(400, "options must be JSON, e.g. ?options={\"size\":128}") from None
        env = self.build(options)
        try:
            return env.task_info()
        finally:
            env.close()

    def health(self) -> dict:
        with self.lock:
            count = len(self.sessions)
        return {"ok": True, "env": self.name, "sessions": count, "max_sessions": self.max_sessions}

    def shutdown(self) -> None:
        for session_id in list(self.sessions):
            self.close(session_id)


def _run(call, *args):
    """The environment's call; its failure becomes a 500 naming the reason."""
    try:
        return call(*args)
    except VlrlError as err:  # the environment's own explanation (a bad seed ...): the request's fault
        raise Refused(400, str(err)) from None
    except Exception as err:  # noqa: BLE001 -- any failure of the game is the answer's reason, never the server's end
        raise Refused(500, f"the environment raised {type(err).__name__}: {err}") from None


def observation_json(observation: Observation) -> dict:
    """An observation as the protocol sends it: the image as a PNG data URL (null without one) and the text."""
    image = None if observation.image is None else to_data_url(observation.image)
    return {"image": image, "text": observation.text}


def _plain(value):
    """JSON for what environments put in `info`: numpy numbers and arrays, sets, anything else as text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str)
    return str(value)


class EnvHandler(http.server.BaseHTTPRequestHandler):
    """Routes the protocol's requests to the service; every answer is JSON."""

    routes = frozenset({("GET", "/health"), ("GET", "/task_info"), ("GET", "/metrics"), ("POST", "/reset"),
                        ("POST", "/step"), ("POST", "/close")})

    def __init__(self, *args, service: EnvService, quiet: bool = False, **kwargs):
        self.service, self.quiet = service, quiet
        super().__init__(*args, **kwargs)

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def _answer(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        try:
            if (method, url.path) not in self.routes:
                if any(path == url.path for _, path in self.routes):
                    raise Refused(405, f"{url.path} takes {'POST' if method == 'GET' else 'GET'}, not {method}")
                raise Refused(404, f"no endpoint {url.path}; the server answers /health, /task_info, /reset, /step, "
                                   "/metrics, /close")
            query = urllib.parse.parse_qs(url.query)
            service = self.service
            if method == "GET":
                result = {"/health": service.health, "/task_info": lambda: service.describe_task(query),
                          "/metrics": lambda: service.metrics(query)}[url.path]()
            else:
                body = self._body()
                if url.path == "/close":
                    service.close(body.get("session"))
                    result = {"closed": True}
                else:
                    result = (service.reset if url.path == "/reset" else service.step)(body)
            self._send(200, result)
        except Refused as err:
            self._send(err.status, {"error": str(err)})
        except Exception as err:  # noqa: BLE001 -- a bug of ours: the request fails, the server goes on
            self._send(500, {"error": f"the server failed: {type(err).__name__}: {err}"})

    def _body(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise Refused(400, "Content-Length is not a number") from None
        if length > MAX_BODY:
            self.close_connection = True  # the body stays unread
            raise Refused(413, f"the body has {length} bytes, more than the {MAX_BODY} accepted")
        raw = self.rfile.read(length) if length > 0 else b""
        if not raw.strip():
            raise Refused(400, "the body is empty; send a JSON object, e.g. {\"seed\": 3}")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise Refused(400, f"the body is not JSON ({err}); send a JSON object") from None
        if not isinstance(body, dict):
            raise Refused(400, f"the body must be a JSON object, got {type(body).__name__}")
        return body

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload, default=_plain).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):
        if not self.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


def make_server(name: str, options: dict | None = None, *, port: int = 8766, host: str = "127.0.0.1",
                max_sessions: int = MAX_SESSIONS, idle_s: float = IDLE_S,
                quiet: bool = False) -> http.server.ThreadingHTTPServer:
    """A server of environment `name` built with `options`, bound to `host` (localhost by default); port 0 picks a
    free port. Bad options raise ConfigError here, before it listens.

    Returns:
        The server, not yet serving: call `serve_forever()` (or `vlrl.serve.serve_in_thread`). Its `service` holds
        the sessions; `server_close()` then `service.shutdown()` releases everything.
    """
    service = EnvService(name, options or {}, max_sessions=max_sessions, idle_s=idle_s)
    server = http.server.ThreadingHTTPServer((host, port), functools.partial(EnvHandler, service=service,
                                                                                quiet=quiet))
    server.daemon_threads = True
    server.service = service
    return server


def serve(name: str, options: dict | None = None, *, port: int = 8766, max_sessions: int = MAX_SESSIONS,
          log=print) -> None:
    """`vlrl serve-env`: serves until Ctrl-C, then closes every session."""
    try:
        server = make_server(name, options, port=port, max_sessions=max_sessions)
    except OSError as err:  # the port is taken
        raise EnvError(f"cannot listen on 127.0.0.1:{port} ({err.strerror}); pass another --port, or 0 for a free "
                       "one.") from None
    log(f"{name}: http://127.0.0.1:{server.server_address[1]}   (Ctrl-C stops it)")
    try:
        serve_until_interrupted(server)
    finally:
        server.service.shutdown()
