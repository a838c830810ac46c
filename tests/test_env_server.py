"""`vlrl serve-env` and its client: the protocol's endpoints, every bad request answered 4xx while the server goes
on, an environment that raises (500, and on), the hardening (API key, option bounds, body size, session and step
caps, expiry), and RemoteEnv giving exactly the local episode."""

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import ClassVar

import pytest

from vlrl.base.errors import EnvError
from vlrl.envs import ENVIRONMENTS, Env, Observation, Step, make, parse_actions
from vlrl.envs.base import check_options
from vlrl.envs.remote import RemoteEnv
from vlrl.envs.server import make_server
from vlrl.envs.sessions import EnvService, Refused


class CountEnv(Env):
    """Counts up to `goal`: `up` adds one (reward 1 on reaching the goal), `boom` raises, like a broken game."""

    name = "count"
    actions = ("up", "stay", "boom")

    def __init__(self, goal: int = 3, max_actions: int = 1):
        check_options("count", {"goal": (int, 1, 1000), "max_actions": (int, 1, 8)},
                      {"goal": goal, "max_actions": max_actions})
        self.goal, self.max_actions = goal, max_actions

    def reset(self, seed):
        self.value, self.turns = seed % 2, 0
        return self._obs()

    def step(self, reply):
        chosen, problem = parse_actions(reply, self.actions, self.max_actions)
        if "boom" in chosen:
            raise ValueError("the counter broke")
        self.turns += 1
        self.value += chosen.count("up")
        done = self.value >= self.goal
        return Step(self._obs(), float(done), done, {"actions": chosen, "invalid": not chosen, "problem": problem})

    def metrics(self):
        return {"success": self.value >= self.goal, "return": float(self.value >= self.goal), "length": self.turns}

    def _obs(self):
        from PIL import Image

        return Observation(Image.new("RGB", (8, 8), (40 * self.value, 0, 0)), f"at {self.value}")


@pytest.fixture
def served(monkeypatch):
    """Starts servers in threads (on free ports) and gives their URLs; all are closed after the test."""
    monkeypatch.setitem(ENVIRONMENTS, "count", f"{__name__}:CountEnv")
    servers = []

    def start(name="count", options=None, **kwargs):
        server = make_server(name, options, port=0, **kwargs).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def call(url, method="GET", body=None, raw=None, headers=None):
    """(status, JSON answer) of one request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_endpoints_play_an_episode(served):
    url = served(options={"goal": 2})
    assert call(url + "/health") == (200, {"status": "healthy", "ok": True, "env": "count", "sessions": 0,
                                           "max_sessions": 64})
    status, task = call(url + "/task_info")
    assert status == 200 and task["actions"] == ["up", "stay", "boom"] and task["max_actions_per_turn"] == 1
    status, reset = call(url + "/reset", "POST", {"seed": 4})
    assert status == 200 and set(reset) == {"session", "episode_id", "observation", "reward", "done", "task"}
    assert reset["observation"]["image"].startswith("data:image/png;base64,")
    assert reset["observation"]["text"] == "at 0"
    session = reset["session"]
    status, step = call(url + "/step", "POST", {"session": session, "action": "<SOLUTION>up</SOLUTION>"})
    assert status == 200 and (step["reward"], step["done"], step["info"]["actions"]) == (0.0, False, ["up"])
    assert step["observation"]["text"] == "at 1"
    assert call(url + "/step", "POST", {"session": session, "action": "up"})[1]["done"] is True
    assert call(url + f"/metrics?session={session}") == (200, {"success": True, "return": 1.0, "length": 2})
    # a reset naming its session replays in it; closing frees it
    assert call(url + "/reset", "POST", {"seed": 4, "session": session})[1]["session"] == session
    assert call(url + "/close", "POST", {"session": session}) == (200, {"closed": True})
    assert call(url + "/health")[1]["sessions"] == 0


@pytest.mark.parametrize("method,path,body,status,words", [
    # the body itself
    ("POST", "/reset", b"{not json", 400, "not JSON"),
    ("POST", "/reset", b"[1, 2]", 400, "must be a JSON object"),
    ("POST", "/step", b"", 400, "the body is empty"),
    # fields
    ("POST", "/reset", {}, 400, "needs a whole-number seed"),
    ("POST", "/reset", {"seed": "three"}, 400, "needs a whole-number seed"),
    ("POST", "/reset", {"seed": True}, 400, "needs a whole-number seed"),
    ("POST", "/reset", {"seed": 1, "options": {"goal": 2, "colour": "red"}}, 400, "has no option 'colour'"),
    ("POST", "/reset", {"seed": 1, "options": [1]}, 400, "options must be a JSON object"),
    ("POST", "/step", {"action": "up"}, 400, "name the episode's session"),
    ("POST", "/step", {"session": "feedbeef", "action": "up"}, 404, "no session 'feedbeef'"),
    ("GET", "/metrics?session=feedbeef", None, 404, "no session"),
    ("GET", "/task_info?options=%7Bbad", None, 400, "options must be JSON"),
    # paths and methods
    ("GET", "/nowhere", None, 404, "no endpoint /nowhere"),
    ("GET", "/reset", None, 405, "/reset takes POST, not GET"),
    ("POST", "/health", {}, 405, "/health takes GET, not POST"),
    # options checked for type and bounds before anything is built
    ("POST", "/reset", {"seed": 1, "options": {"goal": "three"}}, 400, "goal must be a whole number in 1..1000"),
    ("POST", "/reset", {"seed": 1, "options": {str(k): 1 for k in range(40)}}, 400, "more than the 32 accepted"),
    ("POST", "/reset", {"seed": -1}, 400, "seed >= 0"),
])
def test_a_bad_request_gets_4xx_and_the_server_goes_on(served, method, path, body, status, words):
    url = served()
    raw = body if isinstance(body, bytes) else None
    got, answer = call(url + path, method, None if raw is not None else body, raw=raw)
    assert got == status and words in answer["error"]
    assert call(url + "/health")[0] == 200


def test_a_huge_body_or_a_step_out_of_turn_is_refused(served):
    url = served()
    status, answer = call(url + "/step", "POST", raw=b"{}", headers={"Content-Length": str(5 << 20)})
    assert status == 413 and "more than the 1048576 accepted" in answer["error"]
    session = call(url + "/reset", "POST", {"seed": 0, "options": {"goal": 1}})[1]["session"]
    assert call(url + "/step", "POST", {"session": session, "action": "up"})[1]["done"]
    status, answer = call(url + "/step", "POST", {"session": session, "action": "up"})
    assert status == 409 and "episode is over; POST /reset" in answer["error"]
    status, answer = call(url + "/step", "POST", {"session": session, "action": 7})
    assert status == 400 and "reply as text" in answer["error"]
    assert call(url + "/health")[0] == 200


def test_an_environment_that_raises_gives_500_and_the_episode_goes_on(served):
    url = served()
    session = call(url + "/reset", "POST", {"seed": 0})[1]["session"]
    status, answer = call(url + "/step", "POST", {"session": session, "action": "boom"})
    assert status == 500 and answer["error"] == "the environment raised ValueError: the counter broke"
    assert call(url + "/step", "POST", {"session": session, "action": "up"})[1]["observation"]["text"] == "at 1"


def test_sessions_are_capped_and_idle_ones_make_room(served):
    url = served(max_sessions=2)
    first = call(url + "/reset", "POST", {"seed": 0})[1]["session"]
    call(url + "/reset", "POST", {"seed": 1})
    status, answer = call(url + "/reset", "POST", {"seed": 2})
    assert status == 429 and "all 2 sessions are in use" in answer["error"]
    call(url + "/close", "POST", {"session": first})
    assert call(url + "/reset", "POST", {"seed": 2})[0] == 200
    url = served(max_sessions=1, idle_s=0.0)  # every session is idle at once: the oldest gives way
    old = call(url + "/reset", "POST", {"seed": 0})[1]["session"]
    assert call(url + "/reset", "POST", {"seed": 1})[0] == 200
    assert call(url + "/step", "POST", {"session": old, "action": "up"})[0] == 404


def test_remote_env_is_the_local_env(served):
    url = served(options={"goal": 5})
    remote, other = make(url), RemoteEnv(url, max_actions=2)  # two sessions side by side
    assert (remote.name, remote.actions, remote.max_actions, other.max_actions) == ("count", CountEnv.actions, 1, 2)
    local = CountEnv(goal=5)
    assert remote.reset(3).image.tobytes() == local.reset(3).image.tobytes()
    other.reset(0)
    for reply in ["up", "stay", "<SOLUTION>fly</SOLUTION>", "up"]:
        got, want = remote.step(reply), local.step(reply)
        assert got.observation.image.tobytes() == want.observation.image.tobytes()
        assert (got.observation.text, got.reward, got.done, got.info) == (want.observation.text, want.reward,
                                                                          want.done, want.info)
        assert other.step("up, stay").info["actions"] == ["up", "stay"]
    assert remote.metrics() == local.metrics() and other.metrics()["length"] == 4
    with pytest.raises(EnvError, match="refused POST /step .*: the environment raised ValueError"):
        remote.step("boom")
    remote.close()
    other.close()


def test_remote_crafter_gives_the_local_frames(served):
    pytest.importorskip("crafter")
    options = {"size": 64, "area": 16}
    remote, local = make(served("crafter", options)), make("crafter", **options)
    assert remote.describe() == local.describe()
    assert remote.reset(1).image.tobytes() == local.reset(1).image.tobytes()
    for reply in ["<SOLUTION>move_down, move_down, move_down, move_right</SOLUTION>", "do", "fly", "move_up, do"]:
        got, want = remote.step(reply), local.step(reply)
        assert got.observation.image.tobytes() == want.observation.image.tobytes()
        assert (got.observation.text, got.reward, got.info) == (want.observation.text, want.reward, want.info)
    assert remote.metrics() == local.metrics() and remote.metrics()["achievements"] == ["collect_wood"]


def test_a_server_that_is_down_or_refuses_is_named(served):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free, and nobody listens after the close
    with pytest.raises(EnvError, match=f"no environment server answered at http://127.0.0.1:{port} "):
        RemoteEnv(f"http://127.0.0.1:{port}", timeout=5)
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        with pytest.raises(EnvError, match="no answer within 0.3 s"):
            RemoteEnv(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3)
    url = served()
    with pytest.raises(EnvError, match=f"at {url} refused GET /task_info .*has no option 'size'"):
        RemoteEnv(url, size=64)
    with pytest.raises(EnvError, match="step\\(\\) before reset"):
        RemoteEnv(url).step("up")


def test_bad_server_options_fail_before_listening(monkeypatch):
    monkeypatch.setitem(ENVIRONMENTS, "count", f"{__name__}:CountEnv")
    from vlrl.base.errors import ConfigError

    with pytest.raises(ConfigError, match="has no option 'speed'"):
        make_server("count", {"speed": 2}, port=0)


def test_a_huge_grid_is_refused_at_once(served):
    """As a new user tried it: {"size": 100000} on the grid once went unanswered while the server grew past 5 GB."""
    url = served("grid")
    started = time.monotonic()
    status, answer = call(url + "/reset", "POST", {"seed": 0, "options": {"size": 100000}})
    assert status == 400 and answer["error"] == "grid: size must be a whole number in 2..64, got 100000"
    assert time.monotonic() - started < 2
    status, answer = call(url + "/task_info?options=" + urllib.request.quote(json.dumps({"size": 10**9})))
    assert status == 400 and "size must be a whole number" in answer["error"]


def test_the_api_key_is_required_when_set(served, monkeypatch):
    monkeypatch.setenv("ENVIRONMENT_API_KEY", "s3cret")
    url = served(options={"goal": 2})
    for path, method, body in (("/health", "GET", None), ("/reset", "POST", {"seed": 0}), ("/mcp", "POST", {})):
        status, answer = call(url + path, method, body)
        assert status == 401 and "ENVIRONMENT_API_KEY" in answer["error"] and "Bearer" in answer["error"]
    assert call(url + "/health", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert call(url + "/health", headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert call(url + "/health", headers={"X-API-Key": "s3cret"})[0] == 200
    env = RemoteEnv(url)  # the client sends ENVIRONMENT_API_KEY
    env.reset(1)
    assert env.step("up").done
    monkeypatch.delenv("ENVIRONMENT_API_KEY")
    with pytest.raises(EnvError, match=r"refused GET /task_info \(401\)"):
        RemoteEnv(url)


def test_a_body_without_length_is_cut_at_the_limit(served):
    """A chunked body declares no length: it is counted as it arrives, and refused past 1 MB."""
    url = served()
    host, port = url.split("//")[1].split(":")
    chunk = b"x" * 65536
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: application/json\r\n\r\n")
        try:
            for _ in range(20):  # 1.25 MB
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError:  # the server answered and closed before the rest arrived
            pass
        answer = read_response(sock)
    assert answer.startswith("HTTP/1.1 413") and "more than the 1048576 bytes accepted" in answer
    assert call(url + "/health")[0] == 200


def read_response(sock: socket.socket) -> str:
    """One HTTP response, whole: read until its head and Content-Length bytes of body are in, or the server closes.
    A server writes the status line, the headers and the body in writes of its own choosing (one `recv` can hold the
    status line alone), and one that refuses an upload closes with the rest unread, which resets the connection
    after what it sent."""
    data = b""
    while True:
        head, gap, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if gap and length and len(body) >= int(length.group(1)):
            break
        try:
            more = sock.recv(65536)
        except ConnectionResetError:  # after the answer: what arrived before the reset is kept
            break
        if not more:
            break
        data += more
    return data.decode("latin-1")


def test_a_response_is_read_whole_when_its_head_and_body_arrive_apart():
    """`read_response` against a server that writes the status line, then the headers, then the body, apart (what
    made one `recv` see only the status line)."""
    body = b'{"error": "more than the 1048576 bytes accepted"}'
    parts = [b"HTTP/1.1 413 Content Too Large\r\n", b"content-length: %d\r\n\r\n" % len(body), body]
    server, client = socket.socketpair()

    def answer():
        for part in parts:
            server.sendall(part)
            time.sleep(0.05)
        server.close()

    writer = threading.Thread(target=answer)
    writer.start()
    with client:
        client.settimeout(10)
        answered = read_response(client)
    writer.join()
    assert answered == b"".join(parts).decode("latin-1")


def test_a_client_that_hangs_up_mid_body_leaves_no_traceback(served, capfd):
    url = served()
    host, port = url.split("//")[1].split(":")
    session = call(url + "/reset", "POST", {"seed": 0})[1]["session"]
    body = json.dumps({"session": session, "action": "up"}).encode()
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
    deadline = time.monotonic() + 2  # the server logged its ClientDisconnect at once when it did
    seen = ""
    while time.monotonic() < deadline and "Traceback" not in seen:
        seen += capfd.readouterr().err
        time.sleep(0.1)
    assert "Traceback" not in seen and "ClientDisconnect" not in seen, seen[-500:]
    step = call(url + "/step", "POST", {"session": session, "action": "up"})[1]  # the cut steps never ran
    assert step["observation"]["text"] == "at 1"


def test_steps_are_capped_and_idle_sessions_expire(served):
    url = served(options={"goal": 100}, max_steps=3, idle_s=0.5)
    session = call(url + "/reset", "POST", {"seed": 0})[1]["session"]
    for _ in range(3):
        assert call(url + "/step", "POST", {"session": session, "action": "up"})[0] == 200
    status, answer = call(url + "/step", "POST", {"session": session, "action": "up"})
    assert status == 409 and "taken 3 steps, the server's cap (--max-steps)" in answer["error"]
    assert call(url + "/reset", "POST", {"seed": 0, "session": session})[1]["session"] == session  # a reset starts over
    assert call(url + "/step", "POST", {"session": session, "action": "up"})[0] == 200
    # closed without being named, by the periodic sweep (every second here) once 0.5 s idle: asked until it is, not
    # after a fixed wait that a loaded machine can outlast
    deadline = time.monotonic() + 30
    while call(url + "/health")[1]["sessions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert call(url + "/health")[1]["sessions"] == 0
    status, answer = call(url + "/step", "POST", {"session": session, "action": "up"})
    assert status == 404 and "expired after 0.5 s idle" in answer["error"]


class ProbeEnv(CountEnv):
    """CountEnv whose step waits for `release`, logging step-start, step-end and close into `log` (the issue's
    probe); its task_info raises when the goal is 13, like a game broken in a way vlrl did not foresee."""

    name = "probe"
    log: ClassVar[list] = []
    release = threading.Event()

    def step(self, reply):
        self.log.append("step-start")
        self.release.wait(30)
        step = super().step(reply)
        self.log.append("step-end")
        return step

    def close(self):
        self.log.append("close")

    def task_info(self):
        if self.goal == 13:
            raise RuntimeError("no task today")
        return super().task_info()


@pytest.fixture
def probe(monkeypatch):
    """An EnvService of ProbeEnv with an empty log and the steps held until `ProbeEnv.release` is set."""
    monkeypatch.setitem(ENVIRONMENTS, "probe", f"{__name__}:ProbeEnv")
    monkeypatch.setattr(ProbeEnv, "log", [])
    monkeypatch.setattr(ProbeEnv, "release", threading.Event())
    service = EnvService("probe", {"goal": 50})
    yield service
    ProbeEnv.release.set()
    service.shutdown()


def in_thread(call, *args):
    """Starts `call(*args)` in a thread; the thread's `result` is its answer or the exception it raised."""
    def run():
        try:
            thread.result = call(*args)
        except Exception as err:  # noqa: BLE001 -- the test looks at what it was
            thread.result = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("closer", ["close", "reset with new options", "shutdown"])
def test_a_session_is_never_closed_under_a_running_step(probe, closer):
    session = probe.reset({"seed": 0})["session"]
    ProbeEnv.log.clear()
    stepping = in_thread(probe.step, {"session": session, "action": "up"})
    deadline = time.monotonic() + 30
    while "step-start" not in ProbeEnv.log and time.monotonic() < deadline:
        time.sleep(0.01)
    late = in_thread(probe.step, {"session": session, "action": "up"})  # found the session; waits for its turn
    time.sleep(0.1)
    closing = in_thread({"close": lambda: probe.close(session), "shutdown": probe.shutdown,
                         "reset with new options": lambda: probe.reset({"seed": 1, "session": session,
                                                                        "options": {"goal": 7}})}[closer])
    closing.join(0.3)
    assert closing.is_alive() and ProbeEnv.log == ["step-start"]  # the close waits for the step
    ProbeEnv.release.set()
    for thread in (stepping, late, closing):
        thread.join(30)
    assert ProbeEnv.log[:2] == ["step-start", "step-end"] and ProbeEnv.log.count("close") == 1
    assert "step-start" not in ProbeEnv.log[ProbeEnv.log.index("close"):]  # nothing ran on the closed game
    if ProbeEnv.log[-1] == "close":  # the late step went first, before the close
        assert late.result["observation"]["text"] == "at 2"
    else:  # the close went first: the late step is told, never played
        assert isinstance(late.result, Refused) and late.result.status == 404 and "was closed" in str(late.result)
    with pytest.raises(Refused, match="no session"):
        probe.step({"session": session, "action": "up"})


def test_a_reset_whose_task_info_fails_leaves_no_session(probe):
    ProbeEnv.log.clear()
    with pytest.raises(Refused) as refused:
        probe.reset({"seed": 0, "options": {"goal": 13}})
    assert refused.value.status == 500 and str(refused.value) == "the environment raised RuntimeError: no task today"
    assert probe.health()["sessions"] == 0 and ProbeEnv.log == ["close"]
