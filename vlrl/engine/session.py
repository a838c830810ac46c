"""Decoding that keeps a batch's KV cache from one call to the next while each row's context only grows: an episode's
turns (`vlrl.episodes.rollout`).

Turn t+1's context is turn t's, its reply, and a few hundred new tokens (the end of the reply, the next observation,
the generation prompt: `vlrl.episodes.tokens`), yet a call of `loop.decode` prefills the whole of it again, up to
~7,500 tokens a row at the end of a Crafter episode. A `Session` holds one static cache for its rows (an episode's
slot in the batch), and a call in which every row's context extends what its slot holds prefills only the new tokens:

- a row's cached context must be a prefix of its new one, ids and pictures alike (the pictures' tensors are the same
  objects: `Tokenized` shares its pieces from turn to turn), and the reply tokens the last decode fed count
  as far as they agree with the new context (a reply that ended at `<|im_end|>` is followed by the template's own);
- the new tokens of every row are written at the same cache slots, right-aligned, after every slot used so far: the
  slots a row does not use (the rest of a shorter reply, the left padding of a shorter piece) are masked out, and
  each token's position ids are those of its whole context (`_prepare_position_ids_for_generation`: Qwen-VL's M-RoPE
  counts an image as its grid, not its tokens), so the model computes what a prefill of the whole context would;
- otherwise (an episode new to its slot, an image dropped, a cache that would outgrow the length a whole prefill
  needs) the call prefills every row anew into the same cache (`loop.prefill`).

Only for a static cache of full-attention layers whose masks the engine makes (`loop.masks_own`); a model with
linear-attention layers (Qwen3.5's Gated DeltaNet) carries a recurrent state that skipped slots would corrupt, so
its calls always prefill anew.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from vlrl.engine.loop import Decoded, Decoding, Prefilled, decode, masks_own, prefill, run, static_on
from vlrl.engine.token_types import Tokenized, extends, token_batch

# a session's cache length steps by this (`loop.cache_length`'s bucket, for contexts that grow every turn): each
# length is one compiled decoding graph, so an episode's growing context should meet few of them
SESSION_CACHE_BUCKET = 2048


class Session:
    """The KV cache of `rows` slots kept across `decode` calls, and what each slot's rows hold: the context it last
    took (`Tokenized`) and the tokens its decode fed after it."""

    def __init__(self, rows: int):
        self.rows = rows
        self.state: Prefilled | None = None
        self.taken: list[Tokenized | None] = [None] * rows
        self.fed: list[list[int]] = [[] for _ in range(rows)]
        self.reused = self.prefilled = 0  # context tokens read from the cache / computed, over the session
        self.prefill_s = self.decode_s = 0.0  # seconds of its prefills / its decoding steps (`loop.Marks`)
        self.decode_steps = 0

    def decode(self, model, processor, contexts: list[Tokenized | None], decoding: Decoding) -> Decoded:
        """Decodes `contexts` (one per slot, None for an empty slot), the cache's rows reused where they extend.
        Returns a `Decoded` of every slot's row (an empty slot's row is empty)."""
        if len(contexts) != self.rows or not any(c is not None for c in contexts):
            raise ValueError(f"a session of {self.rows} slots takes {self.rows} contexts, at least one of them")
        device = next(model.parameters()).device
        if not static_on(device, decoding):
            return self._counted(_live_only(model, processor, contexts, decoding, device))  # a dynamic cache: none kept
        decoding = replace(decoding, rows=self.rows, cache_bucket=SESSION_CACHE_BUCKET)
        kept, why = self._extension(contexts, decoding)
        if kept is None:
            inputs = dict(token_batch(processor, _filled(contexts, decoding.pad_id),
                                              padding_side="left").to(device))
            cache = None  # the same tensors if the length is (a CUDA graph's addresses); never two caches at once
            if self.state is not None and self.state.stats["cache_length"] == _length(contexts, decoding):
                cache = self.state.cache
            self._forget()

            def start(base):
                state = prefill(base, inputs, decoding, static=True, cache=cache)
                state.padding_rows = [r for r, c in enumerate(contexts) if c is None]
                state.stats.update(prefilled=sum(len(c.ids) for c in contexts if c is not None), whole=why)
                return state
        else:
            taken = [(len(t.ids), len(t.pixels)) if t is not None else (0, 0) for t in self.taken]
            start = lambda base: _extend(base, processor, self.state, contexts, kept, taken, decoding)
        decoded, state = run(model, decoding, start, rows=self.rows)
        if state.stats["cache_length"] and _reusable(model, state):
            self._keep(state, contexts)
        else:
            self._forget()
        return self._counted(decoded)

    def _counted(self, decoded: Decoded) -> Decoded:
        stats = decoded.stats
        self.reused += stats.get("reused", 0)
        self.prefilled += stats["prefilled"]
        self.prefill_s, self.decode_s = self.prefill_s + stats["prefill_s"], self.decode_s + stats["decode_s"]
        self.decode_steps += stats["steps"]
        return decoded

    def _extension(self, contexts, decoding: Decoding) -> tuple[list[int] | None, str]:
        """Each slot's count of cached tokens its new context starts with, if every row extends its slot's cache and
        the extended cache stays within the length a whole prefill would take (the cache is lengthened to it here,
        in place, when it is shorter); else None and why a whole prefill:
        "first" (nothing cached), "new context" (a slot's context does not extend its cache: a new episode, an
        image dropped) or "full" (skipped slots would take the cache past a whole prefill's length)."""
        state = self.state
        if state is None:
            return None, "first"
        kept = []
        for row, context in enumerate(contexts):
            taken = self.taken[row]
            if context is None:
                kept.append(0)
                continue
            if taken is None or not _extends(taken, context):
                return None, "new context"
            n = len(taken.ids)
            fed = self.fed[row]
            agree = next((i for i, (a, b) in enumerate(zip(fed, context.ids[n:])) if a != b),
                         min(len(fed), len(context.ids) - n))
            if n + agree >= len(context.ids) or set(fed[:agree]) & set(decoding.suppress_ids):
                return None, "new context"  # nothing new (no logits to start from), or a vision token out of place
            kept.append(n + agree)
        new = max(len(c.ids) - k for c, k in zip(contexts, kept) if c is not None)
        length = _length(contexts, decoding)
        if state.written + new + decoding.max_new_tokens > length:
            return None, "full"  # a whole prefill packs the rows again
        if length > state.stats["cache_length"]:
            _grow(state, length)
        return kept, ""

    def _keep(self, state: Prefilled, contexts) -> None:
        self.state = state
        fed = state.tokens[:, :state.steps - 1].tolist()
        for row, context in enumerate(contexts):
            self.taken[row] = context
            self.fed[row] = fed[row] if context is not None else []

    def _forget(self) -> None:
        self.state = None
        self.taken = [None] * self.rows
        self.fed = [[] for _ in range(self.rows)]


def _length(contexts, decoding: Decoding) -> int:
    """The cache length a whole prefill of `contexts` takes (`loop.prefill`'s)."""
    return decoding.cache_for(max(len(c.ids) for c in contexts if c is not None))


def _grow(state: Prefilled, length: int) -> None:
    """The cache of `state` lengthened to `length` slots in place, layer after layer (each layer's old tensors freed
    before the next's are made: at most one layer more is held), the new slots empty."""
    for layer in state.cache.layers:
        for name in ("keys", "values"):
            old = getattr(layer, name)
            grown = old.new_zeros(*old.shape[:2], length, old.shape[3])
            grown[:, :, :old.shape[2]] = old
            setattr(layer, name, grown)
            del old
            torch._dynamo.mark_static_address(grown)
        layer.max_cache_len = length
    extra = state.attend.new_ones(state.attend.shape[0], length - state.attend.shape[1])
    state.attend = torch.cat([state.attend, extra], dim=1)
    state.stats["cache_length"] = length


def _live_only(model, processor, contexts, decoding: Decoding, device) -> Decoded:
    """The slots' contexts decoded by `loop.decode` without the empty ones, each row back in its slot."""
    live = [r for r, c in enumerate(contexts) if c is not None]
    inputs = token_batch(processor, [contexts[r] for r in live], padding_side="left").to(device)
    out = decode(model, dict(inputs), replace(decoding, rows=0))
    rows = dict(zip(live, range(len(live))))
    pick = lambda values, empty: [values[rows[r]] if r in rows else empty for r in range(len(contexts))]
    return Decoded(tokens=pick(out.tokens, []), stopped=pick(out.stopped, True),
                   prompt_tokens=pick(out.prompt_tokens, 0), logps=pick(out.logps, []) if out.logps is not None else None,
                   stats=out.stats)


def _filled(contexts, pad: int) -> list[Tokenized]:
    """Every slot's context, an empty slot's a lone pad token (its row decodes nothing)."""
    type_ids = all(c.type_ids for c in contexts if c is not None)
    return [c if c is not None else Tokenized([pad], type_ids=type_ids) for c in contexts]


def _extends(taken: Tokenized, context: Tokenized) -> bool:
    """Whether `context` is longer than `taken` and starts with it: its ids, and its pictures the very same tensors."""
    return len(context.ids) > len(taken.ids) and extends(taken, [], context, same_pictures=True)


def _reusable(model, state: Prefilled) -> bool:
    """Whether a cache can be extended: every layer a full-attention static layer, masks made by the engine."""
    from transformers.cache_utils import StaticLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return masks_own(base) and all(type(layer) is StaticLayer for layer in state.cache.layers)


def _extend(base, processor, state: Prefilled, contexts, kept: list[int], taken: list[tuple[int, int]],
            decoding: Decoding) -> Prefilled:
    """The new tokens of every slot's context prefilled after the cache's used slots (see the module's docstring).
    `kept`: each slot's cached tokens its context starts with; `taken`: the ids and picture pieces of the context the
    slot last took."""
    device = state.logits.device
    rows, slots, used = len(contexts), state.attend.shape[1], state.written
    live = [r for r, c in enumerate(contexts) if c is not None]
    lengths = [len(c.ids) - k if c is not None else 0 for c, k in zip(contexts, kept)]
    new = max(lengths)
    attend = state.attend.clone()
    attend[:, state.start:] = False  # the last reply's slots: a row keeps those its new context agrees with
    for r in live:
        attend[r, state.start:state.start + kept[r] - taken[r][0]] = True
    # the whole contexts, for their position ids and the thinking budget's look back
    full = _filled(contexts, decoding.pad_id)
    batch = token_batch(processor, [Tokenized(c.ids, type_ids=c.type_ids) for c in full],
                                padding_side="left")
    found = {"attention_mask": batch["attention_mask"]}
    if "mm_token_type_ids" in batch:
        found["mm_token_type_ids"] = batch["mm_token_type_ids"]
    if any(c.grids for c in full):
        found["image_grid_thw"] = torch.cat([g for c in full for g in c.grids])
    positions = base._prepare_position_ids_for_generation(batch["input_ids"], found)
    width = batch["input_ids"].shape[1]
    ids = torch.full((rows, new), decoding.pad_id, dtype=torch.long)
    at = positions[..., -1:].expand(*positions.shape[:-1], new).clone()  # the pad slots' positions: any will do
    pixels, grids = [], []
    for r in live:
        own = lengths[r]
        ids[r, new - own:] = torch.tensor(contexts[r].ids[kept[r]:])
        at[..., r, new - own:] = positions[..., r, width - own:]
        pixels += contexts[r].pixels[taken[r][1]:]
        grids += contexts[r].grids[taken[r][1]:]
    slot = torch.arange(slots, device=device)
    suffix = slot[used:used + new]
    attend[:, used:] = False
    attend |= (slot[None, :] >= used + new - torch.tensor(lengths, device=device)[:, None]) & (slot < used + new)
    sees = (attend[:, None, :] & (slot[None, :] <= suffix[:, None])[None]) | (slot == suffix[:, None])[None]
    inputs = {"input_ids": ids.to(device), "attention_mask": sees[:, None], "position_ids": at.to(device),
              "past_key_values": state.cache, "use_cache": True, "logits_to_keep": 1}
    if pixels:
        inputs["pixel_values"] = torch.cat(pixels).to(device)
        inputs["image_grid_thw"] = torch.cat(grids).to(device)
    logits = base(**inputs, return_dict=True).logits[:, -1]  # eager, as a whole prefill
    attend[:, used + new:] = True  # the completion's slots
    return Prefilled(cache=state.cache, logits=logits, positions=at[..., -1:].to(device), attend=attend,
                     start=used + new, prompt_ids=batch["input_ids"].to(device),
                     prompt_tokens=[len(c.ids) if c is not None else 0 for c in contexts],
                     padding_rows=[r for r, c in enumerate(contexts) if c is None],
                     stats={"cache_length": state.stats["cache_length"], "prefilled": sum(lengths),
                            "reused": sum(kept)})
