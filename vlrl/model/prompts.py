"""Prompts: a canonical row -> the conversation the model sees, rendered through the chat template.

`to_prompt()` turns a row into TRL's conversational form (one user turn: the image(s), the question, its choices
and the answer instruction of `vlrl.grammar.answers.FORMAT`) plus the scoring columns, which GRPOTrainer passes on to the
reward functions as keyword arguments. `render_prompt()` shows it through the chat template, and `batch_inputs()`
turns rendered contexts and their pictures into the processor's tensors. Its length: `vlrl.model.lengths`.

    >>> row = to_prompt({"id": "1", "question": "How many?", "image": object(), "answer": "3"})
    >>> [part["type"] for part in row["prompt"][0]["content"]]
    ['image', 'text']
"""

from __future__ import annotations

import json
import re

from vlrl.base.images import load_image, undecoded
from vlrl.grammar import answers, rewards

SCORING_COLUMNS = ("answer", *rewards.META_COLUMNS)  # what GRPOTrainer passes on to the rewards
IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"  # where an item's video stands in its question; without one the video comes first

# Qwen3-VL's chat template (the tiny model's, and what render_prompt uses without a processor), without tools and video timestamps: im_start/im_end turns, one vision block per image.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Tokens only a picture or a video brings into a sequence (Qwen-VL's placeholders and vision brackets): never generated.
# Qwen3-VL-Thinking's generation prompt opens the thinking block: the model's turn starts inside `<think>` (vlrl.grammar.thinking).
THINKING_CHAT_TEMPLATE = CHAT_TEMPLATE.replace("'<|im_start|>assistant\\n' }}{%- endif %}",
                                               "'<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")


def question_text(row: dict) -> str:
    """The question as the model sees it: the question, its choices when it has them, and the answer instruction.

    >>> question_text({"question": "Which is larger?", "choices": ["3", "7"]})
    'Which is larger?\\nChoices: (A) 3 (B) 7\\nReason about ...'
    """
    text = str(row["question"]).strip()
    if row.get("choices"):
        options = " ".join(f"({chr(ord('A') + i)}) {c}" for i, c in enumerate(row["choices"]))
        text += f"\nChoices: {options}"
    return f"{text}\n{answers.INSTRUCTION}"


def row_images(row: dict, *, decode: bool = False) -> list:
    """The row's images, in prompt order (`images` when it has several, else `[image]`, else none).

    Args:
        row: a canonical or TRL row; its images may be PIL images or undecoded `{"bytes", "path"}` values.
        decode: return RGB PIL images (`vlrl.base.images.load_image`) rather than the values as stored.

    >>> from PIL import Image
    >>> [im.mode for im in row_images({"image": Image.new("L", (4, 4))}, decode=True)], row_images({"image": None})
    (['RGB'], [])
    """
    images = list(row["images"]) if row.get("images") else [row["image"]] if row.get("image") is not None else []
    return [load_image(image) for image in images] if decode else images


def row_video(row: dict) -> tuple[list, dict] | None:
    """The row's video as the processor takes it: (its frames, in order, as stored; its metadata: `fps`,
    `frames_indices`, ... of `vlrl.base.video.read_video`), or None for a row without one.

    >>> row_video({"video": [1, 2], "video_metadata": {"fps": 2.0}}), row_video({"image": 1})
    (([1, 2], {'fps': 2.0}), None)
    """
    frames = row.get("video")
    return (list(frames), dict(row.get("video_metadata") or {})) if frames else None


def prompt_content(text: str, n_images: int, video: bool = False) -> list[dict]:
    """Text with `<image>` placeholders -> content parts, images in place (or first when there is no placeholder);
    with `video`, one video part at the `<video>` placeholder (or before everything else without one).

    >>> [p["type"] for p in prompt_content("Look: <image> and <image>. Sum?", 2)]
    ['text', 'image', 'text', 'image', 'text']
    >>> [p["type"] for p in prompt_content("In <video>, which way?", 0, video=True)]
    ['text', 'video', 'text']
    """
    from vlrl.base.errors import DataError

    pieces = re.split(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})", text)
    markers = {kind: pieces.count(kind) for kind in (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER)}
    if markers[IMAGE_PLACEHOLDER] and markers[IMAGE_PLACEHOLDER] != n_images:
        raise DataError(f"the prompt has {markers[IMAGE_PLACEHOLDER]} {IMAGE_PLACEHOLDER} placeholders for "
                        f"{n_images} images; give one placeholder per image, or none (images then come first).")
    if markers[VIDEO_PLACEHOLDER] > int(video):
        raise DataError(f"the prompt has {markers[VIDEO_PLACEHOLDER]} {VIDEO_PLACEHOLDER} placeholders for "
                        f"{int(video)} videos; give one placeholder for the item's video, or none (it then comes first).")
    content = [{"type": "video"}] if video and not markers[VIDEO_PLACEHOLDER] else []
    content += [{"type": "image"} for _ in range(n_images if not markers[IMAGE_PLACEHOLDER] else 0)]
    for piece in pieces:
        if piece in markers:
            content.append({"type": "image" if piece == IMAGE_PLACEHOLDER else "video"})
        elif piece.strip():
            content.append({"type": "text", "text": piece.strip()})
    return content


def to_prompt(row: dict, *, images_column: bool | None = None) -> dict:
    """A canonical row -> TRL conversational row: `prompt` (one user turn: images, then text), the image(s), scoring.

    Args:
        row: a canonical row.
        images_column: put the images in an `images` list (TRL's multi-image column) rather than `image`; by default
            only when the row has more than one image.

    >>> row = {"id": "1", "question": "How many?", "image": None, "answer": "3"}
    >>> [p["type"] for p in to_prompt(row)["prompt"][0]["content"]]
    ['text']
    """
    images, video = row_images(row), row_video(row)
    turns = [{"role": "user", "content": prompt_content(question_text(row), len(images), video=video is not None)}]
    if row.get("system_prompt"):
        turns.insert(0, {"role": "system", "content": [{"type": "text", "text": row["system_prompt"]}]})
    out = {"id": row["id"], "prompt": turns}
    if images_column if images_column is not None else len(images) > 1:
        out["images"] = images
    else:
        out["image"] = images[0] if images else None
    if video is not None:
        out["video"], out["video_metadata"] = video
    if isinstance(row.get("metadata"), dict):
        out["metadata"] = row["metadata"]  # the item's task/skills: eval records keep it for the breakdown
    return {**out, **{k: row.get(k) for k in SCORING_COLUMNS}}


def to_dataset(rows):
    """Canonical rows (a list or a `datasets.Dataset`) -> a `datasets.Dataset` of TRL prompt rows."""
    import datasets

    if isinstance(rows, datasets.Dataset):
        multi = "images" in rows.column_names
        raw = undecoded(rows)  # images pass through undecoded: no decode/re-encode per row
        kept = ("id", "image", "images", "video", "video_metadata", "metadata", *SCORING_COLUMNS)
        drop = [c for c in raw.column_names if c not in kept]
        prompts = raw.map(lambda row: {k: v for k, v in to_prompt(row, images_column=multi).items()
                                       if k not in ("image", "images", "video", "video_metadata")},
                          remove_columns=drop, desc="building prompts")
        if multi and "image" in prompts.column_names:
            prompts = prompts.remove_columns("image")
        for name, feature in rows.features.items():
            if name in prompts.column_names and name in ("image", "images", "video"):
                prompts = prompts.cast_column(name, feature)
        return prompts
    multi = any(len(row_images(r)) > 1 for r in rows)
    prompts = [to_prompt(r, images_column=multi) for r in rows]
    metadata = [p.pop("metadata", {}) for p in prompts]
    dataset = datasets.Dataset.from_list(prompts)
    if any(metadata):  # one JSON column: items of different tasks carry different keys
        dataset = dataset.add_column("metadata", [json.dumps(m) for m in metadata], feature=datasets.Json())
    return dataset


def render_prompt(row: dict, processor=None) -> str:
    """The prompt text the model sees for a TRL row, through the processor's chat template (Qwen3-VL's without one).

    >>> row = to_prompt({"id": "1", "question": "How many?", "image": object(), "answer": "3"})
    >>> print(render_prompt(row).splitlines()[1][:48])
    <|vision_start|><|image_pad|><|vision_end|>How m
    """
    if processor is not None:
        return processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    import jinja2

    return jinja2.Environment().from_string(CHAT_TEMPLATE).render(messages=row["prompt"], add_generation_prompt=True)


def batch_inputs(processor, texts: list[str], images: list, *, padding_side: str, videos: list | None = None):
    """The processor's tensors for a batch of rendered contexts and their pictures (in placeholder order), padded on
    `padding_side`: "left" to decode (new tokens append on the right), "right" for a training forward. Named per
    call, so no caller changes the shared tokenizer's own setting for the next one. `videos`: the contexts' videos in
    order, each (frames, metadata) as `row_video` gives it, through the processor's own video path
    (`video_kwargs`).
    """
    return processor(text=texts, images=images or None, return_tensors="pt", padding=True, padding_side=padding_side,
                     **video_kwargs(videos))


def video_kwargs(videos: list | None) -> dict:
    """What the processor's video path takes for `videos` ((frames, metadata) pairs, frames decoded or not): the
    frames, their `VideoMetadata` (Qwen3-VL's processor writes each frame's timestamp from its `fps` and
    `frames_indices`) and `do_sample_frames=False`: vlrl sampled them already (`[data] video_fps`, `max_frames`).

    >>> video_kwargs(None)
    {}
    """
    if not videos:
        return {}
    from transformers.video_utils import VideoMetadata

    frames = [[load_image(frame) for frame in clip] for clip, _ in videos]
    metadata = [VideoMetadata(total_num_frames=int(meta.get("total_num_frames") or len(clip)),
                              fps=float(meta.get("fps") or 1.0), duration=meta.get("duration"),
                              frames_indices=list(meta.get("frames_indices") or range(len(clip))))
                for clip, (_, meta) in zip(frames, videos)]
    return {"videos": frames, "video_metadata": metadata, "do_sample_frames": False}
