"""Filmstrips: an episode's frames side by side in one picture, each under its label (the turn and its action), for
`vlrl env play` and the report's flipped episodes.

    strip = filmstrip(frames, ["t0 reset", "t1 right", "t2 down"], height=96)
    strip.save("episode.png")
"""

from __future__ import annotations

MAX_FRAMES = 16  # more frames than this: evenly spaced ones, always the first and the last


def pick_frames(count: int, max_frames: int = MAX_FRAMES) -> list[int]:
    """The indices a strip shows of `count` frames: all of them, else `max_frames` evenly spaced, first and last kept.

    >>> pick_frames(5, 16)
    [0, 1, 2, 3, 4]
    >>> pick_frames(10, 4)
    [0, 3, 6, 9]
    """
    if count <= max_frames:
        return list(range(count))
    if max_frames < 2:
        return [count - 1][:max_frames]
    return sorted({round(i * (count - 1) / (max_frames - 1)) for i in range(max_frames)})


def filmstrip(frames, labels=None, *, height: int = 96, max_frames: int = MAX_FRAMES, gap: int = 4):
    """One RGB picture: the frames (PIL images) scaled to `height`, left to right, each with its label beneath
    (nearest-neighbour scaling, so pixel-art observations stay sharp). More than `max_frames` frames: `pick_frames`.

    >>> from PIL import Image
    >>> strip = filmstrip([Image.new("RGB", (8, 8), "red"), Image.new("RGB", (16, 8), "blue")], ["a", "b"], height=32)
    >>> strip.size[1] > 32, strip.size[0] >= 32 + 64
    (True, True)
    """
    from PIL import Image, ImageDraw

    frames = list(frames)
    labels = [str(x) for x in labels] if labels is not None else [str(i) for i in range(len(frames))]
    if len(labels) != len(frames):
        raise ValueError(f"{len(frames)} frames and {len(labels)} labels: give one label per frame.")
    if not frames:
        return Image.new("RGB", (height, height + 14), "white")
    keep = pick_frames(len(frames), max_frames)
    scaled = [frames[i].convert("RGB").resize((max(1, round(frames[i].width * height / frames[i].height)), height),
                                              Image.NEAREST) for i in keep]
    text_height = 14
    width = sum(f.width for f in scaled) + gap * (len(scaled) + 1)
    strip = Image.new("RGB", (width, height + text_height + 2 * gap), "white")
    draw = ImageDraw.Draw(strip)
    x = gap
    for frame, i in zip(scaled, keep):
        strip.paste(frame, (x, gap))
        label = labels[i]
        while label and draw.textlength(label) > frame.width:  # cut to the frame's width
            label = label[:-1]
        draw.text((x, height + gap + 1), label, fill="black")
        x += frame.width + gap
    return strip
