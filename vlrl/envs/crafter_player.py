"""A scripted Crafter player, deliberately imperfect: the teacher of a Crafter warm start (`vlrl.episodes.warm`).

It reads the real game's state (the world's cells in the player's 9x7 view, the inventory, where it faces) and picks
Crafter's own actions by name. Its plan: collect wood from the nearest tree until it holds 3, place a table, make a
wood pickaxe beside it, drink at water in view once thirsty, then collect more wood. It never makes a sword, never
mines stone, never plants a sapling, eats, fights or sleeps, and with probability `noise` each action is one of the 17
drawn uniformly instead: a policy that reaches some achievements, not all, and a warm start that leaves GSPO
something to find (a wood sword, with wood and the table beside it, is one action away).

    player = CrafterPlayer(noise=0.2, seed=0)
    env = CrafterEnv(size=64, area=32, max_actions=4, max_turns=12)
    env.reset(seed=2_000_000)
    step = env.step(player.reply(env))        # "<REASONING>I act.</REASONING><SOLUTION>move_left, do, ...</SOLUTION>"

A turn's actions are planned on a copy of the game, one at a time on the state each leaves (the same seeded world
draws), so a turn of `max_actions` actions plays out as planned unless a creature moves in the way.
`score(seeds, ...)` plays it on some worlds and scores it as the Crafter paper does (`vlrl.envs.achievements`).
"""

from __future__ import annotations

import copy
import random

from vlrl.envs.achievements import crafter_report
from vlrl.envs.crafter import ACTIONS
from vlrl.grammar.answers import FORMAT

MOVES = {(-1, 0): "move_left", (1, 0): "move_right", (0, -1): "move_up", (0, 1): "move_down"}
WALKABLE = ("grass", "sand", "path")  # Crafter's walkable materials (crafter/data.yaml)
WOOD_FOR_TOOLS = 3  # a table (2 wood) and a wood pickaxe (1)
THIRSTY = 9  # drinks at water in view once its drink has fallen at all (it starts at 9, -1 every ~20 steps)
VIEW = (4, 3)  # half the local view: 9 cells wide, 7 high
REASONING = "I act."  # as `vlrl.episodes.warm`'s random-action replies


class CrafterPlayer:
    """The scripted player (see the module docstring).

    Args:
        noise: the chance that an action is drawn uniformly from Crafter's 17 instead of the plan's.
        seed: seeds the noise and the exploring walk.
    """

    def __init__(self, noise: float = 0.2, seed: int = 0):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise = {noise} must be a probability in [0, 1].")
        self.noise, self.rng = noise, random.Random(seed)
        self._heading = self.rng.choice(list(MOVES))

    def actions(self, game, n: int) -> list[str]:
        """The next `n` actions for a crafter.Env `game` (at most: fewer when the episode would end), planned on a
        copy of it, so the game itself does not move."""
        sim = copy.deepcopy(game, {id(game._textures): game._textures})
        chosen = []
        for _ in range(n):
            action = self.rng.choice(ACTIONS) if self.rng.random() < self.noise else self.act(sim)
            chosen.append(action)
            _, _, done, _ = sim.step(ACTIONS.index(action))
            if done:
                break
        return chosen

    def reply(self, env) -> str:
        """This turn's reply for a `vlrl.envs.crafter.CrafterEnv` that has been reset: up to its `max_actions`."""
        return FORMAT.completion(REASONING, ", ".join(self.actions(env._game, env.max_actions)))

    def act(self, game) -> str:
        """The plan's next action on the game's present state (no noise)."""
        player, world = game._player, game._world
        inventory, pos = player.inventory, (int(player.pos[0]), int(player.pos[1]))
        facing = (int(player.facing[0]), int(player.facing[1]))
        ahead = (pos[0] + facing[0], pos[1] + facing[1])
        ahead_material, ahead_object = world[ahead]
        tools = inventory["wood_pickaxe"] > 0
        table_beside = "table" in world.nearby(player.pos, 1)[0]
        if table_beside and not tools and inventory["wood"] >= 1:
            return "make_wood_pickaxe"
        table = _nearest(game, "table")
        if not tools and inventory["wood"] >= 2 and not table:
            if ahead_material in WALKABLE and ahead_object is None:
                return "place_table"
            return self._step_to_free(game, pos)  # turn towards a free cell, where the table can go
        if not tools and inventory["wood"] >= 1 and table:
            goal, target = "table", table
        elif inventory["drink"] < THIRSTY and (water := _nearest(game, "water")):
            goal, target = "water", water
        else:
            goal, target = "tree", _nearest(game, "tree")
        if target is None:
            return self._explore(game, pos)
        dx, dy = target[0] - pos[0], target[1] - pos[1]
        if abs(dx) + abs(dy) == 1:  # beside it: face it, then use it (a table is only needed beside)
            if goal == "table":
                return self._explore(game, pos)
            return "do" if (dx, dy) == facing else MOVES[(dx, dy)]
        return self._step_towards(game, pos, dx, dy)

    def _step_towards(self, game, pos, dx: int, dy: int) -> str:
        """A move that closes the distance, horizontal first, through a free cell; else any free move."""
        options = [(int(dx > 0) - int(dx < 0), 0)] if dx else []
        options += [(0, int(dy > 0) - int(dy < 0))] if dy else []
        for step in options:
            if _free(game, (pos[0] + step[0], pos[1] + step[1])):
                return MOVES[step]
        return self._step_to_free(game, pos)

    def _step_to_free(self, game, pos) -> str:
        free = [step for step in MOVES if _free(game, (pos[0] + step[0], pos[1] + step[1]))]
        return MOVES[self.rng.choice(free)] if free else self.rng.choice(list(MOVES.values()))

    def _explore(self, game, pos) -> str:
        """Nothing wanted in view: keep walking one way, turning when blocked."""
        if not _free(game, (pos[0] + self._heading[0], pos[1] + self._heading[1])):
            self._heading = self.rng.choice(list(MOVES))
        return MOVES[self._heading]


def _free(game, cell) -> bool:
    material, obj = game._world[cell]
    return material in WALKABLE and obj is None


def _nearest(game, material: str):
    """The nearest cell of `material` in the player's view (Manhattan distance), or None."""
    px, py = (int(v) for v in game._player.pos)
    best = None
    for dx in range(-VIEW[0], VIEW[0] + 1):
        for dy in range(-VIEW[1], VIEW[1] + 1):
            near = (dx or dy) and game._world[(px + dx, py + dy)][0] == material
            if near and (best is None or abs(dx) + abs(dy) < best[0]):
                best = (abs(dx) + abs(dy), (px + dx, py + dy))
    return best[1] if best else None


def play(env, seed: int, player: CrafterPlayer) -> dict:
    """One episode of `player` on a reset CrafterEnv `env` of `seed`; returns `env.metrics()`."""
    env.reset(seed)
    while not env.step(player.reply(env)).done:
        pass
    return env.metrics()


def score(seeds, *, noise: float = 0.2, seed: int = 0, **options) -> dict:
    """The scripted player on the worlds of `seeds`, each episode under `options` (CrafterEnv's), scored as the
    Crafter paper does: `crafter_report`'s figures plus the mean achievements per episode and each episode's."""
    from vlrl.envs.crafter import CrafterEnv

    player, env = CrafterPlayer(noise=noise, seed=seed), CrafterEnv(**options)
    episodes = [play(env, s, player)["achievements"] for s in seeds]
    report = crafter_report(episodes)
    report["achievements_per_episode"] = sum(map(len, episodes)) / max(1, len(episodes))
    report["episodes_achievements"] = episodes
    return report
