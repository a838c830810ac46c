"""The sessions of `vlrl serve-env`, apart from any web framework: one environment per session, its lock, its
limits (sessions open at once, steps per episode, idle time), and every refusal as a `Refused` with its HTTP status
and one line saying what and the fix. `vlrl.envs.server` puts them on HTTP and WebSocket.

    service = EnvService("grid", {"size": 4}, max_sessions=64, max_steps=10_000, idle_s=600)
    answer = service.reset({"seed": 3})                  # {"session": ID, "observation": OBS, ...}
    service.step({"session": answer["session"], "action": "<SOLUTION>right</SOLUTION>"})

Options are checked for type and bounds by `vlrl.envs.make` (`option_problems`, the check every command shares)
before anything is built (a grid of 100,000 cells a side is a 400 at once, never a layout); options of more than
`MAX_OPTIONS` keys are refused outright. A session idle for `idle_s` seconds expires: it is closed by the next request that looks (every reset
sweeps) or by the server's periodic sweep, and naming it answers 404.
"""

from __future__ import annotations

import secrets
import threading
import time

from vlrl.base.errors import VlrlError
from vlrl.envs import make
from vlrl.envs.base import Observation, to_data_url

MAX_SESSIONS = 64
MAX_STEPS = 100_000  # steps of one episode (Crafter's whole episode is 10,000); past it the episode must reset
IDLE_S = 600.0
MAX_OPTIONS = 32  # keys of a reset's options


class Refused(Exception):
    """A request the server answers with `status` and {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Session:
    """One episode's environment, its lock (one request at a time), when it was last used, its steps and end.

    Every use of `env` holds `lock`, closing it too (`retire`): a close, an expiry, a reset with new options or the
    server's shutdown waits for the step in progress, and a request that found the session just before it was
    closed finds it `closed` under the lock and answers 404, never a step on a closed game.
    """

    def __init__(self, env):
        self.env, self.lock, self.used = env, threading.Lock(), time.monotonic()
        self.done, self.started, self.steps, self.closed = False, False, 0, False

    def retire(self) -> None:
        """Closes the environment once the request using it (if any) has finished."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.env.close()

    def check_open(self, session_id) -> None:
        """Under `lock`: a 404 when the session was closed while this request waited for it."""
        if self.closed:
            raise Refused(404, f"session {session_id!r} was closed while this request waited for it; POST /reset to "
                               "start an episode")


class EnvService:
    """The sessions of one environment name, and the server's default options.

    Args:
        name: the environment (a name `vlrl.envs.make` takes).
        options: its options for every session (a reset's options go over them).
        max_sessions: sessions open at once; a reset past it is a 429 once idle ones have expired.
        max_steps: steps (requests to /step) of one episode; past it, a 409 until the session resets.
        idle_s: seconds a session may stay unused before it expires.
    """

    def __init__(self, name: str, options: dict, max_sessions: int = MAX_SESSIONS, max_steps: int = MAX_STEPS,
                 idle_s: float = IDLE_S):
        self.name, self.options = name, dict(options)
        self.max_sessions, self.max_steps, self.idle_s = max_sessions, max_steps, idle_s
        probe = make(name, **self.options)  # bad options fail here, before the server listens
        self.task_info = probe.task_info()
        self.description = probe.describe()
        probe.close()
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()

    def build(self, options):
        """A new environment with the server's options and `options` over them; bad ones are a 400."""
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise Refused(400, f"options must be a JSON object of the environment's settings, got {options!r}")
        if len(options) > MAX_OPTIONS:
            raise Refused(400, f"options has {len(options)} keys, more than the {MAX_OPTIONS} accepted")
        try:
            return make(self.name, **{**self.options, **options})
        except VlrlError as err:
            raise Refused(400, str(err)) from None
        except (TypeError, ValueError) as err:  # an environment of someone else's that checks with built-ins
            raise Refused(400, f"{self.name} refused the options: {err}") from None

    def open(self, env) -> tuple[str, Session]:
        """Registers a session for `env`: (its id, the session); a 429 when all are in use after expiring idle
        ones."""
        with self.lock:
            idle = self._pop_idle()
            full = len(self.sessions) >= self.max_sessions
            if not full:
                session_id = secrets.token_hex(8)
                session = self.sessions[session_id] = Session(env)
        for old in idle:
            old.retire()
        if full:
            env.close()
            raise Refused(429, f"all {self.max_sessions} sessions are in use; close finished ones (POST /close)"
                               " or start the server with a larger --max-sessions")
        return session_id, session

    def expire(self) -> int:
        """Closes every session idle past `idle_s`; returns how many (the server's periodic sweep)."""
        with self.lock:
            idle = self._pop_idle()
        for session in idle:
            session.retire()
        return len(idle)

    def _pop_idle(self) -> list[Session]:
        """Under `self.lock`: takes the sessions idle past `idle_s` out of the table (their callers close them after
        letting go of the lock, so no request waits on another's environment)."""
        now = time.monotonic()
        return [self.sessions.pop(session_id) for session_id, session in list(self.sessions.items())
                if now - session.used > self.idle_s and not session.lock.locked()]

    def get(self, session_id) -> Session:
        """The open session `session_id`, marked used; a 400 without an id, a 404 for an unknown or expired one."""
        if not isinstance(session_id, str) or not session_id:
            raise Refused(400, "name the episode's session (the id POST /reset returned): {\"session\": ID, ...}")
        expired = None
        with self.lock:
            session = self.sessions.get(session_id)
            if session is not None and time.monotonic() - session.used > self.idle_s and not session.lock.locked():
                expired, session = self.sessions.pop(session_id), None
            if session is not None:
                session.used = time.monotonic()
        if expired is not None:
            expired.retire()
        if session is None:
            raise Refused(404, f"no session {session_id!r} (closed, expired after {self.idle_s:g} s idle, or "
                               "never opened); POST /reset to start an episode")
        return session

    def close(self, session_id) -> None:
        """Ends session `session_id` (nothing when it is not open): gone from the table at once, its environment
        closed once the request using it has finished."""
        with self.lock:
            session = self.sessions.pop(session_id, None) if isinstance(session_id, str) else None
        if session is not None:
            session.retire()

    # --- the endpoints ----------------------------------------------------------------------------------------

    def reset(self, body: dict) -> dict:
        """POST /reset: a new episode of `seed` in the named session (a new one when it names none, an unknown
        one, or new options)."""
        seed = body.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise Refused(400, f"POST /reset needs a whole-number seed >= 0: {{\"seed\": 3}}, got {seed!r}")
        session_id = body.get("session", body.get("episode_id"))
        with self.lock:
            known = isinstance(session_id, str) and session_id in self.sessions
        fresh = not known or body.get("options") is not None  # a new episode, or new options: a new environment
        if fresh:
            if known:
                self.close(session_id)
            session_id, session = self.open(self.build(body.get("options")))
        else:
            session = self.get(session_id)
        try:
            with session.lock:
                session.check_open(session_id)
                observation = _run(session.env.reset, seed)
                session.done, session.started, session.steps = False, True, 0
                task = _run(session.env.task_info)
        except BaseException:  # a session this request opened never outlives its failure
            if fresh:
                self.close(session_id)
            raise
        return {"session": session_id, "episode_id": session_id, "observation": observation_json(observation),
                "reward": None, "done": False, "task": task}

    def step(self, body: dict) -> dict:
        """POST /step: the reply (`action`: text, or OpenEnv's {"reply": text}) as the session's next turn."""
        session = self.get(body.get("session", body.get("episode_id")))
        reply = body.get("action")
        if isinstance(reply, dict) and set(reply) <= {"reply", "metadata"}:
            reply = reply.get("reply")
        if not isinstance(reply, str):
            raise Refused(400, "POST /step needs the model's reply as text: {\"action\": \"...\"} or "
                               f"{{\"action\": {{\"reply\": \"...\"}}}}, got {reply!r}")
        with session.lock:
            session.check_open(body.get("session", body.get("episode_id")))
            if not session.started:
                raise Refused(409, "this session has no episode yet; POST /reset first")
            if session.done:
                raise Refused(409, "this episode is over; POST /reset with a seed to start another")
            if session.steps >= self.max_steps:
                raise Refused(409, f"this episode has taken {session.steps} steps, the server's cap "
                                   "(--max-steps); POST /reset to start another")
            step = _run(session.env.step, reply)
            session.steps += 1
            session.done = bool(step.done)
        return {"observation": observation_json(step.observation), "reward": float(step.reward),
                "done": bool(step.done), "info": step.info}

    def metrics(self, session_id) -> dict:
        session = self.get(session_id)
        with session.lock:
            session.check_open(session_id)
            return _run(session.env.metrics)

    def state(self, session_id) -> dict:
        """GET /state (OpenEnv's): the episode's id, its steps and metrics; without a session, the server's."""
        if session_id is None:
            return {"episode_id": None, "step_count": 0, "sessions": len(self.sessions)}
        session = self.get(session_id)
        with session.lock:
            session.check_open(session_id)
            return {"episode_id": session_id, "step_count": session.steps, "done": session.done,
                    "metrics": _run(session.env.metrics)}

    def describe_task(self, options) -> dict:
        if options is None:
            return self.task_info
        env = self.build(options)
        try:
            return env.task_info()
        finally:
            env.close()

    def health(self) -> dict:
        with self.lock:
            count = len(self.sessions)
        return {"status": "healthy", "ok": True, "env": self.name, "sessions": count,
                "max_sessions": self.max_sessions}

    def shutdown(self) -> None:
        """Closes every session, each once its request in progress has finished."""
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            session.retire()


def _run(call, *args):
    """The environment's call; its own explanation (a VlrlError) is a 400, any other failure a 500 naming it."""
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


def plain(value):
    """JSON for what environments put in `info`: numpy numbers and arrays, sets, anything else as text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str)
    return str(value)
