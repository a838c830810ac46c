"""The stages of a run, and `run()`, the whole loop: load -> baseline eval -> GSPO train -> re-eval -> adapter export.

Each stage is one function that reads and writes the run directory (`vlrl.config.rundir.RunDir`), so the CLI (`vlrl run`,
`vlrl train`, `vlrl eval`), the walkthrough notebook and a script call the same code and see the same files:

    config.toml  data_report.json  eval_before.jsonl  eval_images/  grpo_config.json  train_log.jsonl
    checkpoints/  eval_after.jsonl  comparison.json  plots/  report.html  adapter/

    run(config.preset("tiny"))                 # -> runs/tiny, the comparison as a dict

Under `accelerate launch` every process runs the same stages: each trains on its share of the prompts and evaluates
its share of the items, and the main process alone writes the run directory (docs/multi-gpu.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vlrl import data, export, report
from vlrl.base import distributed
from vlrl.base.errors import ConfigError
from vlrl.base.images import undecoded
from vlrl.base.progress import duration
from vlrl.config import recipe, validation
from vlrl.config.rundir import RunDir
from vlrl.config.runfile import RunConfig
from vlrl.evaluation import compare, pictures, sharded_eval
from vlrl.model import lengths, pixel_budget, prompts
from vlrl.model import loading as model
from vlrl.training import compiled_layers, train, warmstart


def banner(text: str, log=print) -> None:
    log(f"\n=== {text} " + "=" * max(0, 72 - len(text)))


def start(config: RunConfig, run_dir: str | Path | None = None) -> RunDir:
    """The run's directory (`run_dir`, else runs/<name>), claimed for `config`: config.toml written, a directory of
    another configuration refused (its records would mix with this run's)."""
    return RunDir.for_config(config, run_dir).start(config)


# --- the model -----------------------------------------------------------------------------------------------------

def load_base(config: RunConfig, log=print, path: str | None = None):
    """The configured checkpoint (or `path`, `vlrl eval --model`) and its processor, not yet wrapped (4-bit when
    [model] load_in_4bit), under [model] memory_cap_gib and [data]'s pixel budget; a local model (`tiny`,
    `tiny-small`) is built and warm-started in the cache first (by the main process, under several)."""
    # under several processes this also starts the process group, which puts each process on its own GPU before the
    # model loads there
    with distributed.main_first():
        path = path or warmstart.model_path(config, log)
    m = config.model
    base, processor = model.load_model(path, load_in_4bit=m.load_in_4bit, max_seq_length=m.max_seq_length,
                                       backend=m.backend, memory_cap_gib=m.memory_cap_gib)
    log(f"model: {path}")
    set_budget(config, processor, log)
    return base, processor


def set_budget(config: RunConfig, processor, log=print) -> None:
    """[data] min_pixels / max_pixels set on the processor just loaded (`vlrl.model.pixel_budget`), before anything
    uses it: rollouts, the training forward, evals, the length filter and the exported processor all resize alike."""
    d = config.data
    if processor is not None and (d.min_pixels or d.max_pixels):
        bounds = pixel_budget.set_pixel_budget(processor, d.min_pixels, d.max_pixels)
        log(f"pixel budget: {bounds['min_pixels']} .. {bounds['max_pixels']} pixels per picture")
    if processor is not None and d.video_max_pixels:
        bounds = pixel_budget.set_video_budget(processor, d.video_max_pixels)
        log(f"video pixel budget: {bounds['video_min_pixels']} .. {bounds['video_max_pixels']} pixels per clip")


def wrap_lora(config: RunConfig, base):
    """`base` LoRA-wrapped as [model] says: the language model adapted, the vision tower frozen unless asked; on one
    CUDA GPU its decoder layers set to compile their training forwards (`[training] compiled_layers`), before any
    decoding (a 4-bit base's once `pack_base` has repacked it)."""
    m = config.model
    policy = model.add_lora(base, model.LoraSettings(r=m.lora_r, alpha=m.lora_alpha, dropout=m.lora_dropout,
                                                     train_projector=m.train_projector, targets=m.lora_targets,
                                                     seed=config.training.seed),
                            finetune_vision_layers=m.finetune_vision_layers, backend=model.choose_backend(m.backend))
    compiled_layers.for_run(policy, config.training.compiled_layers)
    return policy


def load_policy(config: RunConfig, log=print):
    """The configured model, LoRA-wrapped (vision frozen unless asked), its 4-bit base repacked for decoding
    ([model] decode_format), and its processor."""
    problem = validation.head_adapter_problem(config.model)  # what the installed TRL refuses, before anything loads
    if problem:
        raise ConfigError(problem)
    base, processor = load_base(config, log)
    policy = pack_base(config, wrap_lora(config, base), log)
    log(f"LoRA: {model.trainable_summary(policy)}")
    log(recipe.machine_line(recipe.machine_choices(config.training.optim)))  # same run file, other machine: other choices
    return policy, processor


def pack_base(config: RunConfig, policy, log=print):
    """A policy's 4-bit base (LoRA-wrapped or not) repacked once into [model] decode_format (`vlrl.engine.weights`):
    rollouts, evals and the training forward then compute with the packed weights. Unchanged off CUDA, unquantized,
    on Unsloth, or with decode_format = "nf4"."""
    import torch

    m = config.model
    if not (m.load_in_4bit and torch.cuda.is_available()) or m.decode_format == "nf4" or \
            model.backend_of(policy) == "unsloth":
        return policy
    from vlrl.engine.weights import pack_for_decoding

    report = pack_for_decoding(policy, m.decode_format)
    log(f"decoding weights: {report.get('format')} through {report.get('backend')} ({report.get('reason', '')})")
    compiled_layers.for_run(policy, config.training.compiled_layers)  # off bitsandbytes' layers, they qualify now
    return policy


# --- the data ------------------------------------------------------------------------------------------------------

def split(config: RunConfig, rows, report: data.DataReport | None = None):
    """(train, eval) rows. With an [eval] source: all of `rows` but those overlapping its items
    (`data.drop_eval_overlap`), and every item of it. Else `data.split_holdout` with the run's hold_out and seed; for
    a local model warm-started in this run, no held-out item shows a picture the warm start trained on, so the eval
    measures reading, not recall. A pure function of the configuration: `vlrl eval` and `vlrl data inspect` get the
    run's own items."""
    if config.eval.source:
        eval_rows = eval_items(config, report)
        return data.drop_eval_overlap(rows, eval_rows, report=report), eval_rows
    return data.split_holdout(rows, config.data.hold_out, seed=config.data.seed, report=report,
                              exclude_images=warmstart.held_out_exclusions(config))


def eval_items(config: RunConfig, report: data.DataReport | None = None):
    """Every item of the run's [eval] source (its load summarized in `report.eval_source`)."""
    rows, eval_report = data.load_eval_rows(config.eval, config.data.image_size, max_images=config.data.max_images,
                                            return_report=True)
    if report is not None:
        report.eval_source = {"summary": eval_report.summary(), **{k: getattr(eval_report, k) for k in (
            "source", "split", "rows_read", "rows_kept", "skipped", "examples")}}
    return rows


def prepare(config: RunConfig, processor, run: str | Path | RunDir | None = None, log=print,
            report_path: str | Path | None = None):
    """Loads, splits and length-filters the data; writes data_report.json when given the run (and the same report
    to `report_path` when given), and prints every drop with its count and reason. Returns
    (train_dataset, eval_dataset), disjoint by id and by picture (`split`, checked again by `data.check_disjoint`).
    Without a processor (`vlrl data inspect` of a hub model, offline) the length filter is not applied."""
    with distributed.main_first():  # a hub data set is downloaded, preprocessed and its pictures hashed once
        rows, data_report = data.load_rows(config.data, return_report=True)
        train_rows, held_out = split(config, rows, data_report)
    if data_report.trains_on_test_split:
        log(data_report.trains_on_test_split)
    max_tokens = config.data.max_prompt_tokens
    train_ds, eval_ds = prompts.to_dataset(train_rows), prompts.to_dataset(held_out)
    clips = processor is not None and "video" in train_ds.column_names
    if clips:  # before any clip reaches the processor
        pixel_budget.check_takes_video(processor, f"[data] source {config.data.source!r}")
    if processor is not None:  # the drops are counted in data_report.too_long
        train_ds, _ = lengths.filter_by_length(train_ds, processor, max_tokens, report=data_report, part="train")
        eval_ds, _ = lengths.filter_by_length(eval_ds, processor, max_tokens, report=data_report, part="eval")
        data_report.image_tokens = pixel_budget.image_tokens_per_item(
            processor, [row for part in (train_ds, eval_ds) for row in undecoded(part)])
    data.check_disjoint(train_ds, eval_ds)
    if run is not None:
        distributed.on_main(data_report.save, RunDir.of(run).data_report)
    log(f"data: {data_report.summary()}")
    if data_report.image_tokens and not (clips and not data_report.image_tokens["max"]):  # clips alone: no pictures
        log(f"data: {data_report.image_tokens_line()}")
    if clips:
        log(f"data: {pixel_budget.video_tokens_line(processor, [*undecoded(train_ds), *undecoded(eval_ds)])}")
    if config.eval.source:
        overlap = data_report.eval_source["overlap"]
        log(f"data: eval {data_report.eval_source['summary']}; training items overlapping it, dropped: "
            f"{overlap['train_dropped_same_id']} same id, {overlap['train_dropped_same_image']} same picture, "
            f"{overlap['train_dropped_same_question']} same question and answer")
    drops = data_report.drops()
    log(f"data: {len(train_ds)} training items, {len(eval_ds)} {'eval' if config.eval.source else 'held-out'} items "
        f"from {data_report.rows_read} rows; " + ("dropped, by reason:\n  " + "\n  ".join(drops) if drops else
                                                  "nothing dropped"))
    if report_path is not None:
        data_report.save(report_path)
    return train_ds, eval_ds


# --- eval, training, export ----------------------------------------------------------------------------------------

def evaluate_policy(config: RunConfig, policy, processor, eval_ds, run: str | Path | RunDir, when: str,
                    log=print) -> list[dict]:
    """The eval stage of every run: greedy eval of the eval items (`eval_ds`) into eval_<when>.jsonl, and with
    [eval] samples = K, K seeded draws per item into samples_<when>.jsonl (pass@k), each sharded over the processes
    of a launch (`vlrl.evaluation.sharded_eval`). An episode run ([env]; `eval_ds` is None) plays its eval seeds'
    episodes instead, on the main process (`vlrl.episodes.evaluate.evaluate_run`), into the same files.
    "before" resumes partial files; "after" always starts over, since records of an earlier adapter must never be
    scored as this one's. Returns the greedy records."""
    run = RunDir.of(run)
    if config.env.name:
        from vlrl.episodes.evaluate import evaluate_run

        return distributed.on_main(evaluate_run, config, policy, processor, run, when, log)
    e = config.eval
    paths = [(run.eval_file(f"eval_{when}"), 0)]
    if e.samples:
        paths.append((run.eval_file(f"samples_{when}"), e.samples))
    records = []
    for path, samples in paths:
        if when == "after":
            distributed.on_main(path.unlink, missing_ok=True)
        out = sharded_eval.evaluate(policy, processor, eval_ds, path, batch_size=e.batch_size,
                                    max_new_tokens=e.max_new_tokens, samples=samples, temperature=e.temperature,
                                    seed=e.seed, symbolic=config.training.reward == "symbolic",
                                    thinking_budget=e.thinking_budget, fast_generation=config.training.fast_generation,
                                    image_dir=run.eval_images, log=log)
        records = records or out
    return records


def compare_run(run: str | Path | RunDir, log=print) -> dict:
    """The before/after comparison of the run's eval files, written to comparison.json and summarized."""
    run = RunDir.of(run)
    comparison = compare.with_samples(compare.compare(run.eval_before, run.eval_after), run.samples_before,
                                      run.samples_after)
    comparison = pictures.with_picture_checks(comparison, run.eval_before, run.eval_after)
    run.comparison.write_text(json.dumps(comparison, indent=2))
    log("\n".join([compare.summary(comparison), *pictures.summary_lines(comparison)]))
    return comparison


def train_policy(config: RunConfig, policy, processor, train_ds, run: str | Path | RunDir, log=print):
    """GSPO training in the run directory, continuing from its last checkpoint when there is one (a finished one
    trains nothing and returns None: `policy` then holds its weights)."""
    return train.train(config, policy, processor, train_ds, run, resume=True, log=log)


def export_policy(config: RunConfig, policy, processor, run: str | Path | RunDir, log=print, *,
                  formats=None) -> dict:
    """The adapter (verified from disk), then each other format of `formats` (default [export] formats) from it,
    verified. Returns the checks by format. Every process of a launch calls it: under FSDP each holds a shard of the
    LoRA weights, which are gathered whole first (a collective), and the main process writes."""
    gathered = distributed.gathered_lora(policy) if distributed.sharded_launch() else None
    return distributed.on_main(_export, formats or config.export.formats, policy, processor, RunDir.of(run),
                               gathered, log)


def _export(formats, policy, processor, run: RunDir, gathered, log) -> dict:
    checks = {"lora": export.export_adapter(policy, processor, run.adapter, run_dir=run.path, gathered=gathered,
                                            log=log)}
    for fmt in formats:
        if fmt != "lora":
            checks[fmt] = export.export_run(run.path, fmt, log=log)
    return checks


# --- whole commands ------------------------------------------------------------------------------------------------

def run(config: RunConfig, run_dir: str | Path | None = None, *, log=print) -> dict:
    """Runs the whole loop into `run_dir` (default runs/<name>); returns the comparison (also in comparison.json)."""
    started = time.time()
    rd = start(config, run_dir)

    banner("1/6 model: load and wrap with LoRA (vision frozen)", log)
    policy, processor = load_policy(config, log)

    banner("2/6 data: load, hold out, filter by measured prompt length", log)
    train_ds, eval_ds = prepare(config, processor, rd, log)

    banner("3/6 baseline eval", log)
    evaluate_policy(config, policy, processor, eval_ds, rd, "before", log)

    banner("4/6 GSPO training", log)
    trainer = train_policy(config, policy, processor, train_ds, rd, log)
    trained = trainer.model if trainer is not None else policy  # the trainer's (FSDP-wrapped under FSDP)

    banner("5/6 eval after training", log)
    evaluate_policy(config, policy, processor, eval_ds, rd, "after", log)
    comparison = distributed.on_main(compare_run, rd, log)
    distributed.on_main(report.render, rd.path, log=log)

    banner("6/6 export the adapter (verified from disk)", log)
    export_policy(config, trained, processor, rd, log)
    distributed.on_main(finish, rd, comparison, time.time() - started, log)
    warning = data.training_on_test_warning(config.data.source, config.data.split)
    if warning:  # again at the end of a long log: this run's scores are not a benchmark result
        log(warning)
    return comparison


def finish(run: str | Path | RunDir, comparison: dict, seconds: float, log=print) -> None:
    """The end of a run's log: the before/after result with its intervals and p-value, where the report and the
    adapter are, and the commands that come next."""
    run = RunDir.of(run)
    banner(f"done in {duration(seconds)}: {run.path}", log)
    log(compare.summary(comparison))
    log(f"\nreport:  {run.report}   (open it in a browser; it needs nothing but the run directory)")
    log(f"adapter: {run.adapter}   (verified: non-zero LoRA weights, the same logits read back)")
    steps = [] if comparison.get("kind") == "episodes" else [  # `vlrl eval` scores single-turn items
        f"vlrl eval --run-dir {run.path} --adapter {run.adapter} --samples 8   # pass@k of the trained policy"]
    steps += [f"vlrl export --run-dir {run.path} --format merged16   # or gguf, for llama.cpp",
              f"vlrl compare {run.eval_before} {run.eval_after} --output comparison.json"]
    log("\nnext:\n" + "\n".join(f"  {step}" for step in steps))


def train_only(config: RunConfig, run_dir: str | Path | None = None, *, resume: bool = False, log=print):
    """`vlrl train`: load the model and the data as `run()` does, GSPO-train, save the verified adapter."""
    rd = RunDir.for_config(config, run_dir).start(config, action="resume training" if resume else "train")
    done = train.done_training(rd) if resume else None
    if done and (rd.adapter / "adapter_config.json").exists():  # finished and exported: nothing to load or write
        log(f"{done}; its adapter is {rd.adapter}: nothing to do. Next: vlrl eval --run-dir {rd.path} --adapter "
            f"{rd.adapter}")
        return None
    policy, processor = load_policy(config, log)  # after the directory's guard: a refusal loads nothing
    train_ds = training_rows(config, processor, rd, log)
    trainer = train.train(config, policy, processor, train_ds, rd, resume=resume, log=log)
    trained = trainer.model if trainer is not None else policy  # None: done, `policy` holds the last checkpoint
    export_policy(config, trained, processor, rd, log, formats=("lora",))
    return trainer


def training_rows(config: RunConfig, processor, run: RunDir, log=print):
    """What the trainer draws from: the prepared training prompts, or an episode run's training seeds."""
    if config.env.name:
        from vlrl.episodes.rollout import seeds_for
        from vlrl.training.episode_trainer import seed_dataset

        return seed_dataset(seeds_for(config, "train"))
    return prepare(config, processor, run, log)[0]


def held_out(config: RunConfig, processor):
    """The run's held-out items as TRL rows, length-filtered: exactly what its evals score (a pure function of the
    configuration and the processor)."""
    rows = eval_items(config) if config.eval.source else split(config, data.load_rows(config.data))[1]
    eval_ds, _ = lengths.filter_by_length(prompts.to_dataset(rows), processor, config.data.max_prompt_tokens)
    return eval_ds
