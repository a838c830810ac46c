"""An episode's conversation: its messages in the OpenAI multimodal schema, the two image caps, and the form the Qwen
processor takes.

Every turn's observation is a user message of a `text` part (the state summary) and `image_url` parts (data URLs),
as a task app or `vlrl serve-env` sends them; the model's replies are assistant messages. Two caps keep a context
bounded, each dropped image counted:

- `max_images_per_message`: a message keeps its first images (0: text only);
- `max_images_in_context`: the context keeps the newest images; an older one becomes the text "[earlier image]".
  With `image_drop_step` k > 1, once over the cap the oldest images go k at a time (the context keeps between
  cap - k + 1 and cap of them): between two drops each turn's context extends the previous turn's, which lets an
  episode's turns be scored in one forward (`vlrl.episodes.scoring`).

    message, dropped = user_message("You are at row 0.", [image], max_images=1)
    context, dropped = cap_context(messages, max_images=4)
    qwen_messages, images = to_processor(context)       # {"type": "image"} parts + the PIL images, in order
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vlrl.envs.base import from_data_url, to_data_url
from vlrl.grammar.answers import FORMAT

DROPPED = "[earlier image]"  # what an image dropped from the context becomes: the turn keeps its place
SYSTEM = "You act in a visual environment, one turn at a time: answer each observation with your next action."


@dataclass
class Settings:
    """How episodes are played: the turn cap, the reply budget and the context budget (tokens, images counted),
    the decoding temperature (0: greedy), the image caps, the observation size (0: as given), whether the
    environment's text summary is shown (False: image-only), whether a CUDA GPU decodes each turn with a static
    KV cache and compiled decoding (`fast_generation`: `vlrl.engine`) and whether each reply token's sampled log-prob
    is kept (`record_logps`: the rollout/training mismatch of a training rollout)."""

    max_turns: int = 8
    max_new_tokens: int = 40
    max_seq_length: int = 2048
    temperature: float = 1.0
    max_images_per_message: int = 1
    max_images_in_context: int = 4
    image_drop_step: int = 1  # images dropped at a time once a context holds more than max_images_in_context
    image_size: int = 0
    text: bool = True
    fast_generation: bool = False
    record_logps: bool = False  # keep each reply token's log-prob where it was sampled (training rollouts)


def opening(describe: str, observation, settings: Settings) -> tuple[list[dict], int]:
    """An episode's first messages from the environment's action description and its first observation, as
    `settings` shows observations. Returns (messages, images dropped)."""
    return first_message(describe, observation.text if settings.text else "",
                         [resize(observation.image, settings.image_size)], max_images=settings.max_images_per_message)


def observation_message(observation, settings: Settings) -> tuple[dict, int]:
    """A later observation as a user message, as `settings` shows observations. Returns (message, images dropped)."""
    return user_message(observation.text if settings.text else "", [resize(observation.image, settings.image_size)],
                        max_images=settings.max_images_per_message)


def first_message(describe: str, text: str, images, *, max_images: int) -> tuple[list[dict], int]:
    """The opening messages of an episode: the system turn, then the task (the environment's action description
    and the answer format) with the first observation. Returns (messages, images dropped by the per-message cap)."""
    task = f"{describe}\n{FORMAT.instruction}"
    user, dropped = user_message("\n".join(x for x in (task, text) if x), images, max_images=max_images)
    return [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]}, user], dropped


def user_message(text: str, images, *, max_images: int) -> tuple[dict, int]:
    """One observation as a user message in the OpenAI multimodal schema, keeping its first `max_images` images.
    Returns (message, images dropped).

    >>> from PIL import Image
    >>> message, dropped = user_message("hi", [Image.new("RGB", (4, 4))] * 2, max_images=1)
    >>> [p["type"] for p in message["content"]], dropped
    (['text', 'image_url'], 1)
    """
    images = [im for im in images if im is not None]
    kept = images[:max(0, max_images)]
    content = [{"type": "text", "text": text}] if text else []
    content += [{"type": "image_url", "image_url": {"url": to_data_url(im)}} for im in kept]
    return {"role": "user", "content": content}, len(images) - len(kept)


def assistant_message(reply: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": reply}]}


def count_images(messages) -> int:
    return sum(part.get("type") == "image_url" for m in messages for part in _parts(m))


def cap_context(messages, *, max_images: int, step: int = 1) -> tuple[list[dict], int]:
    """The context the model sees: `messages` with at most `max_images` images, each dropped one (the oldest first)
    replaced by the text DROPPED; over the cap, images go `step` at a time. Returns (context, images dropped).

    >>> from PIL import Image
    >>> turns = [user_message("t", [Image.new("RGB", (4, 4))], max_images=1)[0] for _ in range(5)]
    >>> context, dropped = cap_context(turns[:3], max_images=2)
    >>> [p["type"] for m in context for p in m["content"]], dropped
    (['text', 'text', 'text', 'image_url', 'text', 'image_url'], 1)
    >>> [cap_context(turns[:n], max_images=3, step=2)[1] for n in range(1, 6)]  # kept: 1, 2, 3, 2, 3
    [0, 0, 0, 2, 2]
    """
    count = count_images(messages)
    excess = count - max(0, max_images)
    if excess <= 0:
        return list(messages), 0
    excess = min(count, -(-excess // max(1, step)) * max(1, step))
    out, dropped = [], 0
    for message in messages:
        parts = []
        for part in _parts(message):
            if part.get("type") == "image_url" and dropped < excess:
                parts.append({"type": "text", "text": DROPPED})
                dropped += 1
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out, dropped


def to_processor(messages) -> tuple[list[dict], list]:
    """OpenAI-schema messages -> (messages with `{"type": "image"}` parts, the PIL images in order): what a Qwen-VL
    processor's chat template and image processor take.

    >>> from PIL import Image
    >>> msgs, images = to_processor([user_message("look", [Image.new("RGB", (4, 4))], max_images=1)[0]])
    >>> [p["type"] for p in msgs[0]["content"]], images[0].size
    (['text', 'image'], (4, 4))
    """
    out, images = [], []
    for message in messages:
        parts = []
        for part in _parts(message):
            if part.get("type") == "image_url":
                url = part["image_url"]["url"] if isinstance(part.get("image_url"), dict) else part["image_url"]
                images.append(_decode(url))
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": part.get("text", "")})
        out.append({"role": message["role"], "content": parts})
    return out, images


def prompt_text(processor, messages) -> tuple[str, list]:
    """The chat-template text that asks for the next assistant turn, and its images, for OpenAI-schema messages."""
    qwen, images = to_processor(messages)
    return processor.apply_chat_template(qwen, add_generation_prompt=True, tokenize=False), images


def resize(image, side: int):
    """An observation as the model sees it: `side` pixels square (nearest: pixel art stays sharp); 0 keeps it."""
    from PIL import Image

    if image is None or not side or image.size == (side, side):
        return image
    return image.convert("RGB").resize((side, side), Image.NEAREST)


@functools.lru_cache(maxsize=512)
def _decode(url: str):
    return from_data_url(url)  # contexts repeat an image every turn: decode each once


def _parts(message) -> list[dict]:
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
