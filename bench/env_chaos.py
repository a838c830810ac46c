"""`vlrl serve-env crafter` under chaos: many clients at once against the real command (a subprocess, with an API
key), each doing random resets, steps, closes, resets with new options, wrong keys, malformed and oversized bodies,
WebSocket episodes and disconnects in the middle of a request, while the server is sent SIGTERM once and started
again on the same port. Loopback only; it stops by itself.

    python bench/env_chaos.py                                  # 64 clients, 300 s -> bench/results/env_chaos.{json,md}
    python bench/env_chaos.py --clients 8 --seconds 30 --output /tmp/chaos    # a smoke run

What it checks, beside counting requests by status code and their latency:
- every answer is the one expected (a 4xx where the request was wrong, 200 where it was right), and every refusal
  is a JSON {"error": one line};
- cross-session answers: each client replays every episode it plays with a local Crafter of the same seed and
  options, so an observation, reward or end that is not its own game's (another client's frame, a lost or doubled
  step) is counted;
- closed-session steps: after a close, or a reset with new options, the old session is stepped again: anything but
  404 is counted (a session of the old process after the restart is lost too: 404 expected);
- the server's RSS every 2 s, and every 5xx with its cause (from the answers and the server's own log).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the server subprocess runs its vlrl too
sys.path.insert(0, str(ROOT))

from vlrl.envs import make
from vlrl.envs.base import from_data_url
from vlrl.envs.crafter import ACTIONS

SERVER_OPTIONS = {"size": 64}  # 64 px frames: the server's and the replays' CPU fit two shared cores
OPTION_SETS = ({"size": 64}, {"size": 96}, {"size": 64, "max_turns": 20})  # "new options" picks one
SEEDS = (0, 1, 2)  # a new Crafter world costs ~2.5 s of Python (each server makes 6: 3 seeds, 2 sizes), then is kept
MAX_BODY = 1 << 20
# what a client does next, and how often (a step most of the time, every kind of trouble now and then)
ACTS = {"step": 50, "reset_same": 6, "new_options": 4, "close": 4, "wrong_key": 5, "malformed": 8, "oversized": 3,
        "cut_body": 4, "hang_up": 2, "look": 6}
WS_SHARE = 0.2  # of new episodes, played over OpenEnv's WebSocket instead of HTTP sessions
MALFORMED = (  # (method, path, body, status): the body as bytes, or a dict where {sid} is the client's session
    ("POST", "/reset", b"{not json", 400), ("POST", "/reset", b"[1, 2]", 400), ("POST", "/step", b"", 400),
    ("POST", "/reset", {"seed": "three"}, 400), ("POST", "/reset", {"seed": -1}, 400),
    ("POST", "/reset", {"seed": 1, "options": {"size": 10**6}}, 400),
    ("POST", "/reset", {"seed": 1, "options": {"colour": "red"}}, 400),
    ("POST", "/reset", {"seed": 1, "options": [1]}, 400), ("POST", "/step", {"action": "do"}, 400),
    ("POST", "/step", {"session": "{sid}", "action": 7}, 400), ("POST", "/step", {"session": "feedbeef", "action": "do"}, 404),
    ("GET", "/metrics?session=feedbeef", None, 404), ("GET", "/task_info?options=%7Bbad", None, 400),
    ("GET", "/nowhere", None, 404), ("GET", "/reset", None, 405), ("POST", "/health", b"{}", 405),
)


def reply_of(rng: random.Random) -> str:
    """A model's reply: one or two actions in solution tags, now and then none (an invalid turn)."""
    if rng.random() < 0.05:
        return "I think I should look around first."
    return f"<SOLUTION>{', '.join(rng.choice(ACTIONS[:6]) for _ in range(rng.randint(1, 2)))}</SOLUTION>"


def read_answer(sock: socket.socket) -> str:
    """An HTTP answer read whole from `sock`: its head, then its body up to Content-Length (or until it closes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data.decode("latin-1")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = re.search(rb"(?i)content-length:\s*(\d+)", head)
    while length and len(body) < int(length.group(1)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode("latin-1")


class Server:
    """`vlrl serve-env crafter` as a subprocess on `port` with `key`; its log in `log_dir`; `generation` counts
    starts (a session of an earlier generation is gone)."""

    def __init__(self, port: int, key: str, log_dir: Path):
        self.port, self.key, self.log_dir, self.generation, self.process = port, key, log_dir, 0, None
        self.down_since: float | None = None

    def start(self) -> float:
        """Starts the next generation; returns the seconds until it answered /health."""
        started = time.monotonic()
        log = open(self.log_dir / f"server{self.generation + 1}.log", "wb")  # noqa: SIM115 -- the process writes it
        option = [f"--set={k}={v}" for k, v in SERVER_OPTIONS.items()]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vlrl.cli", "serve-env", "crafter", "--port", str(self.port), *option],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "ENVIRONMENT_API_KEY": self.key,
                                                       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
        log.close()
        self.generation += 1  # a session opened from now on is this process's
        while self.health() is None:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: see {log.name}")
            time.sleep(0.1)
        self.down_since = None
        return time.monotonic() - started

    def health(self) -> dict | None:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            connection.request("GET", "/health", headers={"X-API-Key": self.key})
            answer = connection.getresponse()
            return json.loads(answer.read()) if answer.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def terminate(self, timeout: float = 60.0) -> dict:
        """SIGTERM and wait: {"exit_code", "seconds_to_exit"} (SIGKILL and exit_code None past `timeout`)."""
        self.down_since = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        return {"exit_code": code, "seconds_to_exit": round(time.monotonic() - self.down_since, 2)}

    def rss_mb(self) -> float | None:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


class Client:
    """One client's random walk through the protocol; `tally` holds what it saw."""

    def __init__(self, index: int, server: Server, deadline: float, seeds: tuple = SEEDS):
        self.rng, self.server, self.deadline, self.seeds = random.Random(index), server, deadline, seeds
        self.session = self.generation = self.local = None
        self.refused = False  # whether the last failed request never reached the server
        self.locals: dict = {}
        self.tally = {"status": collections.Counter(), "latency_ms": collections.defaultdict(list),
                      "ws": collections.Counter(), "unexpected": [], "cross": [], "closed_steps": [],
                      "no_reason": [], "connection_errors": [], "steps_checked": 0, "lost_to_restart": 0}

    # --- the wire ------------------------------------------------------------------------------------------------

    def call(self, method: str, path: str, body=None, *, key: str | None = "right", expect=(200,), kind=None):
        """One HTTP request on a new connection (as RemoteEnv makes them): (status, answer), or None when the
        connection failed. A status outside `expect` is recorded as unexpected, a refusal without one line of
        reason too."""
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {self.server.key if key == 'right' else key}"
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        started = time.perf_counter()
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
            connection.close()
        except (OSError, http.client.HTTPException) as err:
            self.refused = isinstance(err, ConnectionRefusedError)  # the request never reached a server
            self.connection_error(f"{method} {path}: {type(err).__name__}: {err}")
            return None
        status = response.status
        self.tally["status"][status] += 1
        self.tally["latency_ms"][kind or path.split("?")[0]].append(1000 * (time.perf_counter() - started))
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {"error": None}
        if status >= 400:
            reason = answer.get("error") if isinstance(answer, dict) else None
            if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
                self.note("no_reason", f"{method} {path} -> {status} {raw[:200]!r}")
        if status not in expect:
            self.note("unexpected", f"{method} {path} {str(body)[:80]} -> {status} (expected {expect}): "
                                    f"{str(answer)[:200]}")
        return status, answer

    def raw(self, head: bytes, parts, *, read: bool = True) -> str | None:
        """Sends an HTTP request by hand (the head, then each part of the body); the answer's status line, or None
        when `read` is off (the client hangs up) or the connection failed."""
        try:
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=60) as sock:
                sock.sendall(head)
                try:
                    for part in parts:
                        sock.sendall(part)
                except OSError:  # the server answered (413) and closed before the rest arrived
                    pass
                if not read:
                    return None
                answer = read_answer(sock)
        except OSError as err:
            self.connection_error(f"raw request: {type(err).__name__}: {err}")
            return None
        status = answer.split(" ", 2)[1] if answer.startswith("HTTP/1.1 ") else "none"
        if status.isdigit():
            self.tally["status"][int(status)] += 1
            body = answer.split("\r\n\r\n", 1)[-1]
            if int(status) >= 400 and not re.fullmatch(r'\{"error":\s*"[^\n]+"\}', body.strip()):
                self.note("no_reason", f"raw -> {status} {body[:200]!r}")
        return status

    def connection_error(self, what: str) -> None:
        """A failed connection: expected only while the server is down for its restart."""
        down = self.server.down_since is not None
        self.tally["connection_errors"].append(("restart" if down else "up", what))
        if not down:
            self.note("unexpected", f"connection failed while the server was up: {what}")
        time.sleep(0.2)

    def note(self, what: str, text: str) -> None:
        self.tally[what].append(text)

    def head(self, method: str, path: str, length: int | None, key: bool = True) -> bytes:
        auth = f"Authorization: Bearer {self.server.key}\r\n" if key else ""
        size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
        return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}{size}Content-Type: application/json\r\n\r\n" \
            .encode()

    # --- the episode, checked against the local game -------------------------------------------------------------

    def local_game(self, options: dict):
        key = json.dumps(options, sort_keys=True)
        if key not in self.locals:
            self.locals[key] = make("crafter", **{**SERVER_OPTIONS, **options})
        return self.locals[key]

    def check(self, observation: dict, want, reward=None, done=None, got_reward=None, got_done=None) -> None:
        """Counts an answer unlike the local game's (an observation, reward or end of another episode)."""
        self.tally["steps_checked"] += 1
        image = from_data_url(observation["image"])
        if (image.tobytes() != want.image.tobytes() or observation["text"] != want.text
                or (reward, done) != (got_reward, got_done)):
            self.note("cross", f"session {self.session}: got {observation['text'][:60]!r} reward {got_reward} done "
                               f"{got_done}, the local game {want.text[:60]!r} reward {reward} done {done}")

    def open(self, options: dict | None = None) -> None:
        """A new HTTP session (or, now and then, a whole WebSocket episode)."""
        if self.rng.random() < WS_SHARE:
            return self.websocket_episode()
        options = options if options is not None else self.rng.choice(OPTION_SETS)
        seed = self.rng.choice(self.seeds)
        answer = self.call("POST", "/reset", {"seed": seed, "options": options}, expect=(200, 429))
        if answer is None or answer[0] != 200:
            time.sleep(0.5)  # all sessions in use (429), or the server restarting: try again shortly
            return None
        self.session, self.generation, self.local = answer[1]["session"], self.server.generation, \
            self.local_game(options)
        self.check(answer[1]["observation"], self.local.reset(seed))
        return None

    def lost(self, what: str) -> None:
        """A 404 for the client's own session: right only when the server restarted since it opened."""
        if self.server.generation != self.generation:
            self.tally["lost_to_restart"] += 1
        else:
            self.note("unexpected", f"{what}: 404 for a session that should be open")
        self.session = None

    def step(self) -> None:
        reply = reply_of(self.rng)
        answer = self.call("POST", "/step", {"session": self.session, "action": reply}, expect=(200, 404), kind="step")
        if answer is None and not self.refused:  # the step may have run: the episode cannot be checked any more
            self.abandon()
        elif answer is None:  # no server listened (the restart): the session is kept, and is 404 afterwards
            return
        elif answer[0] == 404:
            self.lost("step")
        else:
            want = self.local.step(reply)
            got = answer[1]
            self.check(got["observation"], want.observation, want.reward, want.done, got["reward"], got["done"])
            if got["done"]:
                self.reset_same()

    def reset_same(self) -> None:
        seed = self.rng.choice(self.seeds)
        answer = self.call("POST", "/reset", {"seed": seed, "session": self.session}, kind="reset")
        if answer is None:
            return self.abandon()
        if answer[0] != 200:
            return None
        if answer[1]["session"] != self.session:  # the server no longer knew it, and opened a new one
            if self.server.generation == self.generation:
                self.note("unexpected", "a reset naming an open session opened another")
            else:
                self.tally["lost_to_restart"] += 1
            self.local = self.local_game({})  # a new session takes the server's options
            self.session, self.generation = answer[1]["session"], self.server.generation
        self.check(answer[1]["observation"], self.local.reset(seed))
        return None

    def closed_step(self, session: str, why: str) -> None:
        """Steps a session that was just closed: anything but 404 is a step from a closed session."""
        answer = self.call("POST", "/step", {"session": session, "action": "<SOLUTION>do</SOLUTION>"},
                           expect=(404,), kind="step")
        if answer is not None and answer[0] != 404:
            self.note("closed_steps", f"{why}: POST /step on closed session {session} -> {answer[0]}")

    def new_options(self) -> None:
        options, seed, old = self.rng.choice(OPTION_SETS), self.rng.choice(self.seeds), self.session
        answer = self.call("POST", "/reset", {"seed": seed, "session": old, "options": options}, expect=(200, 429),
                           kind="reset")
        if answer is None:
            return self.abandon()
        if answer[0] != 200:  # 429: the old session was closed, no room for the new one yet
            self.session = None
        else:
            self.session, self.generation = answer[1]["session"], self.server.generation
            self.local = self.local_game(options)
            self.check(answer[1]["observation"], self.local.reset(seed))
        self.closed_step(old, "after a reset with new options")
        return None

    def close(self) -> None:
        old, self.session = self.session, None
        if self.call("POST", "/close", {"session": old}) is not None:
            self.closed_step(old, "after POST /close")
            self.call("GET", f"/metrics?session={old}", expect=(404,))

    def abandon(self) -> None:
        """Gives up the session whose state is unknown (a request cut off): closes it (quietly) and starts over."""
        if self.session is not None:
            old, self.session = self.session, None
            self.call("POST", "/close", {"session": old})

    # --- trouble -------------------------------------------------------------------------------------------------

    def wrong_key(self) -> None:
        method, path, body = self.rng.choice([("GET", "/health", None), ("POST", "/reset", {"seed": 0}),
                                              ("POST", "/step", {"session": self.session, "action": "do"}),
                                              ("GET", "/task_info", None)])
        self.call(method, path, body, key=self.rng.choice([None, "not-the-key", ""]), expect=(401,))

    def malformed(self) -> None:
        method, path, body, status = self.rng.choice(MALFORMED)
        if isinstance(body, dict):
            body = json.loads(json.dumps(body).replace("{sid}", self.session))
        self.call(method, path, body, expect=(status,))

    def oversized(self) -> None:
        """A body past 1 MB: declared (Content-Length), or chunked without a length."""
        chunk = b" " * 65536
        if self.rng.random() < 0.5:
            status = self.raw(self.head("POST", "/step", 2 * MAX_BODY), [chunk])
        else:
            status = self.raw(self.head("POST", "/reset", None), [b"%x\r\n" % len(chunk) + chunk + b"\r\n"] * 20
                              + [b"0\r\n\r\n"])
        if status is not None and status != "413":
            self.note("unexpected", f"an oversized body -> {status} (expected 413)")

    def cut_body(self) -> None:
        """Hangs up in the middle of a step's body: the step never happens, and the episode goes on (the next step
        is checked against the local game, which did not take this one)."""
        body = json.dumps({"session": self.session, "action": "<SOLUTION>do</SOLUTION>"}).encode()
        self.raw(self.head("POST", "/step", len(body)), [body[: len(body) // 2]], read=False)

    def hang_up(self) -> None:
        """Sends a whole step and hangs up before the answer: whether it ran is unknown, so the session is closed
        (perhaps under that very step) and a new one opened."""
        body = json.dumps({"session": self.session, "action": reply_of(self.rng)}).encode()
        self.raw(self.head("POST", "/step", len(body)) + body, [], read=False)
        self.abandon()

    def look(self) -> None:
        path = self.rng.choice([f"/state?session={self.session}", f"/metrics?session={self.session}", "/health",
                                "/metadata", "/schema", "/task_info"])
        answer = self.call("GET", path, expect=(200, 404))
        if answer is not None and answer[0] == 404:
            self.lost(f"GET {path}")

    def websocket_episode(self) -> None:
        """A whole episode over OpenEnv's WebSocket, checked step by step; now and then a malformed or oversized
        message, or a hang-up in the middle of a step."""
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
        from websockets.sync.client import connect

        url = f"ws://127.0.0.1:{self.server.port}/ws"
        ws_tally = self.tally["ws"]
        if self.rng.random() < 0.1:  # the wrong key: refused at the handshake
            try:
                connect(url, additional_headers={"Authorization": "Bearer nope"}, open_timeout=60).close()
                self.note("unexpected", "a WebSocket with the wrong key was accepted")
            except InvalidStatus as err:
                ws_tally[f"handshake {err.response.status_code}"] += 1
            except (OSError, InvalidHandshake) as err:  # no server, or one shutting down mid-handshake
                self.connection_error(f"WebSocket: {type(err).__name__}: {err}")
            return
        options, seed = self.rng.choice(OPTION_SETS), self.rng.choice(self.seeds)
        local = self.local_game(options)
        try:
            with connect(url, additional_headers={"Authorization": f"Bearer {self.server.key}"}, open_timeout=60,
                         max_size=1 << 24) as ws:
                def ask(message):
                    started = time.perf_counter()
                    ws.send(message if isinstance(message, str) else json.dumps(message))
                    answer = json.loads(ws.recv(timeout=60))
                    self.tally["latency_ms"]["ws " + (message["type"] if isinstance(message, dict) else "bad")] \
                        .append(1000 * (time.perf_counter() - started))
                    code = (answer.get("data") or {}).get("code")
                    ws_tally[answer["type"] + (f" {code}" if code else "")] += 1
                    return answer

                answer = ask({"type": "reset", "data": {"seed": seed, **options}})
                if answer["type"] != "observation":
                    if (answer.get("data") or {}).get("code") != "CAPACITY_REACHED":
                        self.note("unexpected", f"a WebSocket reset -> {str(answer)[:200]}")
                    return
                self.check(answer["data"]["observation"], local.reset(seed))
                for _ in range(self.rng.randint(3, 30)):
                    if time.monotonic() > self.deadline:
                        break
                    trouble = self.rng.random()
                    if trouble < 0.08:
                        if ask("{not json")["type"] != "error":
                            self.note("unexpected", "a malformed WebSocket message was not refused")
                        continue
                    if trouble < 0.10:  # past the server's message limit: it closes the connection (1009)
                        ws.send(json.dumps({"type": "step", "data": {"reply": " " * (MAX_BODY + 10)}}))
                        ws.recv(timeout=60)
                        self.note("unexpected", "an oversized WebSocket message was answered")
                        return
                    reply = reply_of(self.rng)
                    if trouble < 0.14:  # hang up before the step's answer
                        ws.send(json.dumps({"type": "step", "data": {"reply": reply}}))
                        ws_tally["hang-up"] += 1
                        return
                    answer, want = ask({"type": "step", "data": {"reply": reply}}), local.step(reply)
                    data = answer["data"]
                    self.check(data["observation"], want.observation, want.reward, want.done, data["reward"],
                               data["done"])
                    if data["done"]:
                        break
                ws.send(json.dumps({"type": "close"}))
        except ConnectionClosed as err:
            code = err.rcvd.code if err.rcvd is not None else None
            ws_tally[f"closed {code}"] += 1
            if code != 1009 and self.server.down_since is None:  # 1009: too big; else only while restarting
                self.note("unexpected", f"the WebSocket closed: {err}")
        except (OSError, InvalidHandshake) as err:  # no server, one shutting down mid-handshake, or a timeout
            self.connection_error(f"WebSocket: {type(err).__name__}: {err}")

    # --- the walk ------------------------------------------------------------------------------------------------

    def run(self) -> None:
        acts, weights = list(ACTS), list(ACTS.values())
        while time.monotonic() < self.deadline:
            act = "open" if self.session is None else self.rng.choices(acts, weights)[0]
            try:
                getattr(self, act)()
            except Exception as err:  # noqa: BLE001 -- a surprise of this client is counted, and it goes on
                self.note("unexpected", f"the client failed in {act}: {type(err).__name__}: {err}")
                self.session = None
        if self.session is not None:
            self.call("POST", "/close", {"session": self.session})


def percentile(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None


HANDSHAKE_NOTE = "ASGI callable returned without completing handshake."  # see server_log


def server_log(log_dir: Path) -> dict:
    """The server's own account (its log runs at warning level, so 5xx show as their tracebacks): each error with
    its cause. uvicorn's WebSocket layer logs HANDSHAKE_NOTE at ERROR after the Guard's 401 denial although the
    client got the 401 (its sans-I/O protocol does not count a denial response as the end of the handshake): those
    are counted apart, matched one for one against the 401 handshakes the clients saw."""
    errors, handshake_notes = [], 0
    for log in sorted(log_dir.glob("server*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines):
            if HANDSHAKE_NOTE in line:
                handshake_notes += 1
            elif line.startswith(("ERROR", "Traceback", "CRITICAL")):
                cause = next((later for later in lines[number + 1:]
                              if re.match(r"^\w+(\.\w+)*(Error|Exception|Disconnect)", later)), "")
                errors.append(f"{log.name}: {line.strip()} {cause.strip()}".strip())
    return {"errors": [e for e in errors if not e.endswith("Traceback (most recent call last):")],
            "handshake_notes": handshake_notes}


def chaos(clients: int = 64, seconds: float = 300.0, restart_at: float | None = None, warmup_s: float | None = None,
          seeds: tuple = SEEDS) -> dict:
    """Runs the chaos (see the module docstring) and returns its figures."""
    restart_at = seconds * 0.2 if restart_at is None else restart_at
    warmup_s = min(60.0, seconds / 5) if warmup_s is None else warmup_s
    for options in OPTION_SETS:  # the replays' worlds, made before the clock starts (the server makes its own)
        for seed in seeds:
            make("crafter", **{**SERVER_OPTIONS, **options}).reset(seed)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_dir = Path(tempfile.mkdtemp(prefix="env_chaos_"))
    server = Server(port, secrets.token_hex(16), log_dir)
    first_start = server.start()
    started = time.monotonic()
    deadline = started + seconds
    workers = [Client(i, server, deadline, tuple(seeds)) for i in range(clients)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    rss, sigterm, stop = [], {}, threading.Event()

    def sample():  # the server's RSS (and open sessions) every 2 s, through the restart too
        while not stop.wait(2.0):
            mb, health = server.rss_mb(), server.health()
            if mb is not None:
                rss.append([round(time.monotonic() - started, 1), server.generation, round(mb, 1),
                            health["sessions"] if health else None])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(max(0.0, started + restart_at - time.monotonic()))
    if time.monotonic() < deadline:
        down = time.monotonic()
        sigterm = {"at_s": round(down - started, 1), **server.terminate()}
        sigterm["restart_s"] = round(server.start(), 2)
        sigterm["down_s"] = round(time.monotonic() - down, 2)
    for thread in threads:
        thread.join(timeout=max(1.0, deadline - time.monotonic() + 120))
    stop.set()
    time.sleep(0.5)
    health = server.health()
    final = server.terminate()
    return summary(workers, server_log(log_dir), rss, sigterm, final, health, clients=clients, seconds=seconds,
                   warmup_s=warmup_s, first_start=first_start, stuck=sum(t.is_alive() for t in threads),
                   log_dir=log_dir)


def rss_growth(rss: list, warmup_s: float, seconds: float) -> dict:
    """RSS growth of the server that ran longest, from just after its warm-up to the end of the clients' traffic:
    the medians of the first and last five samples past `warmup_s` of its life."""
    lives = collections.defaultdict(list)
    for t, generation, mb, _ in rss:
        if t <= seconds:
            lives[generation].append((t, mb))
    generation, life = max(lives.items(), key=lambda item: item[1][-1][0] - item[1][0][0])
    after = [mb for t, mb in life if t - life[0][0] >= warmup_s]
    if len(after) < 10:
        return {"generation": generation, "growth": None, "samples": len(after)}
    first, last = statistics.median(after[:5]), statistics.median(after[-5:])
    return {"generation": generation, "growth": round(last / first - 1, 4), "after_warmup_mb": round(first, 1),
            "end_mb": round(last, 1), "peak_mb": max(after), "samples": len(after)}


def summary(workers, log, rss, sigterm, final, health, **run) -> dict:
    tallies = [w.tally for w in workers]

    def joined(key):
        return [x for t in tallies for x in t[key]]

    status = sum((t["status"] for t in tallies), collections.Counter())
    latency = collections.defaultdict(list)
    for t in tallies:
        for kind, values in t["latency_ms"].items():
            latency[kind].extend(values)
    every = [x for values in latency.values() for x in values]
    client_5xx = sum(n for code, n in status.items() if code >= 500)
    websocket = sum((t["ws"] for t in tallies), collections.Counter())
    growth = rss_growth(rss, run["warmup_s"], run["seconds"])
    connection_errors = joined("connection_errors")
    return {
        "clients": run["clients"], "seconds": run["seconds"], "env": f"crafter {SERVER_OPTIONS}",
        "requests": sum(status.values()), "status_counts": {str(k): v for k, v in sorted(status.items())},
        "server_errors": max(client_5xx, len(log["errors"])), "server_error_causes": log["errors"][:50],
        "server_log_handshake_notes": log["handshake_notes"],
        "websocket_handshakes_refused_401": websocket["handshake 401"],
        "cross_session_answers": len(joined("cross")), "cross_session_examples": joined("cross")[:10],
        "closed_session_steps": len(joined("closed_steps")), "closed_session_examples": joined("closed_steps")[:10],
        "answers_checked": sum(t["steps_checked"] for t in tallies),
        "unexpected_answers": len(joined("unexpected")), "unexpected_examples": joined("unexpected")[:20],
        "refusals_without_one_line_reason": len(joined("no_reason")), "no_reason_examples": joined("no_reason")[:10],
        "websocket_messages": dict(websocket),
        "sessions_lost_to_restart": sum(t["lost_to_restart"] for t in tallies),
        "connection_errors_during_restart": sum(1 for when, _ in connection_errors if when == "restart"),
        "connection_errors_while_up": sum(1 for when, _ in connection_errors if when == "up"),
        "latency_ms": {"p50": percentile(every, 0.5), "p99": percentile(every, 0.99),
                       **{kind: {"n": len(v), "p50": percentile(v, 0.5), "p99": percentile(v, 0.99)}
                          for kind, v in sorted(latency.items()) if len(v) >= 20}},
        "sigterm": sigterm, "final_sigterm": final, "first_start_s": round(run["first_start"], 2),
        "sessions_left": health["sessions"] if health else None, "clients_stuck": run["stuck"],
        "rss_growth": growth["growth"], "rss": growth, "rss_samples": rss, "server_logs": str(run["log_dir"]),
    }


def markdown(r: dict) -> str:
    statuses = ", ".join(f"{code}: {n}" for code, n in r["status_counts"].items())
    kinds = "\n".join(f"| {kind} | {v['n']} | {v['p50']} | {v['p99']} |" for kind, v in r["latency_ms"].items()
                      if isinstance(v, dict))
    rss, s = r["rss"], r["sigterm"]
    series = ", ".join(f"{t:.0f} s: {mb:.0f} MB ({n} sessions)" for t, _, mb, n in r["rss_samples"][::15])
    causes = "\n".join(f"- `{c}`" for c in r["server_error_causes"]) or "none"
    unexpected = "\n".join(f"- {c}" for c in r["unexpected_examples"]) or "none"
    return f"""# `vlrl serve-env crafter` under chaos

`python bench/env_chaos.py --clients {r['clients']} --seconds {r['seconds']:g}`: {r['clients']} clients for
{r['seconds']:g} s against `vlrl serve-env crafter --set size=64` (a subprocess, ENVIRONMENT_API_KEY set) on 127.0.0.1,
each doing random steps, resets, closes, resets with new options, wrong keys, malformed and oversized bodies,
WebSocket episodes and hang-ups in the middle of a request; SIGTERM once at {s.get('at_s')} s, then started again.
Every answer to an episode is checked against the same seed and replies played by a local Crafter.

| target | result |
|---|---|
| 5xx | {r['server_errors']} |
| cross-session answers (of {r['answers_checked']} observations checked) | {r['cross_session_answers']} |
| steps answered from a closed session | {r['closed_session_steps']} |
| server RSS growth after warm-up | {r['rss_growth']} ({rss.get('after_warmup_mb')} -> {rss.get('end_mb')} MB, peak {rss.get('peak_mb')} MB) |
| refusals without a one-line reason | {r['refusals_without_one_line_reason']} |
| answers other than the one expected | {r['unexpected_answers']} |

Requests: {r['requests']} ({statuses}).
WebSocket messages: {r['websocket_messages']}. The server's log holds {r['server_log_handshake_notes']} lines of uvicorn's
"{HANDSHAKE_NOTE}" for the {r['websocket_handshakes_refused_401']} WebSocket handshakes refused with
401 (logged at ERROR by uvicorn after the denial was sent; no 5xx).
Latency over all requests: p50 {r['latency_ms']['p50']} ms, p99 {r['latency_ms']['p99']} ms (2 CPU cores shared
with other work; the server, 64 clients and their local replays all run on them).

| request | n | p50 ms | p99 ms |
|---|---|---|---|
{kinds}

SIGTERM: the server exited with {s.get('exit_code')} in {s.get('seconds_to_exit')} s; the next one answered after
{s.get('restart_s')} s ({s.get('down_s')} s down). Connections refused while it was down: {r['connection_errors_during_restart']};
while it was up: {r['connection_errors_while_up']}. Sessions lost to the restart (404 afterwards, as they should be):
{r['sessions_lost_to_restart']}. Sessions left open after every client closed its own: {r['sessions_left']}.
The final SIGTERM: exit {r['final_sigterm']['exit_code']} in {r['final_sigterm']['seconds_to_exit']} s.

Server RSS (every 30 s): {series}.

5xx and their causes: {causes}

Unexpected answers (first 20): {unexpected}
"""


def main() -> None:
    from results_io import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--restart-at", type=float, help="seconds into the run to send SIGTERM (default: a fifth)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "env_chaos"))
    args = parser.parse_args()
    write_results(chaos(args.clients, args.seconds, args.restart_at), args.output, markdown)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
