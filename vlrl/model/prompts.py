"""Prompts: a canonical row -> the conversation the model sees, and its length in tokens, image tokens included.

`to_prompt()` turns a row into TRL's conversational form (one user turn: the image(s), the question, its choices
and the answer instruction of `vlrl.grammar.answers.FORMAT`) plus the scoring columns, which GRPOTrainer passes on to the
reward functions as keyword arguments. `render_prompt()` shows it through the chat template, `LengthMeter` and
`filter_by_length()` measure it with the processor and drop (never cut) prompts that are too long.

    >>> row = to_prompt({"id": "1", "question": "How many?", "image": object(), "answer": "3"})
    >>> [part["type"] for part in row["prompt"][0]["content"]]
    ['image', 'text']
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

from vlrl.base.images import load_image, undecoded
from vlrl.grammar import answers, rewards

SCORING_COLUMNS = ("answer", *rewards.META_COLUMNS)  # what GRPOTrainer passes on to the rewards
IMAGE_PLACEHOLDER = "<image>"

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
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
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


def prompt_content(text: str, n_images: int) -> list[dict]:
    """Text with `<image>` placeholders -> content parts, images in place (or first when there is no placeholder).

    >>> [p["type"] for p in prompt_content("Look: <image> and <image>. Sum?", 2)]
    ['text', 'image', 'text', 'image', 'text']
    """
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) == 1:
        return [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    if len(pieces) - 1 != n_images:
        from vlrl.base.errors import DataError

        raise DataError(f"the prompt has {len(pieces) - 1} {IMAGE_PLACEHOLDER} placeholders for {n_images} images; "
                        "give one placeholder per image, or none (images then come first).")
    content = []
    for i, piece in enumerate(pieces):
        if i:
            content.append({"type": "image"})
        if piece.strip():
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
    images = row_images(row)
    turns = [{"role": "user", "content": prompt_content(question_text(row), len(images))}]
    if row.get("system_prompt"):
        turns.insert(0, {"role": "system", "content": [{"type": "text", "text": row["system_prompt"]}]})
    out = {"id": row["id"], "prompt": turns}
    if images_column if images_column is not None else len(images) > 1:
        out["images"] = images
    else:
        out["image"] = images[0] if images else None
    if isinstance(row.get("metadata"), dict):
        out["metadata"] = row["metadata"]  # the item's task/skills: eval records keep it for the breakdown
    return {**out, **{k: row.get(k) for k in SCORING_COLUMNS}}


def to_dataset(rows):
    """Canonical rows (a list or a `datasets.Dataset`) -> a `datasets.Dataset` of TRL prompt rows."""
    import datasets

    if isinstance(rows, datasets.Dataset):
        multi = "images" in rows.column_names
        raw = undecoded(rows)  # images pass through undecoded: no decode/re-encode per row
        drop = [c for c in raw.column_names if c not in ("id", "image", "images", "metadata", *SCORING_COLUMNS)]
        prompts = raw.map(lambda row: {k: v for k, v in to_prompt(row, images_column=multi).items()
                                       if k not in ("image", "images")},
                          remove_columns=drop, desc="building prompts")
        if multi and "image" in prompts.column_names:
            prompts = prompts.remove_columns("image")
        for name, feature in rows.features.items():
            if name in prompts.column_names and name in ("image", "images"):
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


def prompt_tokens(processor, row: dict) -> int:
    """The prompt's length in tokens as the model sees it, image tokens included (the processor expands them)."""
    text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    images = row_images(row)
    inputs = processor(text=[text], images=images or None, return_tensors="pt")
    return int(inputs["input_ids"].shape[1])


def batch_inputs(processor, texts: list[str], images: list, *, padding_side: str):
    """The processor's tensors for a batch of rendered contexts and their pictures (in placeholder order), padded on
    `padding_side`: "left" to decode (new tokens append on the right), "right" for a training forward. Named per
    call, so no caller changes the shared tokenizer's own setting for the next one.
    """
    return processor(text=texts, images=images or None, return_tensors="pt", padding=True, padding_side=padding_side)


@dataclass
class Tokenized:
    """A context as the model takes it: its token ids (each image expanded into its image tokens) and its images'
    tensors as the processor makes them (`pixel_values` rows and one `image_grid_thw` row per image), kept in the
    pieces they were made in: an episode's next context shares its earlier pieces instead of copying them (16 turns
    of a Crafter episode would otherwise hold 136 images' rows, 200 MB, where the episode has 16)."""

    ids: list[int]
    pixels: tuple = ()  # `pixel_values` rows, piece by piece
    grids: tuple = ()  # `image_grid_thw` rows, piece by piece
    type_ids: bool = True  # the processor also returns `mm_token_type_ids` (Qwen3-VL, Qwen3.5)

    @property
    def pixel_values(self):
        import torch

        return torch.cat(self.pixels) if self.pixels else None

    @property
    def image_grid_thw(self):
        import torch

        return torch.cat(self.grids) if self.grids else None


def extends(earlier: Tokenized, reply, context: Tokenized, *, same_pictures: bool = False) -> bool:
    """Whether `context` starts with the `earlier` context and its `reply`, token for token, and its pictures' tensors
    start with the earlier context's: equal ones, or with `same_pictures` the very same `pixel_values` pieces (as an
    episode's contexts share them from turn to turn: no values compared); the grids equal either way.

    >>> a = Tokenized([1, 2]); extends(a, [3], Tokenized([1, 2, 3, 4])), extends(a, [3], Tokenized([1, 2, 5, 4]))
    (True, False)
    """
    import torch

    n = len(earlier.ids)
    if context.ids[:n + len(reply)] != earlier.ids + list(reply) or len(context.pixels) < len(earlier.pixels):
        return False
    same = (lambda a, b: a is b) if same_pictures else (lambda a, b: a is b or torch.equal(a, b))
    return (all(same(a, b) for a, b in zip(earlier.pixels, context.pixels))
            and all(a is b or torch.equal(a, b) for a, b in zip(earlier.grids, context.grids)))


def token_batch(processor, contexts: list[Tokenized], *, padding_side: str) -> dict:
    """The tensors `batch_inputs` would give for contexts already tokenized: ids and attention mask padded on
    `padding_side`, `mm_token_type_ids` (1 on image tokens, 2 on video tokens), the images' tensors concatenated in
    row order."""
    import torch

    tokenizer = getattr(processor, "tokenizer", processor)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(c.ids) for c in contexts)
    ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for row, context in enumerate(contexts):
        span = slice(width - len(context.ids), width) if padding_side == "left" else slice(0, len(context.ids))
        ids[row, span] = torch.tensor(context.ids, dtype=torch.long)
        mask[row, span] = 1
    out = {"input_ids": ids, "attention_mask": mask}
    if all(c.type_ids for c in contexts):
        types = torch.zeros_like(ids)
        for name, kind in (("image_token_id", 1), ("video_token_id", 2)):
            token = getattr(processor, name, None)
            if token is not None:
                types[(ids == token) & (mask == 1)] = kind
        out["mm_token_type_ids"] = types
    if any(c.pixels for c in contexts):
        out["pixel_values"] = torch.cat([piece for c in contexts for piece in c.pixels])
        out["image_grid_thw"] = torch.cat([piece for c in contexts for piece in c.grids])
    from transformers import BatchFeature

    return BatchFeature(out)


LENGTH_COLUMN = "prompt_tokens"  # each prompt's measured length, set by filter_by_length


class LengthMeter:
    """`prompt_tokens`, fast: the processor runs on the first two prompts with each image size; after that a prompt
    costs one tokenizer call plus the image tokens learned for its sizes.

    A processor changes the text only by expanding each image placeholder into that image's tokens, and an image's
    token count depends on its size alone (for Qwen3-VL: its patch grid). The second measurement per size checks that
    this holds for the processor at hand; if it ever does not, every prompt is measured with the processor.
    """

    def __init__(self, processor):
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.image_tokens: dict[tuple, int] = {}  # image size -> tokens it adds beyond its placeholder
        self.checked: set[tuple] = set()
        self.exact_only = False

    def __call__(self, row: dict) -> int:
        """The prompt length of a TRL row; its images may be PIL images or undecoded `{"bytes", "path"}` values."""
        text = render_prompt(row, self.processor)
        sizes = [_image_size(image) for image in row_images(row)]
        if self.exact_only or any(size not in self.checked for size in sizes):
            return self._measure(row, text, sizes)
        return len(self.tokenizer(text)["input_ids"]) + sum(self.image_tokens[s] for s in sizes)

    def _measure(self, row: dict, text: str, sizes: list) -> int:
        decoded = row_images(row, decode=True)
        exact = prompt_tokens(self.processor, {"prompt": row["prompt"], "images": decoded})
        if self.exact_only:
            return exact
        unknown = {s for s in sizes if s not in self.image_tokens}
        base = len(self.tokenizer(text)["input_ids"])
        if len(unknown) == 1 and sizes.count(next(iter(unknown))) == 1:
            size = unknown.pop()
            self.image_tokens[size] = exact - base - sum(self.image_tokens[s] for s in sizes if s != size)
        elif not unknown:  # a second look at known sizes: does the shortcut give the processor's count?
            if base + sum(self.image_tokens[s] for s in sizes) == exact:
                self.checked.update(sizes)
            else:
                self.exact_only = True
        return exact


def _image_size(image) -> tuple:
    """An image's (width, height); for an undecoded value, from its header alone (no pixels are decoded)."""
    if hasattr(image, "size"):
        return tuple(image.size)
    from PIL import Image

    if isinstance(image, dict) and image.get("bytes"):
        with Image.open(io.BytesIO(image["bytes"])) as opened:
            return opened.size
    return load_image(image).size


def filter_by_length(dataset, processor, max_prompt_tokens: int, *, report=None,
                     part: str = "train"):
    """Drops prompts longer than `max_prompt_tokens`, measured with the processor (image tokens included).

    TRL 1.x has no `max_prompt_length`, and truncating a multimodal prompt cuts through image tokens ("Image
    features and image tokens do not match"), so over-long prompts are dropped whole and counted, never cut.

    Args:
        dataset: TRL prompt rows (`to_dataset`).
        processor: the model's processor.
        max_prompt_tokens: the longest prompt kept.
        report: a `vlrl.data.DataReport` to count the drops in, under `part`.
        part: "train", "eval", ...

    Returns:
        (kept dataset, number dropped). A `datasets.Dataset` comes back with a `prompt_tokens` column: each kept
        prompt's measured length.
    """
    meter = LengthMeter(processor)
    keep, lengths = [], []
    rows = undecoded(dataset) if hasattr(dataset, "features") else dataset  # sizes come from headers: no decoding
    for index, row in enumerate(rows):
        length = meter(row)
        if length <= max_prompt_tokens:
            keep.append(index)
            lengths.append(length)
        elif report is not None:
            report.skip("too_long", row["id"], f"{length} prompt tokens > {max_prompt_tokens}")
    dropped = len(dataset) - len(keep)
    if report is not None:
        report.max_prompt_tokens = max_prompt_tokens
        report.too_long[part] = report.too_long.get(part, 0) + dropped
    kept = dataset if not dropped else dataset.select(keep)
    if hasattr(kept, "add_column"):
        if LENGTH_COLUMN in kept.column_names:  # filtered again: this measurement replaces the last
            kept = kept.remove_columns(LENGTH_COLUMN)
        kept = kept.add_column(LENGTH_COLUMN, lengths)
    return kept, dropped


def longest_prompt(dataset) -> int | None:
    """The longest prompt of a length-filtered dataset, in tokens (None before `filter_by_length`)."""
    if LENGTH_COLUMN not in getattr(dataset, "column_names", ()) or not len(dataset):
        return None
    return max(dataset[LENGTH_COLUMN])


def vision_token_ids(processor) -> list[int]:
    """The ids of `VISION_TOKENS` in the processor's vocabulary, which every rollout and eval suppresses
    (`suppress_tokens`). A reply holding an image placeholder breaks the next forward over prompt + reply: the model
    counts one more image token than the pictures give ("Image features and image tokens do not match", a GSPO step
    at the 8B shape on an H200, where random weights sampled one), and no answer needs one."""
    tokenizer = getattr(processor, "tokenizer", processor)
    unknown = tokenizer.unk_token_id
    ids = (tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS)
    return sorted({i for i in ids if isinstance(i, int) and i >= 0 and i != unknown})


MASKED_LOGIT = -1e4  # far below any real logit, yet finite: entropies (p log p) stay 0 for a masked token, not NaN


def mask_tokens(logits, ids: list[int]):
    """`logits` with the tokens `ids` masked out (out of place): the training forward's distribution over the
    vocabulary rollouts sample from, which suppresses `vision_token_ids`, so the loss and the importance ratios score
    the policy that generated.

    >>> import torch
    >>> mask_tokens(torch.zeros(1, 4), [1, 3]).softmax(-1).tolist()
    [[0.5, 0.0, 0.5, 0.0]]
    """
    if not ids:
        return logits
    import torch

    return logits.index_fill(-1, torch.tensor(ids, device=logits.device), MASKED_LOGIT)
