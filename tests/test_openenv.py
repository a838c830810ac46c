"""OpenEnv in both directions: `vlrl serve-env` passes OpenEnv's own validator (`openenv validate --url`) and plays
with OpenEnv's own client; `openenv:URL` (OpenEnvEnv) plays vlrl's servers exactly as the local environment and
trains on a server built with OpenEnv's own classes (`openenv.core.env_server.create_app`)."""

import json
import socket
import subprocess
import sys
import threading
import time
from typing import Literal

import pytest

openenv = pytest.importorskip("openenv")

from vlrl.base.errors import ConfigError, EnvError
from vlrl.envs import make
from vlrl.envs.server import EnvServer, make_server

REPLIES = ["<SOLUTION>right</SOLUTION>", "fly", "down", "<SOLUTION>down, right</SOLUTION>", "left", "up", "right"]


@pytest.fixture
def grid_server():
    with make_server("grid", {"size": 4, "difficulty": 3, "max_turns": 20}, port=0) as server:
        yield server


def test_openenvs_validator_passes_the_server(grid_server):
    done = subprocess.run([sys.executable, "-m", "openenv.cli", "validate", "--url", grid_server.url, "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["passed"], report
    assert {c["id"] for c in report["criteria"]} == {"openapi_version_available", "health_endpoint",
                                                     "metadata_endpoint", "schema_endpoint", "mcp_endpoint",
                                                     "mode_endpoint_consistency"}
    assert report["mode"] == "simulation"


def test_openenvs_own_client_plays_an_episode(grid_server):
    from openenv.core.generic_client import GenericEnvClient

    local = make("grid", size=4, difficulty=3, max_turns=20)
    with GenericEnvClient(base_url=grid_server.url).sync() as client:
        result = client.reset(seed=7)
        assert result.observation["text"] == local.reset(7).text
        for reply in REPLIES:
            result, want = client.step({"reply": reply}), local.step(reply)
            assert (result.observation["text"], result.reward, result.done) == (want.observation.text, want.reward,
                                                                                 want.done)
            if want.done:
                break
        assert client.state()["step_count"] >= 1


def test_openenv_url_plays_the_local_episode_frame_for_frame(grid_server, monkeypatch):
    closed = threading.Event()  # the server closes the session once the connection has ended, in a thread of its own
    close = grid_server.service.close

    def close_and_say_so(session_id):
        close(session_id)
        closed.set()

    monkeypatch.setattr(grid_server.service, "close", close_and_say_so)
    remote, local = make("openenv:" + grid_server.url), make("grid", size=4, difficulty=3, max_turns=20)
    assert (remote.name, remote.kind, remote.actions) == ("openenv:grid", "text", local.actions)
    assert remote.describe() == local.describe()
    for seed in (0, 5):
        assert remote.reset(seed).image.tobytes() == local.reset(seed).image.tobytes()
        for reply in REPLIES:
            got, want = remote.step(reply), local.step(reply)
            assert got.observation.image.tobytes() == want.observation.image.tobytes()
            assert (got.observation.text, got.reward, got.done, got.info) == (want.observation.text, want.reward,
                                                                              want.done, want.info)
            if want.done:
                break
        assert remote.metrics() == local.metrics()
    closed.clear()
    remote.close()
    assert closed.wait(timeout=60) and grid_server.service.health()["sessions"] == 0  # closed with the connection


def test_a_lost_session_is_closed_and_its_episode_is_gone(grid_server, monkeypatch):
    service = grid_server.service
    step, local = service.step, make("grid", size=4, difficulty=3, max_turns=20)

    def sessions_become(count):
        deadline = time.monotonic() + 10
        while service.health()["sessions"] != count and time.monotonic() < deadline:
            time.sleep(0.02)
        return service.health()["sessions"] == count

    remote = make("openenv:" + grid_server.url, timeout=0.5)
    remote.reset(0)
    monkeypatch.setattr(service, "step", lambda body: time.sleep(1.5) or step(body))  # answers after the timeout
    with pytest.raises(EnvError, match=r"failed on step \(TimeoutError") as failed:
        remote.step("right")
    assert sessions_become(0)  # the client closed the connection, so the server closed the session
    assert "the session is closed and its episode gone: reset(seed) starts another" in str(failed.value)
    monkeypatch.setattr(service, "step", step)
    for call in (lambda: remote.step("right"), remote.metrics):
        with pytest.raises(EnvError, match=r"on a lost session: step failed \(TimeoutError.*episode is gone"):
            call()
    assert sessions_become(0)  # and opened none: no step played in a session without an episode
    assert remote.reset(5).image.tobytes() == local.reset(5).image.tobytes()  # a reset starts afresh
    assert remote.step("right").observation.text == local.step("right").observation.text
    remote.close()
    assert sessions_become(0)


def test_the_websocket_refuses_bad_messages_and_goes_on(grid_server):
    from websockets.sync.client import connect

    with connect(grid_server.url.replace("http", "ws") + "/ws") as ws:
        def ask(message):
            ws.send(message if isinstance(message, str) else json.dumps(message))
            return json.loads(ws.recv(timeout=10))

        assert ask("{nope")["data"]["code"] == "INVALID_JSON"
        assert ask({"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        assert "reset\"} first" in ask({"type": "step", "data": {"reply": "up"}})["data"]["message"]
        answer = ask({"type": "reset", "data": {"seed": 1, "size": 100000}})
        assert answer["data"]["code"] == "VALIDATION_ERROR" and "size must be a whole number" in answer["data"]["message"]
        assert ask({"type": "reset", "data": {"seed": 1}})["type"] == "observation"
        assert ask({"type": "step", "data": {"reply": 7}})["data"]["code"] == "VALIDATION_ERROR"
        assert ask({"type": "step", "data": {"reply": "up"}})["type"] == "observation"


def test_the_websocket_needs_the_api_key_when_set(monkeypatch):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    monkeypatch.setenv("ENVIRONMENT_API_KEY", "s3cret")
    with make_server("grid", port=0) as server:
        with pytest.raises(InvalidStatus, match="HTTP 401"):  # refused before the handshake completes
            connect(server.url.replace("http", "ws") + "/ws").close()
        env = make("openenv:" + server.url)  # sends ENVIRONMENT_API_KEY as a bearer token
        assert env.reset(1).text.startswith("You (blue)")
        env.close()
        monkeypatch.delenv("ENVIRONMENT_API_KEY")
        with pytest.raises(EnvError, match=r"refused GET /schema \(401\)"):
            make("openenv:" + server.url)


# --- a server built with OpenEnv's own classes ---------------------------------------------------------------------

def corridor_app():
    """An OpenEnv environment written as OpenEnv's documentation writes one: walk a corridor of 5 cells to its right
    end; the action is a name from an enum, the observation a picture (data URL) and a position."""
    from openenv.core.env_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from PIL import Image

    from vlrl.envs.base import to_data_url

    class Move(Action):
        move: Literal["left", "right", "stay"]

    class Seen(Observation):
        image: str
        position: int

    class Corridor(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self.position, self.steps = 0, 0

        def _seen(self, reward=None, done=False):
            picture = Image.new("RGB", (10, 2), (0, 0, 0))
            picture.putpixel((2 * self.position, 0), (255, 255, 255))
            return Seen(image=to_data_url(picture), position=self.position, reward=reward, done=done)

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.position, self.steps = (seed or 0) % 2, 0
            return self._seen()

        def step(self, action, timeout_s=None, **kwargs):
            self.steps += 1
            self.position = max(0, min(4, self.position + {"left": -1, "right": 1, "stay": 0}[action.move]))
            return self._seen(reward=1.0 if self.position == 4 else 0.0, done=self.position == 4)

        @property
        def state(self):
            return State(step_count=self.steps)

    return create_app(Corridor, Move, Seen, env_name="corridor", max_concurrent_envs=4)


def test_openenv_url_plays_a_server_built_with_openenvs_classes():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    with EnvServer(corridor_app(), sock) as server:
        env = make("openenv:" + server.url, max_actions=3)
        assert (env.kind, env.field, env.actions) == ("choice", "move", ("left", "right", "stay"))
        first = env.reset(seed=1)
        assert first.image.size == (10, 2) and json.loads(first.text) == {"position": 1}
        step = env.step("<SOLUTION>right, right</SOLUTION>")
        assert step.info["actions"] == ["right", "right"] and json.loads(step.observation.text)["position"] == 3
        step = env.step("<SOLUTION>right, stay</SOLUTION>")  # the episode ends on the first: the second never runs
        assert step.done and step.reward == 1.0 and step.info["actions"] == ["right"]
        assert env.metrics() == {"success": True, "return": 1.0, "length": 2}
        assert env.reset(seed=0).image.getpixel((0, 0)) == (255, 255, 255)
        assert env.step("<SOLUTION>fly</SOLUTION>").info["invalid"]
        env.close()
        with pytest.raises(ConfigError, match="choose the action field"):
            make("openenv:" + server.url, action_field="speed")



@pytest.mark.slow
def test_a_run_trains_on_an_openenv_server_end_to_end(tiny_base_dir, tiny_dir, tmp_path, monkeypatch):
    """`[env] name = "openenv:URL"` on the tiny model, against the server built with OpenEnv's own classes: the warm
    start's random-action episodes, baseline episodes, a GSPO step, episodes after, the comparison and the report."""
    from vlrl import cli
    from vlrl.evaluation.records import read_records

    # The warm start plays the server, so its cache key holds the server's address, a new port each run: it is built
    # in a cache of the test's own (beside links to the shared models it starts from), not left in $VLRL_CACHE, and
    # from 64 turns in 8 steps instead of the preset's 320 in 60 (31 s of the 48 the run took; now 7 s)
    cache = tmp_path / "cache"
    cache.mkdir()
    for model_dir in (tiny_base_dir, tiny_dir):
        (cache / model_dir.name).symlink_to(model_dir)
    monkeypatch.setenv("VLRL_CACHE", str(cache))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    with EnvServer(corridor_app(), sock) as server:
        run = tmp_path / "corridor"
        sets = [f"env.name=openenv:{server.url}", "env.options={}", "env.eval_seeds=4", "env.train_seeds=4",
                "training.max_steps=1", "env.max_turns=4", "model.warm_start_items=64", "model.warm_start_steps=8"]
        code = cli.main(["run", "--preset", "grid-tiny", "--run-dir", str(run), *[a for s in sets for a in ("--set", s)]])
    before, after = read_records(run / "eval_before.jsonl"), read_records(run / "eval_after.jsonl")
    assert [r["seed"] for r in before] == [r["seed"] for r in after] == [0, 1, 2, 3]
    assert all(r["status"] in ("done", "max_turns") and r["length"] >= 1 for r in before + after)
    assert all((run / "episode_frames" / "after" / f).is_file() for r in after for f in r["frames"])
    assert (run / "report.html").is_file() and code in (0, 1)
    built = [p.name for p in cache.glob("tiny-*") if not p.is_symlink()]  # (beside it: the build's lock file)
    assert len(built) == 1 and built[0].startswith("tiny-qwen3-vl-warm-")  # the warm start played the server
