"""Gymnasium in: `gymnasium:ID` plays environments Gymnasium ships (FrozenLake, CliffWalking, Taxi, rendered), with
their documented action names or `actions = [...]`; what does not fit (continuous actions, no picture, unnamed
actions) is refused with one line; a run file validates it; `vlrl serve-env` serves it. The tiny model's whole
loop on FrozenLake is the slow test at the end."""

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

from vlrl.base.errors import ConfigError
from vlrl.config import runfile as cfg
from vlrl.envs import make


def test_frozen_lake_is_rendered_named_and_scored():
    env = make("gymnasium:FrozenLake-v1", is_slippery=False)
    assert env.name == "gymnasium:FrozenLake-v1" and env.actions == ("left", "down", "right", "up")
    first = env.reset(seed=0)
    assert first.image.size == (256, 256) and first.text == "Observation: 0."
    assert "FrozenLake-v1" in env.describe() and "Actions: left, down, right, up" in env.describe()
    steps = [env.step(reply) for reply in ("<SOLUTION>right</SOLUTION>", "right", "down", "down", "down", "right")]
    assert [s.observation.text for s in steps] == ["Observation: 1.", "Observation: 2.", "Observation: 6.",
                                                   "Observation: 10.", "Observation: 14.", "Observation: 15."]
    assert steps[-1].done and steps[-1].reward == 1.0 and steps[-1].info["ended"] == "terminated"
    assert env.metrics() == {"success": True, "return": 1.0, "length": 6, "steps": 6, "ended": "terminated",
                             "invalid": 0, "seed": 0}
    assert first.image.tobytes() != steps[-1].observation.image.tobytes()
    env.reset(seed=0)
    assert env.step("<SOLUTION>fly</SOLUTION>").info["invalid"]
    hole = env.step("<SOLUTION>down, right</SOLUTION>")  # one action a turn: "down" runs, then the hole at 5
    assert hole.info["problem"].startswith("2 actions named")
    env.step("right")
    assert env.metrics()["success"] is False and env.metrics()["ended"] == "terminated"  # a hole ends it: no success


def test_cliff_walking_and_taxi_have_their_documented_actions():
    cliff = make("gymnasium:CliffWalking-v1", max_actions=4)
    assert cliff.actions == ("up", "right", "down", "left") and cliff.reset(seed=1).image.size == (768, 256)
    step = cliff.step("<SOLUTION>up, right, right, down</SOLUTION>")
    assert step.info["actions"] == ["up", "right", "right", "down"] and step.reward == -103.0  # down: the cliff
    taxi = make("gymnasium:Taxi-v4", max_turns=3)
    assert taxi.actions == ("south", "north", "east", "west", "pickup", "dropoff")
    taxi.reset(seed=2)
    assert taxi.step("dropoff").reward == -10.0  # an illegal drop-off, as Gymnasium scores it
    taxi.step("north")
    assert taxi.step("east").done and taxi.metrics()["ended"] == "max_turns" and not taxi.metrics()["success"]


def test_actions_can_be_named_by_the_run():
    env = make("gymnasium:FrozenLake-v1", actions=["West", "South", "East", "North"], is_slippery=False)
    assert env.actions == ("west", "south", "east", "north")
    env.reset(seed=0)
    assert env.step("<SOLUTION>East</SOLUTION>").observation.text == "Observation: 1."
    c = cfg.from_dict({"env": {"name": "gymnasium:FrozenLake-v1", "actions": ["w", "s", "e", "n"],
                               "options": {"is_slippery": False}}})
    from vlrl.envs import env_options

    assert make(c.env.name, **env_options(c.env)).actions == ("w", "s", "e", "n")


class Thermostat(gymnasium.Env):
    """A Gymnasium environment vlrl cannot show: numbers only, no rendering, continuous actions."""

    metadata = {"render_modes": ()}  # noqa: RUF012 -- Gymnasium's own attribute

    def __init__(self, render_mode=None, discrete=False):
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = (gymnasium.spaces.Discrete(3) if discrete else
                             gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


gymnasium.register("vlrl-test/Thermostat-v0", entry_point=Thermostat)


@pytest.mark.parametrize("name,options,words", [
    ("gymnasium:Pendulum-v1", {}, "its actions (Box(-2.0, 2.0, (1,), float32)) are continuous"),
    ("gymnasium:vlrl-test/Thermostat-v0", {}, "are no picture and it does not render rgb_array; its actions"),
    ("gymnasium:vlrl-test/Thermostat-v0", {"discrete": True}, "its 3 actions have no names; name them"),
    ("gymnasium:FrozenLake-v1", {"actions": ["a", "a", "b", "c"]}, "must be 4 different names"),
    ("gymnasium:FrozenLake-v1", {"colour": "red"}, "refused its options"),
    ("gymnasium:FrozenLake-v1", {"max_turns": 0}, "max_turns must be a whole number in 1..100000"),
    ("gymnasium:NoSuchGame-v0", {}, "cannot be made (NameNotFound"),
])
def test_an_environment_that_does_not_fit_is_refused_in_one_line(name, options, words):
    with pytest.raises(ConfigError) as err:
        make(name, **options)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_run_file_validates_gymnasium_and_openenv_names():
    assert cfg.from_dict({"env": {"name": "gymnasium:Taxi-v4"}}).env.name == "gymnasium:Taxi-v4"
    assert cfg.from_dict({"env": {"name": "openenv:http://127.0.0.1:8000"}}).env.name.startswith("openenv:")
    with pytest.raises(ConfigError) as err:
        cfg.from_dict({"env": {"name": "openenv:127.0.0.1:8000"}})
    assert "openenv: takes the server's address" in str(err.value)
    with pytest.raises(ConfigError) as err:
        cfg.from_dict({"env": {"name": "grid", "actions": ["a"]}})
    assert "names a Gymnasium environment's actions" in str(err.value)
    with pytest.raises(ConfigError, match="gymnasium:ID"):
        cfg.from_dict({"env": {"name": "gym"}})


def test_a_served_gymnasium_environment_gives_the_local_frames():
    from vlrl.envs.server import make_server

    options = {"is_slippery": True, "map_name": "8x8"}
    with make_server("gymnasium:FrozenLake-v1", options, port=0) as server:
        remote, local = make("openenv:" + server.url), make("gymnasium:FrozenLake-v1", **options)
        assert remote.reset(4).image.tobytes() == local.reset(4).image.tobytes()
        for reply in ["right", "down", "down", "right", "down", "left"] * 3:
            got, want = remote.step(reply), local.step(reply)
            assert got.observation.image.tobytes() == want.observation.image.tobytes() and got.info == want.info
            if want.done:
                break
        assert remote.metrics() == local.metrics()
        remote.close()


@pytest.mark.slow
def test_frozen_lake_runs_end_to_end_on_the_tiny_model(tmp_path):
    """The whole episode loop on a Gymnasium environment: baseline episodes, a GSPO step, episodes after, the
    comparison and the report."""
    from vlrl import cli
    from vlrl.evaluation.records import read_records

    run = tmp_path / "lake"
    code = cli.main(["run", "--preset", "grid-tiny", "--run-dir", str(run), "--set", "env.name=gymnasium:FrozenLake-v1",
                     "--set", "env.options={is_slippery = false, max_turns = 8}", "--set", "env.eval_seeds=4",
                     "--set", "env.train_seeds=4", "--set", "training.max_steps=1", "--set", "env.max_turns=4"])
    before, after = read_records(run / "eval_before.jsonl"), read_records(run / "eval_after.jsonl")
    assert [r["seed"] for r in before] == [r["seed"] for r in after] == [0, 1, 2, 3]
    assert all(r["env"] == "gymnasium:FrozenLake-v1" and r["length"] >= 1 for r in before + after)
    assert all((run / "episode_frames" / "after" / f).is_file() for r in after for f in r["frames"])
    assert (run / "report.html").is_file() and (run / "comparison.json").is_file() and code in (0, 1)
