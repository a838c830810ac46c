"""Evaluation of episodes: the same seeds before and after training, one JSON record per episode appended as it
goes (an interrupted eval resumes), every observation saved as a PNG beside them.

    records = evaluate(policy, processor, make_env, seeds=range(32), output_path="runs/g/eval_before.jsonl",
                       settings=settings_for(config, "eval"), frame_dir="runs/g/episode_frames/before")

A record:

    {id: "seed-3", kind: "episode", env, seed, success, return, length, status, failure, invalid_actions,
     dropped_images, metrics (the environment's own), turns: [{reply, actions, reward, invalid, problem,
     context_tokens, reply_tokens}], frames: ["seed-3/t0.png", ...] (relative to the frame folder), temperature,
     max_turns, max_new_tokens}

With `temperature` 0 the episodes are greedy; above 0 they are sampled with a seed fixed per batch, so the same
policy on the same seeds draws the same episodes. `evaluate_run` plays a run's eval seeds into its files (the eval
stage, `vlrl.run.evaluate_policy`); comparing two evals is `vlrl.evaluation.compare`, for episodes as for items.

`sample` plays K sampled episodes of each world (`[eval] samples = K`) into one record per world whose `draws` are
its episodes, {success as `correct`, return, achievements, invalid actions, length}: success@k and achievements@k
(`vlrl.evaluation.passk`), the episode analogue of pass@k.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from vlrl.base.errors import EvalError
from vlrl.base.progress import Progress
from vlrl.envs.achievements import crafter_report, record_achievements
from vlrl.episodes.rollout import Episode, Settings, environment_for, play, seeds_for, settings_for, summary
from vlrl.evaluation.records import drop_torn_tail, read_records

SAMPLING_SEED = 7_919  # seeds a sampled eval's draws (with the batch's first seed)
SETTINGS = ("temperature", "max_turns", "max_new_tokens")  # a resumed eval must match these


def to_record(episode: Episode, env_name: str, settings: Settings, frames: list[str]) -> dict:
    """One episode's record (see the module docstring)."""
    return {"id": f"seed-{episode.seed}", "kind": "episode", "env": env_name, "seed": episode.seed,
            "success": bool(episode.success), "return": episode.total_return, "length": len(episode.turns),
            "status": episode.status, "failure": episode.failure,
            "invalid_actions": sum(t["invalid"] for t in episode.turns),
            "dropped_images": episode.dropped_per_message + episode.dropped_from_context,
            "metrics": episode.metrics, "turns": episode.turns, "frames": frames,
            **{k: getattr(settings, k) for k in SETTINGS}}


def save_frames(episode: Episode, frame_dir: Path) -> list[str]:
    """The episode's observations as frame_dir/seed-<seed>/t<k>.png (each written whole: a temporary file renamed);
    returns their paths relative to `frame_dir`."""
    folder = frame_dir / f"seed-{episode.seed}"
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for k, image in enumerate(episode.frames):
        if image is None:
            continue
        path = folder / f"t{k}.png"
        tmp = path.with_suffix(".tmp")
        image.save(tmp, format="PNG")
        tmp.replace(path)
        names.append(path.relative_to(frame_dir).as_posix())
    return names


def evaluate(model, processor, make_env, seeds, output_path: str | Path, settings: Settings, *, env_name: str,
             frame_dir: str | Path, batch_size: int = 16, log=None) -> list[dict]:
    """Plays one episode per seed and appends its record to `output_path`; seeds already there are skipped (an
    interrupted eval resumes), each batch's records are written in one flushed append.

    Raises:
        EvalError: a damaged record file, or records there played with other settings (temperature, turn cap,
            reply budget): two evals must never mix in one file.
    """
    import torch

    output_path, frame_dir = Path(output_path), Path(frame_dir)
    seeds = [int(s) for s in seeds]
    todo = _pending(output_path, seeds, {k: getattr(settings, k) for k in SETTINGS}, _settings_of)
    started = time.time()
    played: list[Episode] = []
    progress = Progress(f"eval {output_path.name}", len(todo), "episodes", log)  # minutes on CPU, hours on a GPU
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]
        if settings.temperature > 0:
            torch.manual_seed(SAMPLING_SEED + batch[0])
        episodes = play(model, processor, make_env, batch, settings)
        _append(output_path, [to_record(e, env_name, settings, save_frames(e, frame_dir)) for e in episodes])
        played += episodes
        progress.update(len(batch))
    records = _in_order(output_path, seeds)
    if log is not None and records:
        seconds = time.time() - started
        s = summary(played) if played else {}
        per = f" ({seconds / len(played):.2f} s per episode)" if played else ""
        log(f"eval: {len(todo)} episodes played in {seconds:.1f} s{per}, {len(seeds) - len(todo)} resumed from "
            f"{output_path.name}; success {sum(r['success'] for r in records) / len(records):.1%}, mean return "
            f"{sum(r['return'] for r in records) / len(records):.2f}"
            + (f"; {s['invalid_actions']} invalid actions, {s['truncated']} truncated, {s['failed']} failed, "
               f"{s['dropped_images']} images dropped" if s else "") + crafter_score_line(records))
    return records


def crafter_score_line(records: list[dict]) -> str:
    """"; Crafter score S% [low, high]" for records of Crafter episodes (their metrics list achievements), else "".

    >>> print(crafter_score_line([{"metrics": {"achievements": ["collect_wood"]}}, {"metrics": {"achievements": []}}]))
    ; Crafter score 0.20% [0.00, 0.23] (the paper's measure, 2 episodes)
    """
    unlocked = [record_achievements(r) for r in records]
    if not unlocked or any(u is None for u in unlocked):
        return ""
    report = crafter_report(unlocked)
    low, high = report["score_ci95"]
    return f"; Crafter score {report['score']:.2f}% [{low:.2f}, {high:.2f}] (the paper's measure, {len(records)} episodes)"


def sample(model, processor, make_env, seeds, output_path: str | Path, settings: Settings, *, samples: int,
           env_name: str, seed: int = 0, batch_size: int = 16, log=None) -> list[dict]:
    """Plays `samples` sampled episodes of each world of `seeds` (at `settings.temperature`, seeded per world) and
    appends one record per world to `output_path`, {id, kind: "episode_samples", env, seed, draws, temperature,
    max_turns, max_new_tokens}; worlds already there are skipped (a resumed eval). Each batch holds whole worlds.

    Raises:
        EvalError: `samples` below 1, sampling at temperature 0 (every draw the same episode), or records there
            played with other settings.
    """
    import torch

    if samples < 1 or settings.temperature <= 0:
        raise EvalError(f"sampled episodes need samples >= 1 and a temperature above 0 (got {samples} at "
                        f"{settings.temperature}); greedy episodes are `evaluate`'s.")
    output_path = Path(output_path)
    seeds = [int(s) for s in seeds]
    wanted = {k: getattr(settings, k) for k in SETTINGS}
    todo = _pending(output_path, seeds, {**wanted, "samples": samples},
                    lambda record: {**_settings_of(record), "samples": len(record.get("draws", ()))})
    worlds = max(1, batch_size // samples)
    progress = Progress(f"sampled episodes {output_path.name}", len(todo), "worlds", log)
    started = time.time()
    for start in range(0, len(todo), worlds):
        batch = todo[start:start + worlds]
        torch.manual_seed(SAMPLING_SEED + seed * 1_000_003 + batch[0])
        episodes = play(model, processor, make_env, [s for s in batch for _ in range(samples)], settings)
        records = []
        for k, world in enumerate(batch):
            draws = [{"correct": bool(e.success), "return": e.total_return, "length": len(e.turns),
                      "invalid_actions": sum(t["invalid"] for t in e.turns), "status": e.status,
                      **({"achievements": list(e.metrics["achievements"])}
                         if isinstance(e.metrics.get("achievements"), list) else {})}
                     for e in episodes[k * samples:(k + 1) * samples]]
            records.append({"id": f"seed-{world}", "kind": "episode_samples", "env": env_name, "seed": world,
                            "draws": draws, **wanted})
        _append(output_path, records)
        progress.update(len(batch))
    records = _in_order(output_path, seeds)
    if log is not None and records:
        draws = [d for r in records for d in r["draws"]]
        log(f"sampled episodes: {len(todo)} worlds x {samples} in {time.time() - started:.1f} s; success "
            f"{sum(d['correct'] for d in draws) / len(draws):.1%}"
            + (f", achievements per episode {sum(len(d['achievements']) for d in draws) / len(draws):.2f}"
               if all("achievements" in d for d in draws) else ""))
    return records


def _settings_of(record: dict) -> dict:
    """The settings (`SETTINGS`) a record was played with."""
    return {k: record.get(k) for k in SETTINGS}


def _pending(output_path: Path, seeds: list[int], wanted: dict, found_of) -> list[int]:
    """Readies `output_path` for an eval that resumes it (a torn last line dropped) and returns the seeds not yet in
    it, in order.

    Raises:
        EvalError: a record there whose `found_of(record)` is not `wanted`: two evals must never mix in one file.
    """
    output_path.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(output_path)
    existing = read_records(output_path)
    for record in existing:
        found = found_of(record)
        if found != wanted:
            raise EvalError(f"{output_path} holds episodes played with {found}, and this eval asks for {wanted}; "
                            "resume with the same settings, or write to a new file.")
    done = {r.get("seed") for r in existing}
    return [s for s in seeds if s not in done]


def _append(output_path: Path, records: list[dict]) -> None:
    """A batch's records appended in one flushed write."""
    with output_path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()


def _in_order(output_path: Path, seeds: list[int]) -> list[dict]:
    """The records of `output_path` for `seeds`, in their order."""
    by_seed = {r["seed"]: r for r in read_records(output_path)}
    return [by_seed[s] for s in seeds if s in by_seed]


def evaluate_run(config, policy, processor, run, when: str, log=print) -> list[dict]:
    """An episode run's eval seeds into `run`'s (a `vlrl.config.rundir.RunDir`) eval_<when>.jsonl and
    episode_frames/<when>/ ("before" resumes a partial file; "after" starts over: episodes of an earlier adapter must
    never be scored as this one's); with [eval] samples = K, also K episodes of each eval world sampled at [eval]
    temperature into samples_<when>.jsonl (success@k and achievements@k). Returns the greedy records."""
    path, sampled = run.eval_file(f"eval_{when}"), run.eval_file(f"samples_{when}")
    if when == "after":
        path.unlink(missing_ok=True)
        sampled.unlink(missing_ok=True)
    settings, make_env, seeds = settings_for(config, "eval"), environment_for(config), seeds_for(config, "eval")
    records = evaluate(policy, processor, make_env, seeds, path, settings, env_name=config.env.name,
                       frame_dir=run.episode_frames(when), batch_size=config.eval.batch_size, log=log)
    if config.eval.samples:
        sample(policy, processor, make_env, seeds, sampled, replace(settings, temperature=config.eval.temperature),
               samples=config.eval.samples, env_name=config.env.name, seed=config.eval.seed,
               batch_size=config.eval.batch_size, log=log)
    return records
