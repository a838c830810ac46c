"""The Crafter environment on the real `crafter` package: frames, the state summary, achievements as reward, invalid
replies, episode ends and reproducibility from the seed. Small worlds (area=16) keep world generation fast."""

import sys
import time

import pytest

pytest.importorskip("crafter")

from vlrl.base.errors import ConfigError, MissingExtra
from vlrl.envs import crafter as crafter_env
from vlrl.envs import make

SMALL = {"size": 64, "area": 16}
# seed 1 of a 16-cell world: a tree 2 right and 3 down of the player; walking there and hitting it collects wood
TO_TREE = "<SOLUTION>move_down, move_down, move_down, move_right</SOLUTION>"


def frames_of(env, seed, replies):
    frames = [env.reset(seed).image.tobytes()]
    frames += [env.step(reply).observation.image.tobytes() for reply in replies]
    return frames


def test_a_reset_shows_the_view_and_the_state():
    env = make("crafter", **SMALL)
    obs = env.reset(seed=1)
    assert obs.image.size == (64, 64) and obs.image.mode == "RGB"
    lines = obs.text.splitlines()
    assert lines[0] == "Vitals: health 9/9, food 9/9, drink 9/9, energy 9/9."
    assert lines[1] == "Inventory: nothing."
    assert lines[2] == "Facing down, at grass."
    assert "tree 2 right, 3 down" in lines[3]
    assert env.metrics() == {"success": False, "return": 0.0, "length": 0, "steps": 0, "achievements": [],
                             "num_achievements": 0, "env_return": 0.0, "invalid": 0, "seed": 1}


def test_an_achievement_is_the_reward_and_the_summary_follows():
    env = make("crafter", **SMALL, target="collect_wood")
    env.reset(seed=1)
    step = env.step(TO_TREE)
    assert step.info["actions"] == ["move_down", "move_down", "move_down", "move_right"]
    assert step.reward == 0.0 and "Facing right, at tree." in step.observation.text
    step = env.step("<REASONING>the tree is ahead</REASONING><SOLUTION>do</SOLUTION>")
    assert step.reward == 1.0 and step.info["unlocked"] == ["collect_wood"]
    assert step.info["env_reward"] == 1.0 and step.info["inventory"]["wood"] == 1
    assert "Inventory: wood 1." in step.observation.text
    assert env.step("do").reward == 0.0  # an achievement counts once per episode
    metrics = env.metrics()
    assert metrics["success"] and metrics["achievements"] == ["collect_wood"] and metrics["return"] == 1.0
    assert (metrics["length"], metrics["steps"]) == (3, 6)


def test_the_same_seed_and_replies_give_the_same_frames():
    replies = [TO_TREE, "do", "<SOLUTION>move_left, move_up, do, sleep</SOLUTION>", "noop"] + ["move_up, do"] * 8
    crafter_env._fresh.clear()
    generated = frames_of(make("crafter", **SMALL), 1, replies)  # a world generated from the seed
    copied = frames_of(make("crafter", **SMALL), 1, replies)     # the kept world of that seed, copied
    crafter_env._fresh.clear()
    regenerated = frames_of(make("crafter", **SMALL), 1, replies)
    assert generated == copied == regenerated
    assert frames_of(make("crafter", **SMALL), 2, replies)[0] != generated[0]


def test_resets_of_one_new_world_at_once_generate_it_once(monkeypatch):
    import threading

    import crafter

    made, env_class, start = [], crafter.Env, threading.Barrier(4)

    def counted(*args, **kwargs):  # a slow generation: the other resets arrive while it runs
        made.append(kwargs.get("seed"))
        time.sleep(0.3)
        return env_class(*args, **kwargs)

    monkeypatch.setattr(crafter, "Env", counted)
    crafter_env._fresh.clear()
    frames = []

    def reset():
        start.wait(10)
        frames.append(make("crafter", **SMALL).reset(5).image.tobytes())

    threads = [threading.Thread(target=reset) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert made == [5] and len(frames) == 4 and len(set(frames)) == 1
    assert crafter_env._making == {}


def test_image_only_mode_has_no_text():
    env = make("crafter", **SMALL, text=False)
    assert env.reset(seed=1).text == ""
    assert env.step("noop").observation.text == ""
    assert env.task_info()["text"] is False


def test_an_invalid_reply_runs_nothing_and_the_episode_goes_on():
    env = make("crafter", **SMALL)
    first = env.reset(seed=1).image.tobytes()
    step = env.step("<SOLUTION>jump</SOLUTION>")
    assert step.info["invalid"] and step.info["actions"] == [] and "'jump' is not an action" in step.info["problem"]
    assert not step.done and step.reward == 0.0 and step.observation.image.tobytes() == first
    assert env.step("I think I will wait").info["invalid"]
    assert env.metrics()["invalid"] == 2 and env.metrics()["length"] == 2 and env.metrics()["steps"] == 0
    step = env.step("noop, noop, noop, noop, noop")  # over the cap of 4: the first 4 run, and it says so
    assert step.info["actions"] == ["noop"] * 4 and "at most 4" in step.info["problem"] and not step.info["invalid"]


def test_the_episode_ends_after_max_turns_or_crafters_length():
    env = make("crafter", **SMALL, max_turns=2)
    env.reset(seed=1)
    assert not env.step("noop").done
    step = env.step("fly")  # an invalid reply is a turn too: episodes always end
    assert step.done and step.info["ended"] == "max_turns"
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("noop")
    env = make("crafter", **SMALL, length=3)
    env.reset(seed=1)
    step = env.step("noop, noop, noop, noop")
    assert step.done and step.info["ended"] == "length" and step.info["actions"] == ["noop"] * 3


def test_options_are_checked_and_named():
    with pytest.raises(ConfigError) as err:
        make("crafter", size=4, max_actions=0, target="win")
    assert len(err.value.problems) == 3 and "size must be a whole number in 16..1024, got 4" in str(err.value)
    with pytest.raises(ConfigError, match="has no option 'colour'; its options are size, text"):
        make("crafter", colour="red")
    with pytest.raises(ConfigError, match="seed must be a whole number"):
        make("crafter", **SMALL).reset(seed="one")


def test_a_missing_crafter_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "crafter", None)  # import crafter -> ImportError
    with pytest.raises(MissingExtra, match=r"pip install 'vlrl\[envs\]'"):
        make("crafter")


def test_the_prompt_describes_the_actions():
    env = make("crafter", **SMALL, max_actions=2, target="collect_wood")
    assert "unlock the achievement collect_wood" in env.describe() and "make_iron_sword" in env.describe()
    assert "up to 2 actions" in env.describe()
    info = env.task_info()
    assert info["actions"][:3] == ["noop", "move_left", "move_right"] and len(info["actions"]) == 17
    assert info["observation"]["size"] == [64, 64] and info["success"] == "unlock collect_wood"
