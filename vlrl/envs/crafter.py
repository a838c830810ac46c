"""Crafter (Hafner 2021), the open-world survival game, as a vlrl environment: pictures of the player's 9x7 view and
inventory, a text state summary, and Crafter's 17 actions by name, several per turn.

    env = CrafterEnv(size=256, max_actions=4, max_turns=50)     # or make("crafter", size=256)
    obs = env.reset(seed=3)          # Observation(image=<PIL 256x256>, text="Health 9/9, food 9/9, ...")
    step = env.step("<SOLUTION>move_left, do, do</SOLUTION>")
    step.reward                      # achievements unlocked this turn (collect_wood ...)
    env.metrics()                    # {"success": ..., "achievements": [...], "return": ..., "length": ...}

The reward of a turn is the number of Crafter achievements unlocked in it (22 exist, each counts once per episode);
Crafter's own reward (those unlocks plus health changes / 10) is kept in `info["env_reward"]`. An episode succeeds
when it unlocks `target` (an achievement name) or, without a target, any achievement. It ends when the player dies,
after `max_turns` turns (an invalid reply counts as a turn), or after Crafter's own `length` in game steps.

The game is the `crafter` package (pip install 'vlrl[envs]'), rendered with numpy and PIL only. A fresh world takes
~1.5 s of pure Python, so each (seed, settings) world is kept and copied on the next reset of that seed (a GSPO group
replays one seed many times), and resets of one new world at once wait for a single generation of it. Replays are
exact: Crafter picks the creature to despawn by its place in a set ordered by memory address, so vlrl swaps those
sets for insertion-ordered ones (`OrderedObjects`): the same rule and draws, one order every time.

Crafter's own settings (its paper's benchmark): one action a step, episodes of `length = 10000` game steps, a 64x64
world and 64 px frames, scored by `score()` over the 22 achievements. `SETTINGS` holds them as options
(`make("crafter", **SETTINGS)`, or `[env] options` and `max_turns = 10000` in a run file); the defaults (4 actions a
turn, 50 turns) are a short episode for a model's context.
"""

from __future__ import annotations

import collections
import copy
import threading

from vlrl.base.errors import ConfigError, MissingExtra
from vlrl.envs.achievements import ACHIEVEMENTS
from vlrl.envs.base import Env, Observation, Step, parse_actions

# Crafter's actions, in its own order (crafter/data.yaml); checked against the installed package on first use.
ACTIONS = ("noop", "move_left", "move_right", "move_up", "move_down", "do", "sleep", "place_stone", "place_table",
           "place_furnace", "place_plant", "make_wood_pickaxe", "make_stone_pickaxe", "make_iron_pickaxe",
           "make_wood_sword", "make_stone_sword", "make_iron_sword")
VITALS = ("health", "food", "drink", "energy")  # inventory entries that are the player's stats (0..9)
DIRECTIONS = {(-1, 0): "left", (1, 0): "right", (0, -1): "up", (0, 1): "down"}
# Crafter's benchmark settings as this wrapper's options: a whole 10,000-step episode, one action a step.
SETTINGS = {"size": 64, "area": 64, "length": 10000, "max_actions": 1, "max_turns": 10000}
OPTIONS = {"size": (int, 16, 1024), "text": (bool,), "max_actions": (int, 1, 64), "max_turns": (int, 1, 100000),
           "length": (int, 1, 10**7), "target": (str, ACHIEVEMENTS), "area": (int, 16, 256)}
FRESH_WORLDS = 16  # fresh worlds kept for the next reset of their seed (each ~100 kB)

_fresh: collections.OrderedDict = collections.OrderedDict()  # (seed, settings) -> (a crafter.Env just reset, frame)
_making: dict = {}  # (seed, settings) -> the lock held while that world is generated, so it is generated once
_fresh_lock = threading.Lock()


def _crafter():
    try:
        import crafter
    except ImportError:
        raise MissingExtra("the crafter environment needs the `crafter` package: pip install 'vlrl[envs]'") from None
    if tuple(crafter.constants.actions) != ACTIONS or tuple(crafter.constants.achievements) != ACHIEVEMENTS:
        raise MissingExtra("the installed crafter has other actions or achievements than crafter 1.8.3 "
                           f"({crafter.constants.actions}); install the tested one: pip install 'vlrl[envs]'")
    return crafter


class OrderedObjects(dict):
    """The creatures of one chunk as Crafter's set API (add, remove, iteration) in insertion order, so that the
    creature its balancing draws by position is the same one in every replay; a dict keeps that order and
    `copy.deepcopy` keeps it too."""

    def add(self, obj) -> None:
        self[obj] = None

    def remove(self, obj) -> None:
        del self[obj]


def order_creatures(world) -> None:
    """Replaces the chunk sets of a crafter world by `OrderedObjects`, each in the order the world added its
    creatures (their index in the world's object list), and keeps new chunks ordered too."""
    def index(obj):
        return int(world._obj_map[tuple(obj.pos)])

    ordered = collections.defaultdict(OrderedObjects)
    for key, objs in world._chunks.items():
        ordered[key] = OrderedObjects.fromkeys(sorted(objs, key=index))
    world._chunks = ordered


def _fresh_world(seed: int, area: int, size: int, length: int):
    """(a crafter.Env reset to the world of `seed`, its first frame): a copy of the kept one, else generated (and
    kept)."""
    key = (seed, area, size, length)
    with _fresh_lock:
        kept = _fresh.get(key)
        if kept is not None:
            _fresh.move_to_end(key)
        else:
            making = _making.setdefault(key, threading.Lock())
    if kept is None:
        with making:  # resets of one new world at once (a server's clients after a restart) wait for one generation
            with _fresh_lock:
                kept = _fresh.get(key)
            if kept is None:
                game = _crafter().Env(area=(area, area), size=(size, size), length=length, seed=seed)
                kept = game, game.reset()  # the world of (seed, episode 1): crafter seeds episodes by (seed, episode)
                order_creatures(game._world)
                with _fresh_lock:
                    _fresh[key] = kept
                    _making.pop(key, None)
                    while len(_fresh) > FRESH_WORLDS:
                        _fresh.popitem(last=False)
    game, frame = kept  # the textures are read-only and shared; everything else (world, RNG, objects) is copied
    return copy.deepcopy(game, {id(game._textures): game._textures}), frame


class CrafterEnv(Env):
    """Crafter with a picture of `size` px square per observation and, unless `text=False`, a state summary.

    Args:
        size: the observation's side in pixels (16..1024; Crafter draws a 9x9-cell grid, so multiples of 9 fill it).
        text: give the state summary (inventory, vitals, facing, what is near); False: pictures only (text "").
        max_actions: actions a reply may give per turn (each one game step).
        max_turns: turns per episode (replies, valid or not).
        length: Crafter's own episode length in game steps.
        target: the achievement that makes an episode a success (default: any achievement).
        area: the world's side in cells (Crafter's default 64; smaller worlds generate faster).
    """

    name = "crafter"
    actions = ACTIONS
    OPTIONS = OPTIONS

    def __init__(self, size: int = 256, text: bool = True, max_actions: int = 4, max_turns: int = 50,
                 length: int = 10000, target: str | None = None, area: int = 64):
        _crafter()
        self.size, self.text, self.max_actions, self.max_turns = size, text, max_actions, max_turns
        self.length, self.target, self.area = length, target, area
        self._game = None

    def reset(self, seed: int) -> Observation:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"crafter: the seed must be a whole number, got {seed!r}")
        self._game, self._frame = _fresh_world(seed, self.area, self.size, self.length)
        self._seed, self._turns, self._steps, self._return, self._env_return = seed, 0, 0, 0.0, 0.0
        self._invalid, self._done, self._unlocked = 0, False, []
        return self._observation()

    def step(self, reply: str) -> Step:
        if self._game is None:
            raise RuntimeError("crafter: step() before reset(); call reset(seed) first.")
        if self._done:
            raise RuntimeError("crafter: the episode is over; call reset(seed) for another.")
        chosen, problem = parse_actions(reply, self.actions, self.max_actions)
        self._turns += 1
        unlocked, env_reward, executed, ended = [], 0.0, [], None
        for action in chosen:
            frame, reward, game_over, info = self._game.step(ACTIONS.index(action))
            self._frame, self._steps = frame, self._steps + 1
            executed.append(action)
            env_reward += float(reward)
            new = sorted(n for n, c in info["achievements"].items() if c > 0 and n not in self._unlocked)
            unlocked += new
            self._unlocked += new
            if game_over:  # the rest of the turn's actions are not played
                ended = "dead" if self._game._player.health <= 0 else "length"
                break
        self._invalid += not chosen
        self._return += len(unlocked)
        self._env_return += env_reward
        if ended is None and self._turns >= self.max_turns:
            ended = "max_turns"
        self._done = ended is not None
        info = {"actions": executed, "invalid": not chosen, "problem": problem, "unlocked": unlocked,
                "achievements": list(self._unlocked), "env_reward": env_reward, "ended": ended,
                "inventory": {k: int(v) for k, v in self._game._player.inventory.items()}}
        return Step(self._observation(), float(len(unlocked)), self._done, info)

    def metrics(self) -> dict:
        """success (the target, else any achievement, unlocked), return (achievements unlocked), length (turns),
        steps (game steps), achievements (their names, in unlock order), env_return (Crafter's own), invalid
        (replies that named no valid action)."""
        if self._game is None:
            return {"success": False, "return": 0.0, "length": 0}
        success = self.target in self._unlocked if self.target else bool(self._unlocked)
        return {"success": success, "return": self._return, "length": self._turns, "steps": self._steps,
                "achievements": list(self._unlocked), "num_achievements": len(self._unlocked),
                "env_return": round(self._env_return, 4), "invalid": self._invalid, "seed": self._seed}

    def describe(self) -> str:
        goal = f"unlock the achievement {self.target}" if self.target else "unlock achievements"
        return (f"You play Crafter, a 2D survival game seen from above; {goal} (collect wood, make tools, eat, "
                "drink, defeat zombies). move_* walks and turns you; do collects or attacks what you face; place_* "
                "and make_* need materials and a nearby table or furnace. " + super().describe())

    def task_info(self) -> dict:
        info = super().task_info()
        info["observation"]["size"] = [self.size, self.size]
        info["text"] = self.text
        info["success"] = f"unlock {self.target}" if self.target else "unlock any achievement"
        return info

    def _observation(self) -> Observation:
        from PIL import Image

        return Observation(Image.fromarray(self._frame), summary(self._game) if self.text else "")


def summary(game) -> str:
    """The state of a crafter.Env in words: vitals, inventory, facing, and the nearest of each thing in view."""
    player, world = game._player, game._world
    inventory = player.inventory
    vitals = ", ".join(f"{k} {inventory[k]}/9" for k in VITALS)
    items = [f"{k} {v}" for k, v in inventory.items() if k not in VITALS and v > 0]
    facing = tuple(int(d) for d in player.facing)
    ahead_material, ahead_object = world[player.pos + facing]
    ahead = type(ahead_object).__name__.lower() if ahead_object else ahead_material or "the edge of the world"
    lines = [f"Vitals: {vitals}.", f"Inventory: {', '.join(items) if items else 'nothing'}.",
             f"Facing {DIRECTIONS[facing]}, at {ahead}." + (" Asleep." if player.sleeping else "")]
    near = _nearest(game)
    lines.append("In view: " + ("; ".join(f"{name} {where}" for name, where in near) if near else "nothing") + ".")
    return "\n".join(lines)


def _nearest(game) -> list[tuple[str, str]]:
    """(thing, "2 left, 1 up") for the nearest of each material and creature in the player's view, nearest first."""
    player, world = game._player, game._world
    grid = game._local_view._grid  # the cells drawn: 9 wide, 7 high
    half_x, half_y = int(grid[0]) // 2, int(grid[1]) // 2
    best: dict[str, tuple[int, int, int]] = {}
    for dx in range(-half_x, half_x + 1):
        for dy in range(-half_y, half_y + 1):
            if dx == dy == 0:
                continue
            material, obj = world[(int(player.pos[0]) + dx, int(player.pos[1]) + dy)]
            for name in (material, type(obj).__name__.lower() if obj else None):
                distance = abs(dx) + abs(dy)
                if name and (name not in best or distance < best[name][0]):
                    best[name] = (distance, dx, dy)
    out = []
    for name, (_, dx, dy) in sorted(best.items(), key=lambda kv: (kv[1][0], kv[0])):
        parts = [f"{abs(dx)} {'left' if dx < 0 else 'right'}"] if dx else []
        parts += [f"{abs(dy)} {'up' if dy < 0 else 'down'}"] if dy else []
        out.append((name, ", ".join(parts)))
    return out
