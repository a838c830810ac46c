"""The environment interface of episode runs: small enough to write in an afternoon.

An environment resets to a seed, reads the model's reply as its action, and returns the next observation (a picture
and a text state summary), the reward and whether the episode ended. The same (environment, seed) always gives the
same episode for the same replies.

    env = make("grid", size=5)
    obs = env.reset(seed=3)                # Observation(image=<PIL 5x5 grid>, text="You are at ...")
    step = env.step("<REASONING>the goal is right</REASONING><SOLUTION>right</SOLUTION>")
    step.reward, step.done, step.info      # 0.0, False, {"actions": ["right"], "invalid": False, ...}

Replies use the answer grammar of `vlrl.grammar.answers`: the actions are the solution, by name, comma-separated, up to the
environment's cap per turn (`parse_actions`). A reply that names no valid action is an invalid action: the step says
so in `info["invalid"]` and the episode goes on.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import ClassVar

from vlrl.grammar.answers import FORMAT, extract_solution


@dataclass
class Observation:
    """What the model sees after a reset or a step: a picture (None: a text-only environment) and a text state
    summary ("" when the environment shows pictures only)."""

    image: object | None  # PIL.Image.Image
    text: str = ""


@dataclass
class Step:
    """One step's result. `reward` is what GSPO sums over the episode; `info` carries the rest: `actions` (what was
    executed), `invalid` (the reply named no valid action), and anything the environment reports of its own (e.g.
    crafter's `env_reward`, `achievements`)."""

    observation: Observation
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class Env:
    """The interface. Subclasses set `name`, `actions` (the action names), `max_actions` (per turn) and `OPTIONS`
    (their keyword arguments' types and bounds), and write `reset`, `step` and `metrics`; `describe` and `task_info`
    come with it."""

    name: str = "env"
    actions: tuple[str, ...] = ()
    max_actions: int = 1
    # The options' types and bounds (see `option_problems`), checked by `vlrl.envs.make` before anything is built.
    OPTIONS: ClassVar[dict] = {}

    def reset(self, seed: int) -> Observation:
        """Starts the episode of `seed` and returns its first observation."""
        raise NotImplementedError

    def step(self, reply: str) -> Step:
        """Applies the model's reply (its text) as this turn's actions; see `parse_actions`."""
        raise NotImplementedError

    def metrics(self) -> dict:
        """The episode's metrics so far: at least `success` (bool), `return` (float) and `length` (turns)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The action description for the prompt: what the actions are and how to give them."""
        per_turn = "one action" if self.max_actions == 1 else f"up to {self.max_actions} actions, comma-separated,"
        return (f"Actions: {', '.join(self.actions)}. Give {per_turn} inside the solution tags, "
                f"e.g. {FORMAT.answer(self.actions[0] if self.actions else 'noop')}.")

    def task_info(self) -> dict:
        """The action space and observation format, as `GET /task_info` of `vlrl serve-env` serves them."""
        return {"name": self.name, "actions": list(self.actions), "max_actions_per_turn": self.max_actions,
                "action_description": self.describe(),
                "observation": {"image": "data URL (image/png)", "text": "state summary ('' in image-only mode)"}}

    def close(self) -> None:
        """Releases what the environment holds (a process, a connection); the default holds nothing."""


def parse_actions(reply, actions, max_actions: int) -> tuple[list[str], str | None]:
    """The actions a reply names: its solution (else the whole reply), split on commas, each matched to an action
    name (case and spaces ignored, '-' and ' ' read as '_'), at most `max_actions`. Returns (actions, problem): the
    problem is None when every named action is valid; an empty list is an invalid action.

    >>> parse_actions("<REASONING>go</REASONING><SOLUTION>Move Left, noop</SOLUTION>", ["noop", "move_left"], 4)
    (['move_left', 'noop'], None)
    >>> parse_actions("<SOLUTION>fly</SOLUTION>", ["noop", "move_left"], 1)
    ([], "'fly' is not an action (noop, move_left)")
    >>> parse_actions("<SOLUTION>noop, noop, noop</SOLUTION>", ["noop"], 2)
    (['noop', 'noop'], '3 actions named, at most 2 per turn: the first 2 taken')
    """
    text = extract_solution(reply)
    if text is None:
        text = reply if isinstance(reply, str) else ""
    names = {a.lower(): a for a in actions}
    wanted = [part.strip().lower().replace("-", "_").replace(" ", "_") for part in text.split(",")]
    wanted = [w for w in wanted if w]
    if not wanted:
        return [], "the reply names no action"
    unknown = [w for w in wanted if w not in names]
    if unknown:
        return [], f"{unknown[0]!r} is not an action ({', '.join(actions)})"
    chosen = [names[w] for w in wanted[:max_actions]]
    if len(wanted) > max_actions:
        return chosen, f"{len(wanted)} actions named, at most {max_actions} per turn: the first {max_actions} taken"
    return chosen, None


def check_options(env_name: str, specs: dict, values: dict) -> None:
    """Raises a ConfigError listing every problem `option_problems` finds; returns None when there is none.

    >>> check_options("grid", {"size": (int, 2, 32), "text": (bool,)}, {"size": 100000, "text": "yes"})
    Traceback (most recent call last):
    ...
    vlrl.base.errors.ConfigError: 2 problems:
      - grid: size must be a whole number in 2..32, got 100000
      - grid: text must be true or false, got 'yes'
    """
    from vlrl.base.errors import ConfigError

    problems = option_problems(env_name, specs, values)
    if problems:
        raise ConfigError(problems)


def option_problems(env_name: str, specs: dict, values: dict) -> list[str]:
    """Every value of `values` that does not fit its spec, one line each (`env: key must be ..., got value`). A spec
    is (int, low, high), (float, low, high), (bool,), (list,) for a list of names, or (str, choices) with choices
    None for any text up to 200 characters; a key without a spec, and a None value, pass.

    >>> option_problems("grid", {"size": (int, 2, 64)}, {"size": "abc"})
    ["grid: size must be a whole number in 2..64, got 'abc'"]
    """
    problems = []
    for key, value in values.items():
        spec = specs.get(key)
        if spec is None or value is None:
            continue
        kind = spec[0]
        if kind is bool:
            if not isinstance(value, bool):
                problems.append(f"{env_name}: {key} must be true or false, got {value!r}")
        elif kind is list:
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and 0 < len(v) <= 200
                                                               for v in value):
                problems.append(f"{env_name}: {key} must be a list of names, e.g. [\"left\", \"right\"], got "
                                f"{value!r}")
        elif kind is str:
            choices = spec[1]
            if not isinstance(value, str) or len(value) > 200 or (choices is not None and value not in choices):
                wanted = f"one of {', '.join(choices)}" if choices is not None else "text (up to 200 characters)"
                problems.append(f"{env_name}: {key} must be {wanted}, got {value!r}")
        else:
            low, high = spec[1], spec[2]
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            whole = isinstance(value, int) and not isinstance(value, bool)
            if not (whole if kind is int else numeric) or not low <= value <= high:
                what = "a whole number" if kind is int else "a number"
                problems.append(f"{env_name}: {key} must be {what} in {low}..{high}, got {value!r}")
    return problems


def to_data_url(image) -> str:
    """A PIL image as a PNG data URL (the OpenAI multimodal schema's `image_url`)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def from_data_url(url: str):
    """A data URL back to an RGB PIL image, through `vlrl.base.images.load_image` (size limits, clear errors)."""
    from vlrl.base.images import load_image

    return load_image(url)
