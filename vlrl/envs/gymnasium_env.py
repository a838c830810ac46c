"""Any Gymnasium environment with pictures and named discrete actions, as a vlrl environment: `[env] name =
"gymnasium:ID"`, its options passed to `gymnasium.make(ID, ...)`.

    env = make("gymnasium:FrozenLake-v1", is_slippery=False)     # GymnasiumEnv("FrozenLake-v1", is_slippery=False)
    obs = env.reset(seed=3)          # Observation(image=<PIL 256x256, the rendered board>, text="Observation: 0.")
    step = env.step("<SOLUTION>right</SOLUTION>")

What fits: an observation that is a picture (a Box of HxW or HxWx3 uint8), or an environment that renders
`rgb_array` (its frame is then the picture, and the observation itself, unless `text = false`, the text); and a
Discrete action space whose actions have names: the environment's own (`get_action_meanings()`, as Atari's), the
documented ones of the environments Gymnasium ships (`KNOWN_ACTIONS`: FrozenLake, CliffWalking, Taxi, CartPole,
MountainCar, Acrobot, LunarLander, Blackjack), or `actions = [...]` given with the options ([env] actions in a run
file). Anything else (continuous actions, no picture, unnamed actions) is refused with one line saying why.

A turn plays up to `max_actions` actions; the episode ends when Gymnasium's does (terminated or truncated) or after
`max_turns` turns. Success: the episode terminated (not truncated, not cut by the turn cap) and, where
`success_reward` is set (FrozenLake's default: 1.0, its goal), its last reward reached it. The same seed and the
same replies give the same episode: the seed goes to `env.reset(seed=...)`, which seeds all of Gymnasium's
randomness (a slippery lake's slips too).
"""

from __future__ import annotations

import os

from vlrl.base.errors import ConfigError, MissingExtra
from vlrl.envs.base import Env, Observation, Step, parse_actions

# The action names Gymnasium's documentation gives for the environments it ships (which have no
# get_action_meanings), by the family name before "-v".
KNOWN_ACTIONS = {
    "FrozenLake": ("left", "down", "right", "up"),
    "CliffWalking": ("up", "right", "down", "left"),
    "Taxi": ("south", "north", "east", "west", "pickup", "dropoff"),
    "CartPole": ("push_left", "push_right"),
    "MountainCar": ("accelerate_left", "coast", "accelerate_right"),
    "Acrobot": ("torque_left", "no_torque", "torque_right"),
    "LunarLander": ("noop", "fire_left", "fire_main", "fire_right"),
    "Blackjack": ("stick", "hit"),
}
SUCCESS_REWARD = {"FrozenLake": 1.0}  # a FrozenLake episode also terminates in a hole (reward 0)
OPTIONS = {"actions": (list,), "max_actions": (int, 1, 64), "max_turns": (int, 1, 100000), "text": (bool,),
           "success_reward": (float, -1e12, 1e12)}


def _gymnasium():
    # rgb_array frames need no display; without one, pygame's SDL would look for a desktop session and complain
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        import gymnasium
    except ImportError:
        raise MissingExtra("gymnasium environments need the `gymnasium` package: pip install 'vlrl[envs]'") from None
    return gymnasium


def _render_mode(gymnasium, env_id: str) -> str | None:
    """"rgb_array" when the environment's class renders it (read from its registration, before it is built),
    else None: asking one that cannot would only draw Gymnasium's warning."""
    from gymnasium.envs.registration import load_env_creator

    entry = gymnasium.spec(env_id).entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    return "rgb_array" if "rgb_array" in (getattr(creator, "metadata", {}).get("render_modes") or ()) else None


def _name(action) -> str:
    """An action name as vlrl's replies give it: lower case, words joined by '_' ("UPRIGHT" -> "upright")."""
    return str(action).strip().lower().replace("-", "_").replace(" ", "_")


class GymnasiumEnv(Env):
    """A Gymnasium environment played by replies (see the module docstring).

    Args:
        env_id: the Gymnasium id, e.g. "FrozenLake-v1" (an id of a package Gymnasium can import).
        actions: names for the discrete actions, in the action space's order (default: the environment's own).
        max_actions: actions a reply may give per turn.
        max_turns: turns per episode (the environment's own time limit applies too).
        text: the observation as text beside the picture when the picture is a rendered frame.
        success_reward: the last reward a terminated episode needs to count as a success (default: any
            termination; FrozenLake: 1.0).
        make_options: keyword arguments of `gymnasium.make` (e.g. is_slippery=False, map_name="8x8").
    """

    OPTIONS = OPTIONS  # vlrl's own options; `make_options` are Gymnasium's to check

    def __init__(self, env_id: str, actions: list[str] | None = None, max_actions: int = 1, max_turns: int = 100,
                 text: bool = True, success_reward: float | None = None, **make_options):
        family = env_id.split("/")[-1].split("-v")[0]
        gymnasium = _gymnasium()
        self.name, self.max_actions, self.max_turns, self.text = f"gymnasium:{env_id}", max_actions, max_turns, text
        self.success_reward = SUCCESS_REWARD.get(family) if success_reward is None else success_reward
        try:
            self._env = gymnasium.make(env_id, render_mode=_render_mode(gymnasium, env_id), **make_options)
        except gymnasium.error.Error as err:
            raise ConfigError(f"gymnasium:{env_id} cannot be made ({type(err).__name__}: {err}); check the id and "
                              "its options.") from None
        except TypeError as err:  # an option the environment does not take
            raise ConfigError(f"gymnasium:{env_id} refused its options ({err}); pass only its own.") from None
        try:
            self._pictured, self.actions = self._fit(gymnasium, env_id, family, actions)
        except ConfigError:
            self._env.close()
            raise
        self._seed = None

    def _fit(self, gymnasium, env_id: str, family: str, names) -> tuple[bool, tuple[str, ...]]:
        """(whether the observation itself is the picture, the action names), or ConfigError: one line with every
        reason the environment does not fit."""
        spaces = gymnasium.spaces
        obs_space, act_space = self._env.observation_space, self._env.action_space
        pictured = (isinstance(obs_space, spaces.Box) and obs_space.dtype.name == "uint8"
                    and (len(obs_space.shape) == 2 or (len(obs_space.shape) == 3 and obs_space.shape[2] in (1, 3))))
        renders = self._env.render_mode == "rgb_array"
        reasons = []
        if not pictured and not renders:
            reasons.append(f"its observations ({obs_space}) are no picture and it does not render rgb_array")
        if not isinstance(act_space, spaces.Discrete):
            kind = "continuous" if isinstance(act_space, spaces.Box) else "not one discrete choice"
            reasons.append(f"its actions ({act_space}) are {kind}")
        else:
            count = int(act_space.n)
            if names is None:
                meanings = getattr(self._env.unwrapped, "get_action_meanings", None)
                names = meanings() if callable(meanings) else KNOWN_ACTIONS.get(family)
            if names is None:
                reasons.append(f"its {count} actions have no names; name them with [env] actions = [...]")
            elif (not isinstance(names, (list, tuple)) or len(names) != count
                  or not all(isinstance(n, str) and _name(n) for n in names)
                  or len({_name(n) for n in names}) != count):
                reasons.append(f"actions = {names!r} must be {count} different names, one per action")
        if reasons:
            raise ConfigError(f"gymnasium:{env_id} does not fit vlrl's episode runs: {'; '.join(reasons)}. They need "
                              "a picture (an image observation or rgb_array rendering) and named discrete actions.")
        return pictured, tuple(_name(n) for n in names)

    def reset(self, seed: int) -> Observation:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"{self.name}: the seed must be a whole number >= 0, got {seed!r}")
        self._obs, _ = self._env.reset(seed=seed)
        self._seed, self._turns, self._steps, self._return, self._invalid = seed, 0, 0, 0.0, 0
        self._done, self._ended, self._last_reward = False, None, None
        return self._observation()

    def step(self, reply: str) -> Step:
        if self._seed is None:
            raise RuntimeError(f"{self.name}: step() before reset(); call reset(seed) first.")
        if self._done:
            raise RuntimeError(f"{self.name}: the episode is over; call reset(seed) for another.")
        chosen, problem = parse_actions(reply, self.actions, self.max_actions)
        start = int(getattr(self._env.action_space, "start", 0))
        self._turns += 1
        reward, executed = 0.0, []
        for action in chosen:
            self._obs, r, terminated, truncated, _ = self._env.step(start + self.actions.index(action))
            self._steps += 1
            executed.append(action)
            reward += float(r)
            self._last_reward = float(r)
            if terminated or truncated:
                self._ended = "terminated" if terminated else "truncated"
                break
        if self._ended is None and self._turns >= self.max_turns:
            self._ended = "max_turns"
        self._invalid += not chosen
        self._return += reward
        self._done = self._ended is not None
        info = {"actions": executed, "invalid": not chosen, "problem": problem, "ended": self._ended}
        return Step(self._observation(), reward, self._done, info)

    def metrics(self) -> dict:
        """success (terminated, with `success_reward` reached where set), return, length (turns), steps, ended."""
        if self._seed is None:
            return {"success": False, "return": 0.0, "length": 0}
        success = self._ended == "terminated" and (self.success_reward is None
                                                   or (self._last_reward or 0.0) >= self.success_reward)
        return {"success": success, "return": self._return, "length": self._turns, "steps": self._steps,
                "ended": self._ended, "invalid": self._invalid, "seed": self._seed}

    def describe(self) -> str:
        return f"You play the Gymnasium environment {self.name.split(':', 1)[1]}, seen in the picture. " + \
            super().describe()

    def close(self) -> None:
        self._env.close()

    def _observation(self) -> Observation:
        import numpy as np
        from PIL import Image

        frame = np.asarray(self._obs if self._pictured else self._env.render(), dtype=np.uint8)
        if frame.ndim == 3 and frame.shape[2] == 1:
            frame = frame[:, :, 0]
        image = Image.fromarray(frame).convert("RGB")
        text = "" if self._pictured or not self.text else f"Observation: {_as_text(self._obs)}."
        return Observation(image, text)


def _as_text(value) -> str:
    """A Gymnasium observation in words: numbers as they are, arrays as lists rounded to 3 places."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return str(np.round(value.astype(float), 3).tolist())
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_as_text(v) for v in value) + ")"
    if isinstance(value, np.generic):
        return str(value.item())
    return str(value)
