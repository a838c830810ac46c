"""Multi-turn rollouts: episodes played by the model against an environment, batched across episodes, with the
image caps, the context measured with its image tokens, and every abnormal end counted.

    episodes = play(policy, processor, lambda: make("grid"), seeds=[0, 0, 1, 1], settings=Settings(max_turns=8))
    summary(episodes)   # {"episodes": 4, "success_rate": ..., "invalid_actions": ..., "truncated": ..., ...}

Each turn the active episodes' contexts (OpenAI-schema messages, capped: `vlrl.episodes.context`) are rendered
with the chat template and their images, measured by the processor (image tokens included), and decoded in one
`generate` call (on a CUDA GPU with `fast_generation`, with a static KV cache of a few bucketed lengths and compiled
decoding, as single-turn rollouts: `cache_length`). An episode ends:
- `done`: the environment said so (its `metrics()["success"]` says whether it succeeded);
- `max_turns`: the run's turn cap was reached first;
- `truncated`: its next turn (context + the reply budget) would not fit `max_seq_length`: the episode stops there,
  counted, and no context is ever cut through its image tokens;
- `failed`: the environment raised; the reason is kept, the episode ends, the other episodes go on.
A reply that names no valid action is an invalid action: the environment says so (`info["invalid"]`), it is
counted, and the episode goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vlrl.episodes.context import (
    Settings,
    assistant_message,
    cap_context,
    observation_message,
    opening,
    prompt_text,
)
from vlrl.model import backend_of, compiled_decoding
from vlrl.prompts import vision_token_ids

ENDINGS = ("done", "max_turns", "truncated", "failed")


@dataclass
class Episode:
    """One episode: its full conversation (every image, OpenAI schema), the observations as the environment gave
    them (`frames`, reset's first), one dict per turn and the token ids of each reply as generated (what training
    scores), how it ended and what was dropped on the way."""

    seed: int
    messages: list = field(default_factory=list)
    frames: list = field(default_factory=list)
    turns: list = field(default_factory=list)
    reply_ids: list = field(default_factory=list)
    status: str = "running"
    failure: str | None = None
    success: bool = False
    metrics: dict = field(default_factory=dict)
    dropped_per_message: int = 0
    dropped_from_context: int = 0

    @property
    def ended(self) -> bool:
        return self.status != "running"

    @property
    def total_return(self) -> float:
        return float(sum(t["reward"] for t in self.turns))

    def context(self, max_images: int) -> list[dict]:
        """The messages the model sees now: the conversation with the in-context image cap applied."""
        capped, dropped = cap_context(self.messages, max_images=max_images)
        self.dropped_from_context = max(self.dropped_from_context, dropped)  # a dropped image stays dropped
        return capped


def settings_for(config, when: str) -> Settings:
    """A run's `Settings` for "train" (sampled at [training] temperature, [training] max_completion_length per
    reply) or "eval" ([env] eval_temperature, [eval] max_new_tokens)."""
    v = config.env
    train = when == "train"
    return Settings(max_turns=v.max_turns,
                    max_new_tokens=config.training.max_completion_length if train else config.eval.max_new_tokens,
                    max_seq_length=config.model.max_seq_length,
                    temperature=config.training.temperature if train else v.eval_temperature,
                    max_images_per_message=v.max_images_per_message, max_images_in_context=v.max_images_in_context,
                    image_size=v.image_size, text=v.text, fast_generation=config.training.fast_generation)


def play(model, processor, make_env, seeds, settings: Settings, *, batch_size: int = 0, log=None) -> list[Episode]:
    """Plays one episode per seed (a seed listed twice is played twice: a GSPO group) and returns them in order.

    Args:
        model: the policy (PEFT-wrapped or not).
        processor: its processor.
        make_env: a callable returning a fresh environment (`vlrl.envs.Env`); each episode gets its own, closed at
            its end.
        seeds: the episodes' seeds.
        settings: `Settings`.
        batch_size: episodes decoded together (0: all of them).
        log: optional callable for a one-line summary.
    """
    started = time.time()
    episodes = []
    size = batch_size or len(seeds) or 1
    for start in range(0, len(seeds), size):
        episodes += _play_batch(model, processor, make_env, list(seeds[start:start + size]), settings)
    if log is not None and episodes:
        s = summary(episodes)
        log(f"episodes: {s['episodes']} in {time.time() - started:.1f} s; success {s['success_rate']:.0%}, mean "
            f"return {s['return_mean']:.2f}, {s['invalid_actions']} invalid actions, {s['truncated']} truncated, "
            f"{s['failed']} failed, {s['dropped_images']} images dropped")
    return episodes


def summary(episodes: list[Episode]) -> dict:
    """Counts and means over episodes: what a training step logs and an eval reports."""
    n = max(1, len(episodes))
    return {"episodes": len(episodes),
            "success_rate": sum(e.success for e in episodes) / n,
            "return_mean": sum(e.total_return for e in episodes) / n,
            "length_mean": sum(len(e.turns) for e in episodes) / n,
            "invalid_actions": sum(t["invalid"] for e in episodes for t in e.turns),
            **{ending: sum(e.status == ending for e in episodes) for ending in ENDINGS[1:]},
            "dropped_images": sum(e.dropped_per_message + e.dropped_from_context for e in episodes),
            "failures": sorted({e.failure for e in episodes if e.failure})[:3]}


# --- one batch of episodes -----------------------------------------------------------------------------------------

def _play_batch(model, processor, make_env, seeds, settings: Settings) -> list[Episode]:
    episodes = [Episode(seed=int(seed)) for seed in seeds]
    envs = [None] * len(seeds)
    for i, episode in enumerate(episodes):
        try:
            envs[i] = make_env()
            observation = envs[i].reset(episode.seed)
            messages, dropped = opening(envs[i].describe(), observation, settings)
        except Exception as err:  # noqa: BLE001 - an environment that raises fails its episode, never the run
            _end(episode, envs[i], "failed", failure=_reason(err, "reset"))
            continue
        episode.messages, episode.dropped_per_message = messages, dropped
        episode.frames.append(observation.image)
    try:
        while active := [i for i, e in enumerate(episodes) if not e.ended]:
            texts, images, lengths = [], [], []
            for i in active:
                text, ims = prompt_text(processor, episodes[i].context(settings.max_images_in_context))
                texts.append(text)
                images.append(ims)
            lengths = measure(processor, texts, images)
            fits = []
            for i, n in zip(active, lengths):
                if n + settings.max_new_tokens > settings.max_seq_length:
                    _end(episodes[i], envs[i], "truncated")  # never cut: the episode stops before the overflow
                else:
                    fits.append(i)
            if not fits:
                continue
            keep = [active.index(i) for i in fits]
            replies = generate(model, processor, [texts[k] for k in keep], [images[k] for k in keep],
                               max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                               cache_length=cache_length(model, [lengths[k] for k in keep], settings))
            for i, k, (reply, ids) in zip(fits, keep, replies):
                _take_turn(episodes[i], envs[i], reply, ids, lengths[k], settings)
    finally:
        for episode, env in zip(episodes, envs):
            if not episode.ended:  # an interrupt: close what is open, keep nothing half-played
                _end(episode, env, "failed", failure="interrupted")
    return episodes


def _take_turn(episode: Episode, env, reply: str, ids: list[int], context_tokens: int, settings: Settings) -> None:
    episode.reply_ids.append(ids)
    episode.messages.append(assistant_message(reply))
    turn = {"reply": reply, "actions": [], "reward": 0.0, "invalid": False, "problem": None,
            "context_tokens": int(context_tokens), "reply_tokens": len(ids)}
    episode.turns.append(turn)
    try:
        step = env.step(reply)
    except Exception as err:  # noqa: BLE001 - as at reset: the episode fails, counted, with its reason
        _end(episode, env, "failed", failure=_reason(err, f"step {len(episode.turns)}"))
        return
    info = step.info or {}
    turn.update(actions=list(info.get("actions", [])), reward=float(step.reward), invalid=bool(info.get("invalid")),
                problem=info.get("problem"))
    episode.frames.append(step.observation.image)
    if step.done or len(episode.turns) >= settings.max_turns:
        _end(episode, env, "done" if step.done else "max_turns")
        return
    message, dropped = observation_message(step.observation, settings)
    episode.messages.append(message)
    episode.dropped_per_message += dropped


def _end(episode: Episode, env, status: str, *, failure: str | None = None) -> None:
    episode.status, episode.failure = status, failure
    if env is not None:
        try:
            if status != "failed" or failure == "interrupted":
                episode.metrics = _jsonable(env.metrics())
                episode.success = bool(episode.metrics.get("success"))
        except Exception as err:  # noqa: BLE001
            episode.status, episode.failure = "failed", _reason(err, "metrics")
        try:
            env.close()
        except Exception:  # noqa: BLE001, S110 - closing a broken environment must not fail the others
            pass


def _reason(err: Exception, where: str) -> str:
    return f"{where}: {type(err).__name__}: {str(err)[:200]}"


def _jsonable(metrics: dict) -> dict:
    out = {}
    for key, value in (metrics or {}).items():
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            out[key] = list(value)
    return out


# --- the model -------------------------------------------------------------------------------------------------------

def measure(processor, texts: list[str], images: list[list]) -> list[int]:
    """Each context's length in tokens as the model receives it: the processor expands every image into its
    image tokens, so a context is measured with them."""
    return [len(processor(text=[text], images=ims or None)["input_ids"][0]) for text, ims in zip(texts, images)]


def stop_ids(model, tokenizer) -> list[int]:
    """The token ids that end a reply: <|im_end|>, the tokenizer's end-of-sequence and the model's configured ones."""
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos |= set(configured if isinstance(configured, list) else [configured])
    return sorted(t for t in eos if isinstance(t, int) and t >= 0)


CACHE_BUCKET = 2048  # static KV cache lengths are multiples of this: a few compiled shapes over a whole episode


def cache_length(model, lengths: list[int], settings: Settings) -> int:
    """The static KV cache length for one turn's decoding: the longest context plus the reply budget, rounded up to
    a multiple of `CACHE_BUCKET` (never past `max_seq_length`), so that a 16-turn episode whose context grows each
    turn compiles a few decoding graphs rather than one per turn; 0 (a dynamic cache, eager decoding) without
    `fast_generation` or on the Unsloth backend, which has its own fast path.

    Eager decoding of a batch of episodes is bound by per-token overhead, not by the GPU: each token launches
    hundreds of small kernels from Python (`vlrl.model.compiled_decoding`).

    >>> from vlrl.episodes.context import Settings
    >>> cache_length(None, [1500, 2900], Settings(max_new_tokens=256, max_seq_length=16384, fast_generation=True))
    4096
    >>> cache_length(None, [15000], Settings(max_new_tokens=256, max_seq_length=16000, fast_generation=True))
    16000
    """
    if not settings.fast_generation or not lengths or (model is not None and backend_of(model) == "unsloth"):
        return 0
    needed = max(lengths) + settings.max_new_tokens
    return min(-(-needed // CACHE_BUCKET) * CACHE_BUCKET, max(settings.max_seq_length, needed))


def generate(model, processor, texts: list[str], images: list[list], *, max_new_tokens: int,
             temperature: float, cache_length: int = 0) -> list[tuple[str, list[int]]]:
    """One reply per context, decoded together (left padding): (text, its token ids as generated, the stop token
    included when the reply ended before `max_new_tokens`). With `cache_length` on a CUDA GPU, a static KV cache of
    that many tokens and compiled decoding (`vlrl.model.compiled_decoding`); otherwise a dynamic cache, eager."""
    import torch

    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"  # generation continues on the right: every context ends at the same column
    eos = stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    flat = [im for ims in images for im in ims]
    device = next(model.parameters()).device
    inputs = processor(text=texts, images=flat or None, return_tensors="pt", padding=True).to(device)
    # sampled decoding as greedy decoding of one inverse-CDF draw per row (`Sample`): the same distribution as
    # do_sample's torch.multinomial, which over a 151k vocabulary on CPU took more than half of a grid rollout
    sampling = {"logits_processor": [Sample(temperature)]} if temperature > 0 else {}
    fast = compiled_decoding(model, cache_length)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, top_p=None, top_k=None, eos_token_id=eos,
                                 pad_token_id=pad, do_sample=False, suppress_tokens=vision_token_ids(processor),
                                 **sampling, **fast)
    finally:
        model.train(was_training)
    replies = []
    for tokens in out[:, inputs["input_ids"].shape[1]:].tolist():
        end = next((j for j, t in enumerate(tokens) if t in eos), None)
        text = tokenizer.decode(tokens[:end], skip_special_tokens=True)
        replies.append((text, tokens[:end + 1] if end is not None else tokens))  # the stop token is trained too
    return replies



class Sample:
    """A logits processor that makes greedy decoding sample at `temperature`: one uniform draw per row, inverted
    through the cumulative softmax(logits / T), becomes the only finite score, so argmax takes it. The same
    distribution as torch.multinomial (in float64 over blocks of the vocabulary, then within the chosen block) at
    a sixth of its CPU cost, drawn from torch's global generator, so a seeded run draws the same replies.

    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> scores = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [0.0] * 3000])).repeat(20000, 1)
    >>> counts = torch.bincount(Sample(1.0)(None, scores).argmax(dim=1), minlength=3) / 20000
    >>> [round(x, 1) for x in counts.tolist()]
    [0.7, 0.2, 0.1]
    """

    BLOCK = 1024

    def __init__(self, temperature: float):
        self.temperature = temperature

    def __call__(self, input_ids, scores):
        import torch

        rows, vocab = scores.shape
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        blocks = -(-vocab // self.BLOCK)
        probs = torch.nn.functional.pad(probs, (0, blocks * self.BLOCK - vocab)).view(rows, blocks, self.BLOCK)
        upto = probs.sum(dim=-1, dtype=torch.float64).cumsum(dim=-1)  # (rows, blocks)
        u = torch.rand(rows, 1, dtype=torch.float64, device=scores.device) * upto[:, -1:]
        block = torch.searchsorted(upto, u).clamp(max=blocks - 1)  # (rows, 1)
        before = torch.where(block > 0, upto.gather(1, (block - 1).clamp(min=0)), 0.0)
        inside = probs[torch.arange(rows, device=scores.device), block[:, 0]].double().cumsum(dim=-1) + before
        token = block * self.BLOCK + torch.searchsorted(inside, u).clamp(max=self.BLOCK - 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, token.clamp(max=vocab - 1), 0.0)
