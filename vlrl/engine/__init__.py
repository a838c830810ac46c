"""The decoding engine: the one place that turns a batch of contexts into completions, for training rollouts
(`vlrl.training.mismatch`'s trainer), episode turns (`vlrl.episodes.rollout`) and evals (`vlrl.evaluation.evaluate`) alike.

    decoding = engine.decoding_for(model, processor, max_new_tokens=256, temperature=1.0, static=True)
    for c in engine.complete(model, processor, texts, images, decoding):
        c.text, c.ids, c.finish_reason, c.logps

It owns: the stop tokens (`stop_ids`), the tokens never produced (image and video placeholders), the thinking
budget, the static KV cache sized to the batch's real contexts (`loop.cache_length`), compiled decoding on a GPU
(`loop`), the exact draw at a temperature and each drawn token's log-probability (`sampling`), the packed
decode-friendly weights of a 4-bit base (`weights`), and a batch of episodes' KV cache kept from turn to turn while
their contexts only grow (`session`: `complete_tokenized(..., session=Session(slots))`), and the token types an
episode's contexts are made of (`token_types`: `Tokenized`, `extends`, `token_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlrl.base import distributed
from vlrl.engine import token_types
from vlrl.engine.loop import Decoded, Decoding, cache_length, decode, static_on
from vlrl.engine.sampling import Budget
from vlrl.engine.session import Session
from vlrl.grammar import thinking
from vlrl.model import prompts, vision_tokens

__all__ = ["Budget", "Completion", "Decoded", "Decoding", "Session", "cache_length", "complete", "complete_tokenized",
           "decode", "decoder_of", "decoding_for", "stop_ids"]


@dataclass
class Completion:
    """One completion: its text (special tokens dropped, the stop token not written), its token ids (the stop token
    kept: it is trained too), why it ended, its context's length, and with recording, each token's log-prob."""

    text: str
    ids: list[int]
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    logps: list[float] | None = None

    @property
    def content_ids(self) -> list[int]:
        """The completion's own tokens: `ids` without the stop token that ended it (what an eval counts).

        >>> Completion("7", [22, 151645], "stop", 9).content_ids, Completion("7 7", [22, 22], "length", 9).content_ids
        ([22], [22, 22])
        """
        return self.ids[:-1] if self.finish_reason == "stop" else self.ids


def stop_ids(model, tokenizer) -> list[int]:
    """The token ids that end a completion: <|im_end|>, the tokenizer's end-of-sequence and the model's configured
    ones (Qwen3-VL's generation config adds <|endoftext|>)."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    ids = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(configured if isinstance(configured, list) else [configured])
    return sorted(t for t in ids if isinstance(t, int) and t >= 0 and t != tokenizer.unk_token_id)


def budget_of(processor, budget: int) -> Budget | None:
    """The thinking budget with the tokenizer's ids (`vlrl.grammar.thinking.budget_ids`), None for no budget."""
    return Budget(budget, *thinking.budget_ids(processor, budget)) if budget else None


def decoding_for(model, processor, *, max_new_tokens: int, temperature: float = 0.0, thinking_budget: int = 0,
                 static: bool = True, record_logps: bool = False) -> Decoding:
    """The `Decoding` of a model and processor: its stop tokens, the vision placeholders suppressed, its pad token,
    the thinking budget; `static` (a static KV cache and compiled decoding on a GPU) is off on the Unsloth backend:
    Unsloth compiles each decoder block itself, and with the engine's compiled decode beside it the first 8B step at
    256 tokens took 761 s against 256 s dynamic (bench/results/unsloth.md); under FSDP or ZeRO-3 the processes stop
    together (`Decoding.synced`)."""
    from vlrl.model.loading import backend_of

    stops = stop_ids(model, processor)
    tokenizer = getattr(processor, "tokenizer", processor)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    return Decoding(max_new_tokens=max_new_tokens, temperature=temperature, stop_ids=tuple(stops),
                    suppress_ids=tuple(vision_tokens.vision_token_ids(processor)), pad_id=pad,
                    budget=budget_of(processor, thinking_budget),
                    static=static and backend_of(model) != "unsloth", record_logps=record_logps,
                    synced=bool(distributed.sharded_launch()) and distributed.world_size() > 1)


def decoder_of(model, decoding: Decoding) -> str:
    """The path `decoding` takes on `model`, in words: the backend, the KV cache, compiled or eager, and the format
    of the base's weights when the engine repacked them (`weights.pack_for_decoding`), e.g. "transformers, static
    cache, compiled, int8 weights". Two decoders give the same records only up to floating-point noise, so eval
    records carry it and a resumed eval checks it (`vlrl.evaluation.evaluate`)."""
    from vlrl.engine.weights import PackedLinear
    from vlrl.model.loading import backend_of

    device = next(model.parameters()).device
    parts = [backend_of(model)]
    if static_on(device, decoding):
        parts += ["static cache", "compiled" if device.type == "cuda" else "eager"]
    else:
        parts += ["dynamic cache", "eager"]
    packed = {m.fmt for m in model.modules() if isinstance(m, PackedLinear)}
    return ", ".join(parts + [f"{fmt} weights" for fmt in sorted(packed)])


def complete(model, processor, texts: list[str], images: list[list], decoding: Decoding, *,
             draws: int = 1, videos: list | None = None) -> list[Completion]:
    """Completes each rendered context (`texts[i]` with its pictures `images[i]`, in placeholder order, and its
    video `videos[i]`, (frames, metadata) or None), `draws` times each: rows i*draws .. i*draws+draws-1 are context
    i's. Contexts are left-padded (decoding appends on the right) and decoded in one batch."""
    flat = [image for group in images for image in group]
    inputs = prompts.batch_inputs(processor, texts, flat, padding_side="left",
                                  videos=[v for v in videos or () if v is not None])
    return _complete(model, processor, inputs, decoding, draws)


def complete_tokenized(model, processor, contexts: list[token_types.Tokenized], decoding: Decoding, *,
                       session: Session | None = None) -> list[Completion]:
    """Completes contexts given as token ids with their images' tensors (`token_types.Tokenized`: an episode's turns,
    `vlrl.episodes.tokens`), left-padded and decoded in one batch.

    With a `Session` (one per batch of episodes), `contexts` are its slots' (None for an empty slot, whose
    completion is None too) and each slot's KV cache is kept for the next call, where its context only grows."""
    if session is None:
        return _complete(model, processor, token_types.token_batch(processor, contexts, padding_side="left"), decoding, 1)
    out = session.decode(model, processor, contexts, decoding)
    done = _completions(processor.tokenizer, out, decoding)
    return [c if context is not None else None for c, context in zip(done, contexts)]


def _complete(model, processor, inputs, decoding: Decoding, draws: int) -> list[Completion]:
    tokenizer = processor.tokenizer
    device = next(model.parameters()).device
    inputs = dict(inputs.to(device))
    if draws > 1:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        input_ids, rest = base._expand_inputs_for_generation(expand_size=draws, input_ids=inputs.pop("input_ids"),
                                                             **inputs)
        inputs = {"input_ids": input_ids, **rest}
    return _completions(tokenizer, decode(model, inputs, decoding), decoding)


def _completions(tokenizer, out: Decoded, decoding: Decoding) -> list[Completion]:
    stops = set(decoding.stop_ids)
    return [Completion(text=tokenizer.decode([t for t in ids if t not in stops], skip_special_tokens=True), ids=ids,
                       finish_reason=reason, prompt_tokens=int(n),
                       logps=out.logps[i] if out.logps is not None else None)
            for i, (ids, reason, n) in enumerate(zip(out.tokens, out.finish_reasons, out.prompt_tokens))]
