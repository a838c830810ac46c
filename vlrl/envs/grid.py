"""The grid: a procedurally generated visual navigation task, verifiable, with a difficulty knob, small enough for the
tiny model to learn on CPU in minutes.

A square grid is drawn (agent: a blue square, goal: a green square, walls: grey); the agent moves up, down, left or
right, one cell per action, and a move into a wall or the border leaves it in place. Reaching the goal ends the
episode with reward 1 (success); `max_turns` turns without it end it with 0. The episode of a seed is fixed:

    difficulty 1: the agent starts in the top-left corner and the goal is in the bottom-right one: moving only right
                  and down always succeeds, so a policy can learn it without reading positions (the CPU preset)
    difficulty 2: agent and goal anywhere (different cells): the policy must read where they are
    difficulty 3: as 2, with walls (the goal always reachable, checked by a breadth-first search)

    env = GridEnv(size=4, difficulty=2, max_turns=8)
    obs = env.reset(seed=3)           # Observation(image=<PIL>, text="You (blue) are at row 1, column 0; the goal ...")
    step = env.step("<SOLUTION>right</SOLUTION>")

With `text = False` the observation is the picture alone (image-only mode); the picture always carries the state.
`shaping` (off by default) adds 0.1 x the decrease of the distance to the goal each turn.
"""

from __future__ import annotations

import random
from collections import deque

from vlrl.envs.base import Env, Observation, Step, parse_actions

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
# The options' types and bounds, checked by `vlrl.envs.make` (and `vlrl validate`) before anything is built (a served grid of 100,000 cells a side would
# take minutes and gigabytes to lay out; 64 is already more than a picture of `image_size` shows).
OPTIONS = {"size": (int, 2, 64), "difficulty": (int, 1, 3), "max_turns": (int, 1, 100000), "max_actions": (int, 1, 64),
           "image_size": (int, 8, 1024), "text": (bool,), "shaping": (bool,)}
COLORS = {"floor": (245, 245, 240), "wall": (110, 110, 110), "agent": (40, 90, 220), "goal": (40, 170, 60),
          "line": (200, 200, 200)}


class GridEnv(Env):
    """Navigate a drawn grid to the goal (see the module docstring)."""

    name = "grid"
    actions = tuple(MOVES)
    OPTIONS = OPTIONS

    def __init__(self, size: int = 4, difficulty: int = 1, max_turns: int = 8, max_actions: int = 1,
                 image_size: int = 64, text: bool = True, shaping: bool = False):
        self.size, self.difficulty, self.max_turns, self.max_actions = size, difficulty, max_turns, max_actions
        self.image_size, self.text, self.shaping = image_size, text, shaping
        self._seed = None

    # --- the layout of a seed ---------------------------------------------------------------------------------
    def layout(self, seed: int) -> tuple[tuple[int, int], tuple[int, int], frozenset]:
        """(agent, goal, walls) of `seed`: a pure function of the seed and the settings.

        >>> GridEnv(size=4, difficulty=1).layout(7)[:2]
        ((0, 0), (3, 3))
        """
        rng = random.Random(f"grid-{self.size}-{self.difficulty}-{seed}")
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        if self.difficulty == 1:
            return (0, 0), (self.size - 1, self.size - 1), frozenset()
        while True:
            agent, goal = rng.sample(cells, 2)
            walls = frozenset()
            if self.difficulty == 3:
                free = [c for c in cells if c not in (agent, goal)]
                walls = frozenset(rng.sample(free, len(cells) // 5))
            if shortest_path(self.size, agent, goal, walls) is not None:
                return agent, goal, walls

    # --- the interface ----------------------------------------------------------------------------------------
    def reset(self, seed: int) -> Observation:
        self._seed = seed
        self.agent, self.goal, self.walls = self.layout(seed)
        self.turns, self.total, self.invalid_turns, self.done = 0, 0.0, 0, False
        return self.observe()

    def step(self, reply: str) -> Step:
        if self._seed is None:
            raise RuntimeError("step() before reset(): reset the grid to a seed first.")
        if self.done:
            raise RuntimeError("step() after the episode ended: reset the grid to a seed first.")
        chosen, problem = parse_actions(reply, self.actions, self.max_actions)
        before = self.distance()
        for action in chosen:
            dr, dc = MOVES[action]
            nxt = (self.agent[0] + dr, self.agent[1] + dc)
            if 0 <= nxt[0] < self.size and 0 <= nxt[1] < self.size and nxt not in self.walls:
                self.agent = nxt
            if self.agent == self.goal:
                break
        self.turns += 1
        self.invalid_turns += not chosen
        reached = self.agent == self.goal
        reward = 1.0 if reached else 0.0
        if self.shaping:
            reward += 0.1 * (before - self.distance())
        self.total += reward
        self.done = reached or self.turns >= self.max_turns
        return Step(self.observe(), reward, self.done,
                    {"actions": chosen, "invalid": not chosen, "problem": problem, "position": list(self.agent)})

    def metrics(self) -> dict:
        return {"success": self.agent == self.goal, "return": self.total, "length": self.turns,
                "invalid_turns": self.invalid_turns, "distance": self.distance()}

    def describe(self) -> str:
        return ("Walk the blue square to the green square (rows count downwards, columns rightwards). "
                + super().describe())

    def task_info(self) -> dict:
        return {**super().task_info(), "size": self.size, "difficulty": self.difficulty, "max_turns": self.max_turns}

    # --- what the model sees ----------------------------------------------------------------------------------
    def distance(self) -> int:
        """Steps from the agent to the goal on the grid (ignoring walls: the shaping term's measure)."""
        return abs(self.agent[0] - self.goal[0]) + abs(self.agent[1] - self.goal[1])

    def observe(self) -> Observation:
        text = ""
        if self.text:
            text = (f"You (blue) are at row {self.agent[0]}, column {self.agent[1]}; the goal (green) is at row "
                    f"{self.goal[0]}, column {self.goal[1]}.")
        return Observation(image=self.draw(), text=text)

    def draw(self):
        """The grid as an RGB picture of `image_size` pixels a side."""
        from PIL import Image, ImageDraw

        n, side = self.size, self.image_size
        image = Image.new("RGB", (side, side), COLORS["floor"])
        draw = ImageDraw.Draw(image)
        cell = side / n
        for r in range(n):
            for c in range(n):
                box = [round(c * cell), round(r * cell), round((c + 1) * cell) - 1, round((r + 1) * cell) - 1]
                kind = ("agent" if (r, c) == self.agent else "goal" if (r, c) == self.goal
                        else "wall" if (r, c) in self.walls else None)
                draw.rectangle(box, fill=COLORS[kind] if kind else None, outline=COLORS["line"])
        return image


def shortest_path(size: int, start, goal, walls) -> int | None:
    """The fewest moves from `start` to `goal` around `walls`, or None when the goal cannot be reached.

    >>> shortest_path(3, (0, 0), (2, 2), frozenset()), shortest_path(3, (0, 0), (2, 2), {(0, 1), (1, 0)})
    (4, None)
    """
    seen, queue = {start: 0}, deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return seen[cell]
        for dr, dc in MOVES.values():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in walls and nxt not in seen:
                seen[nxt] = seen[cell] + 1
                queue.append(nxt)
    return None
