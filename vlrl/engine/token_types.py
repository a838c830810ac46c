"""The engine's token types: a context as the model takes it, token ids with its images' tensors (`Tokenized`), whether
one context extends another (`extends`), and a batch of them as the model's input tensors (`token_batch`). An episode's
turns (`vlrl.episodes.tokens`) are made of them, and the engine's session (`vlrl.engine.session`) keeps a slot's cache
while its contexts extend.
"""

from __future__ import annotations

from dataclasses import dataclass


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
