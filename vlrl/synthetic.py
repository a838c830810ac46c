"""Procedurally generated, verifiable visual-math items (bar charts, counting, rectangles) in vlrl's canonical schema.

Every item is drawn with PIL from a seed, so its gold answer is known exactly. The tiny preset trains and evaluates
on these; so does the GPU learning demonstration. `difficulty` (1-3) widens value ranges and adds bars and shapes.

    >>> items = generate(4, seed=0, image_size=64)
    >>> sorted(items[0])
    ['answer', 'answer_type', 'choices', 'id', 'image', 'metadata', 'precision', 'question', 'question_type', 'unit']
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw, ImageFont

TASKS = ("bar_value", "bar_max", "bar_sum", "bar_difference", "count", "rectangle_area")
COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]
LABELS = "ABCDEF"


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _bar_chart(values: list[int], size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = _font(max(8, size // 12))
    top, bottom, left = size * 0.08, size * 0.85, size * 0.08
    width = (size - 2 * left) / len(values)
    scale = (bottom - top) / max(max(values), 1)
    for i, value in enumerate(values):
        x0 = left + i * width + width * 0.15
        x1 = left + (i + 1) * width - width * 0.15
        draw.rectangle([x0, bottom - value * scale, x1, bottom], fill=COLORS[i % len(COLORS)])
        draw.text(((x0 + x1) / 2, bottom + 2), LABELS[i], fill="black", font=font, anchor="mt")
        draw.text(((x0 + x1) / 2, bottom - value * scale - 2), str(value), fill="black", font=font, anchor="mb")
    draw.line([left, bottom, size - left, bottom], fill="black", width=1)
    return image


def _shapes(count: int, size: int, rng: random.Random) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    cells = list(range(16))
    rng.shuffle(cells)
    r = size // 10
    for cell in cells[:count]:
        cx = (cell % 4 + 0.5) * size / 4 + rng.uniform(-r / 3, r / 3)
        cy = (cell // 4 + 0.5) * size / 4 + rng.uniform(-r / 3, r / 3)
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLORS[rng.randrange(len(COLORS))])
    return image


def _rectangle(w: int, h: int, size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = _font(max(8, size // 10))
    x0, y0, x1, y1 = size * 0.2, size * 0.25, size * 0.8, size * 0.7
    draw.rectangle([x0, y0, x1, y1], outline="black", width=max(1, size // 64))
    draw.text(((x0 + x1) / 2, y1 + 3), f"{w} cm", fill="black", font=font, anchor="mt")
    draw.text((x1 + 3, (y0 + y1) / 2), f"{h} cm", fill="black", font=font, anchor="lm")
    return image


def make_item(task: str, rng: random.Random, *, image_size: int = 128, difficulty: int = 1) -> dict:
    """One item of `task`: the image, the question, the gold answer and a short worked reasoning (for warm starts)."""
    high = {1: 9, 2: 20, 3: 50}[difficulty]
    n_bars = {1: 3, 2: 4, 3: 6}[difficulty]
    unit = None
    if task.startswith("bar_"):
        values = [rng.randint(1, high) for _ in range(n_bars)]
        image = _bar_chart(values, image_size)
        i, j = rng.sample(range(n_bars), 2)
        a, b = LABELS[i], LABELS[j]
        if task == "bar_value":
            question, answer, reasoning = f"What is the value of bar {a}?", values[i], f"Bar {a} is {values[i]}."
        elif task == "bar_max":
            question, answer = "What is the largest value in the chart?", max(values)
            reasoning = f"The tallest bar is {max(values)}."
        elif task == "bar_sum":
            question, answer = f"What is the sum of bars {a} and {b}?", values[i] + values[j]
            reasoning = f"{values[i]} + {values[j]} = {values[i] + values[j]}."
        else:
            question, answer = f"How much larger is bar {a} than bar {b}?", values[i] - values[j]
            reasoning = f"{values[i]} - {values[j]} = {values[i] - values[j]}."
        skills = ["statistical reasoning"] if task != "bar_value" else ["figure question answering"]
    elif task == "count":
        count = rng.randint(1, min(high, 16))
        image = _shapes(count, image_size, rng)
        question, answer, reasoning = "How many circles are there?", count, f"I count {count} circles."
        skills = ["numeric commonsense"]
    elif task == "rectangle_area":
        w, h = rng.randint(1, high), rng.randint(1, high)
        image = _rectangle(w, h, image_size)
        question, answer, reasoning = "What is the area of the rectangle in cm^2?", w * h, f"{w} * {h} = {w * h}."
        skills, unit = ["geometry reasoning"], "cm^2"
    else:
        raise ValueError(f"unknown synthetic task {task!r}; choose from {', '.join(TASKS)}")
    return {
        "question": question, "image": image, "answer": str(answer), "answer_type": "integer", "precision": None,
        "question_type": "free_form", "choices": None, "unit": unit,
        "metadata": {"source": "synthetic", "task": task, "skills": skills, "difficulty": difficulty,
                     "reasoning": reasoning},
    }


def generate(n: int, *, seed: int = 0, image_size: int = 128, difficulty: int = 1,
             tasks: tuple[str, ...] = TASKS) -> list[dict]:
    """`n` items, deterministic for a seed. Ids are `synthetic-<seed>-<index>`, so different seeds never collide.

    Args:
        n: how many items.
        seed: seeds everything drawn.
        image_size: side of the square images, in pixels.
        difficulty: 1 (small numbers, 3 bars) to 3 (up to 50, 6 bars).
        tasks: which tasks to draw from, round-robin.
    """
    if difficulty not in (1, 2, 3):
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty!r}")
    rng = random.Random(seed)
    items = []
    for index in range(n):
        item = make_item(tasks[index % len(tasks)], rng, image_size=image_size, difficulty=difficulty)
        items.append({"id": f"synthetic-{seed}-{index}", **item})
    return items
