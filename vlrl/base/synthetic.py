"""Procedurally generated, verifiable visual-math items (bar and line charts, counting, geometry) in vlrl's schema.

Every item is drawn with PIL from a seed, so its gold answer is known exactly. The tiny preset trains and evaluates
on these; so does the GPU learning demonstration. `difficulty` (1-3) widens value ranges and adds bars, points and
shapes. `TASKS` (the default, which the tiny preset's warm start learned) are bar charts, circle counts and rectangle
areas; `ALL_TASKS` adds comparisons (multi-choice with numeric options), line charts, square counts, perimeters and
triangle angles: `generate(n, tasks="all")`. `MULTI_IMAGE_TASKS` show two charts per item (`images`, placed by the
question's `<image>` markers): which one shows the larger value of a bar, how much a bar changed between them, and
whether they show the same value or colour (`SAME_TASKS`: one chart alone says nothing about their answers), and
which shows the larger of two values a fixed gap apart (`two_chart_close`: one chart alone right at most
`close_ceiling(difficulty)` of the time).

    >>> items = generate(4, seed=0, image_size=64)
    >>> sorted(items[0])
    ['answer', 'answer_type', 'choices', 'id', 'image', 'metadata', 'precision', 'question', 'question_type', 'unit']
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw, ImageFont

TASKS = ("bar_value", "bar_max", "bar_sum", "bar_difference", "count", "rectangle_area")
ALL_TASKS = TASKS + ("bar_compare", "line_value", "line_compare", "line_sum", "line_difference", "count_squares",
                     "rectangle_perimeter", "triangle_angle")
# Items of two pictures each (`images`, placed by the question's <image> markers): not in ALL_TASKS (items of one)
MULTI_IMAGE_TASKS = ("two_chart_compare", "two_chart_change", "two_chart_same", "two_chart_same_color",
                     "two_chart_close", "square_shift")
# two_chart_close: the two values a fixed gap apart on a fixed scale, so one chart alone is right at most
# close_ceiling(difficulty) of the time (3/4 at difficulty 1)
CLOSE_SCALE = {1: (9, 3), 2: (9, 2), 3: (9, 1)}  # difficulty: (the scale's top value, the gap between the two)
SAME_TASKS = ("two_chart_same", "two_chart_same_color")  # "the same?" tasks: exactly half of a draw's items say yes
COLOR_NAMES = ("blue", "orange", "green", "red", "purple", "brown")  # COLORS' names, in order
# Items of one clip each (`video`: its frames, drawn at MOTION_FPS; `vlrl.data.load_synthetic` writes it as an mp4 and
# decodes it back): not in ALL_TASKS either
VIDEO_TASKS = ("shape_motion", "block_motion")
KNOWN_TASKS = ALL_TASKS + MULTI_IMAGE_TASKS + VIDEO_TASKS
MOTION_FPS = 4  # the clips' frame rate: MOTION_FRAMES frames are 2 seconds
MOTION_FRAMES = 8
GENERATOR_VERSIONS: dict[str, int] = {}  # raise a task's when its draws change: past 1 (absent), in the warm-start key
COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]
LABELS = "ABCDEF"


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _bar_chart(values: list[int], size: int, scale_to: int | None = None) -> Image.Image:
    """Bars labelled A, B, ... with their values; the tallest reaches the top, or with `scale_to` the value that does
    (two charts drawn to one scale: their bars compare by height too)."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = _font(max(8, size // 12))
    top, bottom, left = size * 0.08, size * 0.85, size * 0.08
    width = (size - 2 * left) / len(values)
    scale = (bottom - top) / max(scale_to or max(values), 1)
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


def _line_chart(values: list[int], size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = _font(max(8, size // 12))
    top, bottom, left, right = size * 0.14, size * 0.85, size * 0.1, size * 0.9
    scale = (bottom - top) / max(max(values), 1)
    step = (right - left) / (len(values) - 1)
    points = [(left + i * step, bottom - v * scale) for i, v in enumerate(values)]
    draw.line([left, bottom, right, bottom], fill="black", width=1)
    draw.line(points, fill=COLORS[0], width=max(1, size // 64))
    r = max(1, size // 64)
    for i, ((x, y), value) in enumerate(zip(points, values)):
        draw.ellipse([x - r, y - r, x + r, y + r], fill=COLORS[3])
        draw.text((x, y - r - 1), str(value), fill="black", font=font, anchor="mb")
        draw.text((x, bottom + 2), str(i + 1), fill="black", font=font, anchor="mt")
    return image


def _mixed_shapes(circles: int, squares: int, size: int, rng: random.Random) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    cells = list(range(16))
    rng.shuffle(cells)
    r = size // 10
    for n, cell in enumerate(cells[:circles + squares]):
        cx = (cell % 4 + 0.5) * size / 4 + rng.uniform(-r / 3, r / 3)
        cy = (cell // 4 + 0.5) * size / 4 + rng.uniform(-r / 3, r / 3)
        shape = draw.ellipse if n < circles else draw.rectangle
        shape([cx - r, cy - r, cx + r, cy + r], fill=COLORS[rng.randrange(len(COLORS))])
    return image


def _triangle(a: int, b: int, size: int) -> Image.Image:
    """A triangle whose base angles really are a and b degrees, labelled; the third angle is marked "?"."""
    import math

    ra, rb = math.radians(a), math.radians(b)
    side = math.sin(rb) / math.sin(ra + rb)  # law of sines, base length 1
    apex = (side * math.cos(ra), side * math.sin(ra))
    scale = min(0.76, 0.62 / apex[1]) * size
    x0 = (size - scale) / 2
    base_y = size * 0.8
    A, B = (x0, base_y), (x0 + scale, base_y)
    C = (x0 + apex[0] * scale, base_y - apex[1] * scale)
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    draw.polygon([A, B, C], outline="black", width=max(1, size // 64))
    font = _font(max(8, size // 12))
    centroid = ((A[0] + B[0] + C[0]) / 3, (A[1] + B[1] + C[1]) / 3)
    for (x, y), text in ((A, f"{a}°"), (B, f"{b}°"), (C, "?")):
        lx, ly = x + (centroid[0] - x) * 0.45, y + (centroid[1] - y) * 0.45
        draw.text((lx, ly), text, fill="black", font=font, anchor="mm")
    return image


def _distinct_pair(values: list[int], rng: random.Random) -> tuple[int, int]:
    """Two positions with different values (bumps one value when all are equal)."""
    for _ in range(20):
        i, j = rng.sample(range(len(values)), 2)
        if values[i] != values[j]:
            return i, j
    values[j] += 1
    return i, j


def _rectangle(w: int, h: int, size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    font = _font(max(8, size // 10))
    x0, y0, x1, y1 = size * 0.2, size * 0.25, size * 0.8, size * 0.7
    draw.rectangle([x0, y0, x1, y1], outline="black", width=max(1, size // 64))
    draw.text(((x0 + x1) / 2, y1 + 3), f"{w} cm", fill="black", font=font, anchor="mt")
    draw.text((x1 + 3, (y0 + y1) / 2), f"{h} cm", fill="black", font=font, anchor="lm")
    return image


def make_item(task: str, rng: random.Random, *, image_size: int = 128, difficulty: int = 1,
              same: bool | None = None) -> dict:
    """One item of `task`: the image, the question, the gold answer and a short worked reasoning (for warm starts).
    `same` fixes a SAME_TASKS item's answer (None: drawn; `generate` balances them)."""
    high = {1: 9, 2: 20, 3: 50}[difficulty]
    n_bars = {1: 3, 2: 4, 3: 6}[difficulty]
    unit, choices = None, None
    if task == "two_chart_same_color":
        return _same_color(rng, image_size, high, same=rng.random() < 0.5 if same is None else same)
    if task == "two_chart_same":
        return _two_charts(task, rng, image_size, difficulty, high, same=rng.random() < 0.5 if same is None else same)
    if task in _EXTRA:
        return _EXTRA[task](rng, image_size, difficulty, high)
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
        raise ValueError(f"unknown synthetic task {task!r}; choose from {', '.join(KNOWN_TASKS)}")
    return _item(task, question, image, answer, reasoning, skills, difficulty, unit=unit, choices=choices)


def _item(task, question, image, answer, reasoning, skills, difficulty, *, unit=None, choices=None) -> dict:
    return {
        "question": question, "image": image, "answer": str(answer), "answer_type": "integer", "precision": None,
        "question_type": "multi_choice" if choices else "free_form", "choices": choices, "unit": unit,
        "metadata": {"source": "synthetic", "task": task, "skills": skills, "difficulty": difficulty,
                     "reasoning": reasoning},
    }


def _bar_compare(rng, size, difficulty, high):
    n_bars = {1: 3, 2: 4, 3: 6}[difficulty]
    values = [rng.randint(1, high) for _ in range(n_bars)]
    i, j = _distinct_pair(values, rng)
    a, b, best = LABELS[i], LABELS[j], max(values[i], values[j])
    return _item("bar_compare", f"Which is larger: bar {a} or bar {b}?", _bar_chart(values, size), best,
                 f"Bar {a} is {values[i]} and bar {b} is {values[j]}; {best} is larger.",
                 ["statistical reasoning"], difficulty, choices=[str(values[i]), str(values[j])])


def _line(task, rng, size, difficulty, high):
    n_points = {1: 4, 2: 5, 3: 6}[difficulty]
    values = [rng.randint(1, high) for _ in range(n_points)]
    if task == "line_compare":
        i, j = _distinct_pair(values, rng)
    else:
        i, j = sorted(rng.sample(range(n_points), 2))
    vi, vj, xi, xj = values[i], values[j], i + 1, j + 1
    choices = None
    if task == "line_value":
        question, answer, reasoning = f"What is the value at x = {xi}?", vi, f"At x = {xi} the line is at {vi}."
    elif task == "line_compare":
        question, answer = f"Which is larger: the value at x = {xi} or at x = {xj}?", max(vi, vj)
        reasoning, choices = f"At x = {xi} it is {vi}, at x = {xj} it is {vj}; {answer} is larger.", [str(vi), str(vj)]
    elif task == "line_sum":
        question, answer = f"What is the sum of the values at x = {xi} and x = {xj}?", vi + vj
        reasoning = f"{vi} + {vj} = {vi + vj}."
    else:
        question, answer = f"How much does the value change from x = {xi} to x = {xj}?", vj - vi
        reasoning = f"{vj} - {vi} = {vj - vi}."
    image = _line_chart(values, size)
    return _item(task, question, image, answer, reasoning, ["statistical reasoning"], difficulty, choices=choices)


def _count_squares(rng, size, difficulty, high):
    squares = rng.randint(1, min(high, 8))
    circles = rng.randint(1, min(high, 16 - squares, 8))
    image = _mixed_shapes(circles, squares, size, rng)
    return _item("count_squares", "How many squares are there?", image, squares, f"I count {squares} squares.",
                 ["numeric commonsense"], difficulty)


def _perimeter(rng, size, difficulty, high):
    w, h = rng.randint(1, high), rng.randint(1, high)
    return _item("rectangle_perimeter", "What is the perimeter of the rectangle in cm?", _rectangle(w, h, size),
                 2 * (w + h), f"2 * ({w} + {h}) = {2 * (w + h)}.", ["geometry reasoning"], difficulty, unit="cm")


def _triangle_angle(rng, size, difficulty, high):
    step = {1: 10, 2: 5, 3: 1}[difficulty]
    a = rng.randrange(30, 80, step)
    b = rng.randrange(30, min(80, 150 - a) + 1, step)
    return _item("triangle_angle", "What is the measure of the angle marked ?, in degrees?", _triangle(a, b, size),
                 180 - a - b, f"180 - {a} - {b} = {180 - a - b}.", ["geometry reasoning", "algebraic reasoning"],
                 difficulty)


def _one_bar(value: int, size: int, high: int, rng: random.Random, color: int | None = None) -> Image.Image:
    """One bar of `value` on a scale up to `high`, at a drawn place, width and colour (so pictures rarely repeat);
    `color` (an index of COLORS) fixes the colour."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    bottom, top = size * 0.9, size * 0.1
    width = size * rng.uniform(0.15, 0.3)
    x0 = rng.uniform(size * 0.05, size * 0.95 - width)
    fill = rng.choice(COLORS) if color is None else COLORS[color]
    draw.rectangle([x0, bottom - value * (bottom - top) / high, x0 + width, bottom], fill=fill)
    draw.line([0, bottom, size, bottom], fill="black", width=1)
    return image


def _other_value(v1: int, high: int, rng: random.Random) -> int:
    """A value at least a third of the scale from `v1`, drawn so that it is as uniform on 1..high as `v1` is: a cyclic
    shift of 3 to 6 places of 9 (a third to two thirds of the scale). A plain draw among the far values would not be
    (1 and 9 have six far values, 5 only four), and a chart's value would then hint at "same" or "different"."""
    gap = -(-high // 3)
    return (v1 - 1 + rng.randint(gap, high - gap)) % high + 1


def _two_charts(task, rng, size, difficulty, high, same=None):
    """Two charts of the same bars, drawn from different values to one scale: "how much" needs both pictures. "Which"
    does not quite: difficulty 1 draws one bar a chart, at least a third of the scale apart, so the answer shows in the
    bars' heights, and the first chart alone predicts it 88.9% of the time (a first bar of 1-3 of 9 is always the
    smaller, 7-9 always the larger: bench/results/inputs.md). "The same?" does: the shown bar's value is equal in
    `same` items, else a third of the scale or more apart, and either chart's value is uniform under both answers, so
    one chart alone is exactly a coin flip."""
    if task == "two_chart_close":
        high, gap = CLOSE_SCALE[difficulty]
        low = rng.randint(1, high - gap)
        v1, v2 = (low, low + gap) if rng.random() < 0.5 else (low + gap, low)
        a, name = "A", "the bar"
        pictures = [_one_bar(v1, size, high, rng), _one_bar(v2, size, high, rng)]
    elif difficulty == 1:
        v1 = rng.randint(1, high)
        if task == "two_chart_same":
            v2 = v1 if same else _other_value(v1, high, rng)
        else:
            v2 = rng.choice([v for v in range(1, high + 1) if abs(v - v1) >= high // 3] if task == "two_chart_compare"
                            else [v for v in range(1, high + 1) if v != v1])
        a, name = "A", "the bar"
        pictures = [_one_bar(v1, size, high, rng), _one_bar(v2, size, high, rng)]
    else:
        n_bars = {2: 3, 3: 4}[difficulty]
        first = [rng.randint(1, high) for _ in range(n_bars)]
        second = [rng.randint(1, high) for _ in range(n_bars)]
        i = rng.randrange(n_bars)
        if task == "two_chart_same":
            second[i] = first[i] if same else _other_value(first[i], high, rng)
        else:
            while second[i] == first[i]:
                second[i] = rng.randint(1, high)
        a, v1, v2 = LABELS[i], first[i], second[i]
        name = f"bar {a}"
        pictures = [_bar_chart(first, size, scale_to=high), _bar_chart(second, size, scale_to=high)]
    place = "The first chart: <image> The second chart: <image> "
    if task in ("two_chart_compare", "two_chart_close"):
        question = place + f"Which chart shows the larger value for {name}? Answer 1 for the first, 2 for the second."
        answer = 1 if v1 > v2 else 2
        reasoning = f"{name.capitalize()} is {v1} in the first chart and {v2} in the second; chart {answer} is larger."
    elif task == "two_chart_same":
        question = place + f"Do the two charts show the same value for {name}? Answer 1 for yes, 2 for no."
        answer = 1 if v1 == v2 else 2
        verdict = "the same" if answer == 1 else "different"
        reasoning = f"{name.capitalize()} is {v1} in the first chart and {v2} in the second: {verdict}, so {answer}."
    else:
        question = place + f"How much did {name} change from the first chart to the second?"
        answer = v2 - v1
        reasoning = f"{name.capitalize()} went from {v1} to {v2}: {v2} - {v1} = {v2 - v1}."
    item = _item(task, question, pictures[0], answer, reasoning, ["statistical reasoning"], difficulty)
    return {**item, "images": pictures}


def close_ceiling(difficulty: int = 1) -> float:
    """The best a reader of one chart of a `two_chart_close` item can score: the pair is (low, low + gap) with low
    uniform on 1..high - gap, in a random order. A shown value of gap or less is always the smaller, one above
    high - gap always the larger (2 x gap of the 2 x (high - gap) equally likely cases); every value between is the
    smaller or the larger alike, a coin flip. So high / (2 (high - gap)), on a scale of 9: 3/4 at difficulty 1 (a gap
    of 3), 9/14 (64.3%) at 2 (a gap of 2), 9/16 (56.3%) at 3 (a gap of 1).

    >>> [round(close_ceiling(d), 3) for d in (1, 2, 3)]
    [0.75, 0.643, 0.562]
    """
    high, gap = CLOSE_SCALE[difficulty]
    return high / (2 * (high - gap))


def _same_color(rng, size, high, same):
    """Two one-bar charts, of the same colour in `same` items, else of two different ones; each chart's colour is
    uniform over the six under both answers (the second a drawn other one), and the bars' heights are drawn apart from
    it, so one chart alone says nothing. One bar a chart at every difficulty: colour is what the pictures show."""
    c1 = rng.randrange(len(COLORS))
    c2 = c1 if same else (c1 + rng.randint(1, len(COLORS) - 1)) % len(COLORS)
    pictures = [_one_bar(rng.randint(1, high), size, high, rng, c) for c in (c1, c2)]
    answer = 1 if same else 2
    question = ("The first chart: <image> The second chart: <image> Are the bars of the two charts the same colour? "
                "Answer 1 for yes, 2 for no.")
    reasoning = (f"The bar is {COLOR_NAMES[c1]} in the first chart and {COLOR_NAMES[c2]} in the second: "
                 f"{'the same' if same else 'different'}, so {answer}.")
    item = _item("two_chart_same_color", question, pictures[0], answer, reasoning, ["figure question answering"], 1)
    return {**item, "images": pictures}


def _shape_motion(rng, size, difficulty, high, task="shape_motion"):
    """A shape moving left or right at a steady pace across MOTION_FRAMES frames. Where it is halfway through the
    clip is drawn alike for both ways, so the middle of the clip is no clue to the way, and one end frame only a weak
    one (a shape near an edge); two frames tell it. Difficulty 1 moves it half the picture's width (2 and 3: a third,
    a sixth). `block_motion` is the same motion made as plain as a bar's height: a black square a third of the
    frame's side, and a reasoning that names only the way it moves (shape_motion's names its start and end x in
    pixels, which the tiny model never learned to read). It wraps around: what leaves at one side comes back in at
    the other, and its start is uniform over the frame's width, so where it is in any one frame is uniform for both
    ways: any frame alone (`vlrl eval --images still` holds one) is exactly a coin flip."""
    travel = size * {1: 0.5, 2: 1 / 3, 3: 1 / 6}[difficulty]
    block = task == "block_motion"
    side = size // 3 if block else max(4, size // 6)
    rightward = rng.random() < 0.5
    if block:  # it leaves one side of the frame and comes back in at the other: anywhere, in every frame, either way
        start = rng.uniform(0, size)
    else:
        middle = rng.uniform(travel / 2, size - side - travel / 2)
        start = middle - travel / 2 if rightward else middle + travel / 2
    top = rng.uniform(0, size - side)
    color, shape = ((0, 0, 0), "square") if block else (rng.choice(COLORS), rng.choice(["circle", "square"]))
    frames = []
    for k in range(MOTION_FRAMES):
        x = start + (travel if rightward else -travel) * k / (MOTION_FRAMES - 1)
        if block:
            frames.append(_wrapped_square(x, top, side, size))
            continue
        frame = Image.new("RGB", (size, size), "white")
        draw = ImageDraw.Draw(frame)
        (draw.ellipse if shape == "circle" else draw.rectangle)([x, top, x + side, top + side], fill=color)
        frames.append(frame)
    answer, end = (2, start + travel) if rightward else (1, start - travel)
    way = "right" if rightward else "left"
    question = "<video> Which way does the shape move across the clip? Answer 1 for left, 2 for right."
    reasoning = (f"The square moves {way}, so {answer}." if block else
                 f"The {shape} starts at x = {start:.0f} and ends at x = {end:.0f}; it moves {way}, so {answer}.")
    item = _item(task, question, None, answer, reasoning, ["spatial reasoning"], difficulty)
    return {**item, "video": frames, "video_metadata": {"fps": float(MOTION_FPS), "total_num_frames": MOTION_FRAMES,
                                                        "frames_indices": list(range(MOTION_FRAMES)),
                                                        "duration": MOTION_FRAMES / MOTION_FPS, "source": "frames"}}


def _wrapped_square(x: float, top: float, side: int, size: int) -> Image.Image:
    """A black square at `x` (taken round the picture's width): a square across the right edge shows its rest at the
    left, so where it is, is uniform whenever x is."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    for at in (x % size, x % size - size):
        draw.rectangle([at, top, at + side, top + side], fill="black")
    return image


def _square_shift(rng, size, difficulty, high):
    """Two pictures of one black square, the second moved left or right by a quarter of the width (difficulty 2 and 3:
    a sixth, a tenth), round the picture as block_motion's clips are: where it is in either picture is uniform for
    both ways, so one picture alone is exactly a coin flip; the two together tell the way."""
    side, step = size // 3, size * {1: 1 / 4, 2: 1 / 6, 3: 1 / 10}[difficulty]
    rightward = rng.random() < 0.5
    x, top = rng.uniform(0, size), rng.uniform(0, size - side)
    pictures = [_wrapped_square(x, top, side, size), _wrapped_square(x + (step if rightward else -step), top, side,
                                                                     size)]
    answer = 2 if rightward else 1
    question = ("The first picture: <image> The second picture: <image> Which way did the square move from the first "
                "picture to the second? Answer 1 for left, 2 for right.")
    reasoning = f"The square moved {'right' if rightward else 'left'}, so {answer}."
    item = _item("square_shift", question, pictures[0], answer, reasoning, ["spatial reasoning"], difficulty)
    return {**item, "images": pictures}


_EXTRA = {
    "square_shift": _square_shift,
    **{t: (lambda rng, size, d, high, t=t: _shape_motion(rng, size, d, high, t)) for t in VIDEO_TASKS},
    "bar_compare": _bar_compare,
    **{t: (lambda rng, size, d, high, t=t: _line(t, rng, size, d, high))
       for t in ("line_value", "line_compare", "line_sum", "line_difference")},
    "count_squares": _count_squares,
    "rectangle_perimeter": _perimeter,
    "triangle_angle": _triangle_angle,
    **{t: (lambda rng, size, d, high, t=t: _two_charts(t, rng, size, d, high))
       for t in ("two_chart_compare", "two_chart_change", "two_chart_close")},
}


def generate(n: int, *, seed: int = 0, image_size: int = 128, difficulty: int = 1,
             tasks: tuple[str, ...] | str = TASKS) -> list[dict]:
    """`n` items, deterministic for a seed. Ids are `synthetic-<seed>-<index>`, so different seeds never collide.

    Args:
        n: how many items.
        seed: seeds everything drawn.
        image_size: side of the square images, in pixels.
        difficulty: 1 (small numbers, 3 bars) to 3 (up to 50, 6 bars).
        tasks: which tasks to draw from, round-robin: names of ALL_TASKS, one name, or "all".

    >>> [item["answer"] for item in generate(3, seed=0, tasks="triangle_angle", difficulty=1)]
    ['60', '100', '50']
    """
    if difficulty not in (1, 2, 3):
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty!r}")
    tasks = ALL_TASKS if tasks == "all" else (tasks,) if isinstance(tasks, str) else tuple(tasks)
    unknown = [t for t in tasks if t not in KNOWN_TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown synthetic tasks {unknown or tasks!r}; choose from {', '.join(KNOWN_TASKS)} or 'all'")
    rng = random.Random(seed)
    same = _balanced_same(n, seed, tasks)
    items = []
    for index in range(n):
        item = make_item(tasks[index % len(tasks)], rng, image_size=image_size, difficulty=difficulty,
                         same=same.get(index))
        items.append({"id": f"synthetic-{seed}-{index}", **item})
    return items


def _balanced_same(n: int, seed: int, tasks: tuple[str, ...]) -> dict[int, bool]:
    """Which SAME_TASKS items of a draw show the same value or colour: exactly half of them (one more "different"
    when odd), in an order shuffled by its own generator, so the other tasks' items stay what the seed always drew.

    >>> answers = _balanced_same(10, 0, ("two_chart_same",))
    >>> sum(answers.values()), len(answers)
    (5, 10)
    """
    indices = [index for index in range(n) if tasks[index % len(tasks)] in SAME_TASKS]
    flags = [index < len(indices) // 2 for index in range(len(indices))]
    random.Random(f"two_chart_same-{seed}").shuffle(flags)
    return dict(zip(indices, flags))
