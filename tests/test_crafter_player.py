"""The scripted Crafter player (vlrl.envs.crafter_player) on real Crafter worlds, the warm start it teaches
(vlrl.episodes.warm with player="scripted") and its setting in a run file."""

import pytest

from vlrl.base.errors import ConfigError
from vlrl.config import runfile as cfg
from vlrl.envs.base import parse_actions

pytest.importorskip("crafter")

from vlrl.envs.crafter import ACTIONS, CrafterEnv
from vlrl.envs.crafter_player import CrafterPlayer, play, score

OPTIONS = {"size": 64, "area": 32, "max_actions": 4, "max_turns": 10}


def test_without_noise_it_makes_a_wood_pickaxe_and_never_a_sword():
    # worlds 0..3 of the warm-start range's neighbour: every one has trees in view of the spawn
    report = score(range(4), noise=0.0, **OPTIONS)
    rates = report["rates"]
    assert rates["collect_wood"] == rates["place_table"] == 100.0 and rates["make_wood_pickaxe"] >= 50.0
    for never in ("make_wood_sword", "collect_stone", "place_plant", "eat_cow", "defeat_zombie", "wake_up"):
        assert rates[never] == 0.0  # deliberately imperfect: it never goes for these
    assert 0 < report["score"] < 5 and report["achievements_per_episode"] >= 2.5


def test_planning_a_turn_leaves_the_game_alone_and_plays_out_as_planned():
    env = CrafterEnv(**OPTIONS)
    env.reset(5)
    player = CrafterPlayer(noise=0.0, seed=0)
    before = (tuple(env._game._player.pos), dict(env._game._player.inventory))
    reply = player.reply(env)
    assert (tuple(env._game._player.pos), dict(env._game._player.inventory)) == before
    chosen, problem = parse_actions(reply, ACTIONS, env.max_actions)
    assert problem is None and 1 <= len(chosen) <= 4
    assert env.step(reply).info["actions"] == chosen


def test_noise_draws_other_actions_and_is_seeded():
    env = CrafterEnv(**OPTIONS)
    plans = []
    for seed in (0, 0, 1):
        env.reset(7)
        plans.append(CrafterPlayer(noise=1.0, seed=seed).actions(env._game, 4))
    assert plans[0] == plans[1] != plans[2]
    assert play(CrafterEnv(**OPTIONS), 7, CrafterPlayer(noise=0.3, seed=0))["length"] == 10
    with pytest.raises(ValueError, match="probability"):
        CrafterPlayer(noise=1.5)


def test_the_scripted_warm_start_is_the_players_turns_in_rollout_contexts():
    from vlrl.config.sections import ENV_SEEDS
    from vlrl.episodes.context import to_processor
    from vlrl.episodes.rollout import settings_for
    from vlrl.episodes.warm import items

    c = cfg.from_dict({"model": {"warm_start_steps": 5, "warm_start_player": "scripted"},
                       "env": {"name": "crafter", "options": {"size": 64, "area": 32}, "max_turns": 4,
                               "max_images_in_context": 2}})
    settings = settings_for(c, "train")
    chosen = items(c.env, settings, n=6, seed=0, player="scripted")
    again = items(c.env, settings, n=6, seed=0, player="scripted")
    assert [i["target"] for i in chosen] == [i["target"] for i in again]  # seeded: the same warm start every time
    assert all(parse_actions(i["target"], ACTIONS, 4)[1] is None for i in chosen)
    first = chosen[0]
    assert first["prompt"][0]["role"] == "system" and len(first["images"]) == 1
    # the second turn's context is the first turn's with the player's reply and the next observation
    assert [m["role"] for m in chosen[1]["prompt"]] == ["system", "user", "assistant", "user"]
    assert chosen[1]["prompt"][2]["content"][0]["text"] == first["target"]
    # its worlds come from the warm-start range, never an eval or training world: the player's first turn there
    env = CrafterEnv(size=64, area=32)
    env.reset(ENV_SEEDS["warm_start"])
    assert to_processor(first["prompt"])[0][1]["content"][0]["text"].endswith(env._observation().text)
    assert first["target"] == CrafterPlayer(seed=0).reply(env)


def test_the_warm_start_player_is_validated():
    def run_file(env="grid", **model):
        return cfg.from_dict({"model": {"warm_start_steps": 5, **model}, "env": {"name": env}})

    run_file()
    run_file("crafter", warm_start_player="scripted")
    with pytest.raises(ConfigError, match="warm_start_player = 'scripted' plays 'crafter'"):
        run_file(warm_start_player="scripted")
    with pytest.raises(ConfigError, match="is unknown.*Did you mean 'scripted'"):
        run_file("crafter", warm_start_player="scriptd")
    with pytest.raises(ConfigError, match="needs a warm start"):
        run_file("crafter", warm_start_player="scripted", warm_start_steps=0)
