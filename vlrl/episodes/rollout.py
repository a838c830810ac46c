"""Multi-turn rollouts: episodes played by the model against an environment, batched across episodes, with the
image caps, the context measured with its image tokens, and every abnormal end counted.

    episodes = play(policy, processor, lambda: make("grid"), seeds=[0, 0, 1, 1], settings=Settings(max_turns=8))
    summary(episodes)   # {"episodes": 4, "success_rate": ..., "invalid_actions": ..., "truncated": ..., ...}

Each turn the live episodes' contexts (OpenAI-schema messages, capped: `vlrl.episodes.context`) are rendered with the
chat template and their images into token ids, each earlier reply as the ids it was generated as
(`vlrl.episodes.tokens`), measured (image tokens included), and decoded together by the decoding engine (`vlrl.engine`;
on a CUDA GPU with `fast_generation`, a static KV cache in the session's steps (`vlrl.engine.session`) and compiled
decoding, the batch's rows kept as episodes end, so a whole episode compiles a few decoding graphs). At most `batch_size` episodes are
live at once: one that ends hands its slot to the next seed's episode, which joins the next turn's batch, so episodes of
unequal lengths keep the batch full. An episode ends:
- `done`: the environment said so (its `metrics()["success"]` says whether it succeeded);
- `max_turns`: the run's turn cap was reached first;
- `truncated`: its next turn (context + the reply budget) would not fit `max_seq_length`: the episode stops there,
  counted, and no context is ever cut through its image tokens;
- `failed`: the environment raised; the reason is kept, the episode ends, the other episodes go on.
A reply that names no valid action is an invalid action: the environment says so (`info["invalid"]`), it is
counted, and the episode goes on.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

from vlrl import engine
from vlrl.engine import token_types
from vlrl.episodes.context import Settings, assistant_message, cap_context, observation_message, opening
from vlrl.episodes.tokens import Contexts

ENDINGS = ("done", "max_turns", "truncated", "failed")


@dataclass
class Episode:
    """One episode: its full conversation (every image, OpenAI schema), the observations as the environment gave
    them (`frames`, reset's first), one dict per turn, each turn's context as the model took it (`contexts`:
    `token_types.Tokenized`) and the token ids of each reply as generated (what training scores; with
    `Settings.record_logps`, their sampled log-probs too), how it ended and what was dropped on the way."""

    seed: int
    messages: list = field(default_factory=list)
    frames: list = field(default_factory=list)
    turns: list = field(default_factory=list)
    contexts: list = field(default_factory=list)
    reply_ids: list = field(default_factory=list)
    reply_content: list = field(default_factory=list)  # each reply's ids without the stop token that ended it
    reply_logps: list = field(default_factory=list)
    status: str = "running"
    failure: str | None = None
    success: bool = False
    metrics: dict = field(default_factory=dict)
    dropped_per_message: int = 0
    dropped_from_context: int = 0
    _tokens: Contexts | None = field(default=None, repr=False)  # builds `contexts`, turn after turn

    @property
    def ended(self) -> bool:
        return self.status != "running"

    @property
    def total_return(self) -> float:
        return float(sum(t["reward"] for t in self.turns))

    def context(self, settings: Settings, processor) -> token_types.Tokenized:
        """The context the model sees now, as token ids: the conversation with the in-context image cap applied."""
        capped, dropped = cap_context(self.messages, max_images=settings.max_images_in_context,
                                      step=settings.image_drop_step)
        self.dropped_from_context = max(self.dropped_from_context, dropped)  # a dropped image stays dropped
        if self._tokens is None:
            self._tokens = Contexts(processor)
        return self._tokens.next(capped, self.reply_content, dropped)


def environment_for(config):
    """A callable that builds a fresh environment of the run's [env] (name or URL, with its options)."""
    from vlrl.envs import env_options, make

    return functools.partial(make, config.env.name, **env_options(config.env))


def seeds_for(config, part: str) -> list[int]:
    """The run's seeds of `part`: "eval" (the same before and after) or "train" (disjoint from them).

    >>> from vlrl import config
    >>> c = config.from_dict({"env": {"name": "grid", "eval_seeds": 3, "train_seeds": 2}})
    >>> seeds_for(c, "eval"), seeds_for(c, "train")
    ([0, 1, 2], [1000000, 1000001])
    """
    from vlrl.config.sections import ENV_SEEDS

    count = config.env.eval_seeds if part == "eval" else config.env.train_seeds
    return [ENV_SEEDS[part] + i for i in range(count)]


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
                    image_drop_step=v.image_drop_step, image_size=v.image_size, text=v.text, fast_generation=config.training.fast_generation)


def decoding_for(model, processor, settings: Settings) -> engine.Decoding:
    """How every turn of a rollout decodes, from `settings`: the reply budget, the temperature, a static cache and
    compiled decoding where `fast_generation` says so, each token's log-prob where `record_logps` does. A trainer
    builds it once (its suppressed ids also mask the training forward) and hands it to `play`."""
    return engine.decoding_for(model, processor, max_new_tokens=settings.max_new_tokens,
                               temperature=settings.temperature, static=settings.fast_generation,
                               record_logps=settings.record_logps)


def play(model, processor, make_env, seeds, settings: Settings, *, batch_size: int = 0, log=None,
         decoding: engine.Decoding | None = None, session: engine.Session | None = None) -> list[Episode]:
    """Plays one episode per seed (a seed listed twice is played twice: a GSPO group) and returns them in order.

    Args:
        model: the policy (PEFT-wrapped or not).
        processor: its processor.
        make_env: a callable returning a fresh environment (`vlrl.envs.Env`); each episode gets its own, closed at
            its end.
        seeds: the episodes' seeds.
        settings: `Settings`.
        batch_size: episodes decoded together (0: all of them); an episode that ends hands its slot to the next
            seed's episode at the next turn, so the batch stays full while episodes of unequal lengths end.
        log: optional callable for a one-line summary.
        decoding: how turns decode (`decoding_for(model, processor, settings)`, built here when None).
        session: the engine session the turns decode in, whose counters then say what decoding cost (a trainer's
            `rollout/prefill_time`, `rollout/decode_ms_per_step`); one of `slots(len(seeds), batch_size)` when None.
    """
    started, seeds = time.time(), list(seeds)
    session = session or engine.Session(slots(len(seeds), batch_size))
    decoding = decoding or decoding_for(model, processor, settings)
    episodes = _play_batch(model, processor, make_env, seeds, settings, session, decoding)
    if log is not None and episodes:
        s = summary(episodes)
        kept = f", {session.reused:,} of {session.reused + session.prefilled:,} context tokens read from the kept " \
               f"cache" if session.reused else ""
        log(f"episodes: {s['episodes']} in {time.time() - started:.1f} s; success {s['success_rate']:.0%}, mean "
            f"return {s['return_mean']:.2f}, {s['invalid_actions']} invalid actions, {s['truncated']} truncated, "
            f"{s['failed']} failed, {s['dropped_images']} images dropped{kept}")
    return episodes


def slots(episodes: int, batch_size: int) -> int:
    """How many episodes `play` decodes together: `batch_size` of them (0: all), at least one."""
    return min(batch_size or episodes, episodes) or 1


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

def _play_batch(model, processor, make_env, seeds, settings: Settings, session, decoding) -> list[Episode]:
    """Every seed's episode, as many decoded together each turn as `session` (an `engine.Session`) has slots: when an
    episode ends, the next seed's episode starts in its slot and joins the next turn's batch; each slot's KV cache is
    kept from turn to turn while its context only grows."""
    if not seeds:
        return []
    slots = session.rows
    episodes = [Episode(seed=int(seed)) for seed in seeds]
    envs = [None] * len(seeds)
    waiting, held = iter(range(len(seeds))), [None] * slots  # each slot's episode (its index), None when empty
    try:
        while True:
            for slot in range(slots):  # free slots take the next seeds
                while held[slot] is None and (i := next(waiting, None)) is not None:
                    envs[i] = _start(episodes[i], make_env, settings)
                    held[slot] = i if not episodes[i].ended else None
            if all(i is None for i in held):
                break
            _turn(model, processor, decoding, session, [episodes[i] if i is not None else None for i in held],
                  [envs[i] if i is not None else None for i in held], settings)
            held = [i if i is not None and not episodes[i].ended else None for i in held]
    finally:
        for episode, env in zip(episodes, envs):
            if not episode.ended:  # an interrupt: close what is open, keep nothing half-played
                _end(episode, env, "failed", failure="interrupted")
    return episodes


def _start(episode: Episode, make_env, settings: Settings):
    """The episode's environment, reset to its seed, and its opening messages; an environment that raises fails
    its episode (ended, with the reason), never the run. Returns the environment (None if it could not be made)."""
    env = None
    try:
        env = make_env()
        observation = env.reset(episode.seed)
        messages, dropped = opening(env.describe(), observation, settings)
    except Exception as err:  # noqa: BLE001
        _end(episode, env, "failed", failure=_reason(err, "reset"))
        return env
    episode.messages, episode.dropped_per_message = messages, dropped
    episode.frames.append(observation.image)
    return env


def _turn(model, processor, decoding, session, episodes: list, envs: list, settings: Settings) -> None:
    """One turn of the live episodes (one a slot of `session`, None for an empty slot): their contexts built and
    measured, those whose next turn would not fit `max_seq_length` ended as truncated, the rest decoded together and
    stepped."""
    contexts = [episode.context(settings, processor) if episode is not None else None for episode in episodes]
    for k, context in enumerate(contexts):
        if context is not None and len(context.ids) + settings.max_new_tokens > settings.max_seq_length:
            _end(episodes[k], envs[k], "truncated")  # never cut: the episode stops before the overflow
            contexts[k] = None
    if all(context is None for context in contexts):
        return
    replies = engine.complete_tokenized(model, processor, contexts, decoding, session=session)
    for k, reply in enumerate(replies):
        if reply is None:
            continue
        if reply.logps is not None:
            episodes[k].reply_logps.append(reply.logps)
        episodes[k].contexts.append(contexts[k])
        episodes[k].reply_content.append(reply.content_ids)
        _take_turn(episodes[k], envs[k], reply.text, reply.ids, len(contexts[k].ids), settings)


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

