"""The clients of the chaos benchmark (bench/env_chaos.py): each a random walk through `vlrl serve-env`'s protocol,
every episode replayed by a local Crafter of the same seed and options so that an answer from another session, or a
lost or doubled step, is counted; closed sessions stepped again (404 expected); every kind of bad request, and
hang-ups in the middle of one. Loopback only.
"""

from __future__ import annotations

import collections
import http.client
import json
import random
import re
import socket
import time

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


class Client:
    """One client's random walk through the protocol against `server` (env_chaos.Server: its port, key, generation
    and whether it is down) until `deadline`; `tally` holds what it saw."""

    def __init__(self, index: int, server, deadline: float, seeds: tuple = SEEDS):
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
