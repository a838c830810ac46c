"""`vlrl data inspect`: a data source as a run would load it (its DataReport, what a pixel or video budget costs, a
few prompts as the model sees them), or, with --config / --preset, exactly the items a run trains and evaluates on.
The command-line layer (`vlrl.cli` dispatches here); what it shows comes from `vlrl.data` and `vlrl.model`.
"""

from __future__ import annotations

import sys


def cmd_data_inspect(args) -> int:
    """A source as a run would load it (its DataReport and a few prompts as the model sees them), or, with --config /
    --preset, exactly the items the run trains and evaluates on."""
    from vlrl import data
    from vlrl.base.images import undecoded
    from vlrl.model import lengths, pixel_budget, prompts

    if args.config or args.preset:
        return _inspect_run(args)
    if not args.source:
        from vlrl.base.errors import ConfigError

        raise ConfigError("vlrl data inspect needs a source (a hub id, a directory or file, or 'synthetic') or "
                          "--config / --preset to show a run's items.")
    _check_video_flags(args)
    processor = _processor(args.processor)
    if processor is not None and (args.min_pixels or args.max_pixels):
        pixel_budget.set_pixel_budget(processor, args.min_pixels, args.max_pixels)
    if processor is not None and args.video_max_pixels:
        pixel_budget.set_video_budget(processor, args.video_max_pixels)
    loader = data.loader_name(args.source) if args.loader == "auto" else args.loader
    clips = {"video_fps": args.video_fps, "max_frames": args.max_frames}
    if loader == "synthetic":
        rows, report = data.load_synthetic(args.num_items, image_size=args.image_size or 128, tasks=args.tasks,
                                           max_images=args.max_images, return_report=True, **clips)
    else:
        options = {"image_size": args.image_size or None, "keep_aspect": args.keep_aspect,
                   "max_images": args.max_images, "video_key": args.video_key, "log": lambda _: None, **clips}
        if args.all_answers:  # else each loader's own default: numbers only, but ViRL39K's answers of every kind
            options["numeric_only"] = False
        # the column flags apply to every loader (each is load_generic with its data set's columns)
        options.update(prompt_key=args.prompt_key, answer_key=args.answer_key, image_keys=args.image_key,
                       id_key=args.id_key, system_prompt=args.system_prompt)
        split = {"split": args.split} if args.split else {}  # each loader's own default split otherwise
        rows, report = data.LOADERS[loader](args.source, return_report=True, **split, **options)
    shown = prompts.to_dataset(rows)
    if processor is not None and args.max_prompt_tokens:
        shown, _ = lengths.filter_by_length(shown, processor, args.max_prompt_tokens, report=report, part="all")
    if processor is not None:  # pictures' tokens where the items have pictures (a video task's have none)
        tokens = pixel_budget.image_tokens_per_item(processor, undecoded(shown))
        report.image_tokens = tokens if tokens["max"] else report.image_tokens
    print(report)
    if processor is not None and "video" in shown.column_names:
        print(f"  {pixel_budget.video_tokens_line(processor, undecoded(shown))}")
    _print_items("", shown, args.n, processor)
    if args.output:
        report.save(args.output)
        print(f"\nreport saved to {args.output}")
    return 0


def _inspect_run(args) -> int:
    from vlrl import run
    from vlrl.config import runfile as cfg
    from vlrl.config.runfile import LOCAL_FAMILIES, LOCAL_MODELS
    from vlrl.model import tiny

    config = cfg.resolve(config=args.config, preset_name=args.preset, overrides=args.set or ())
    note = cfg.empty_file_note(args.config, config)
    if note:
        print(note, file=sys.stderr)
    name = config.model.name_or_path
    size = LOCAL_MODELS.get(name)  # a local model's processor is its random base's: no warm start
    model_dir = (tiny.ensure_base(seed=config.data.seed, size=size, family=LOCAL_FAMILIES.get(name, "qwen3_vl"),
                                  log=print) if size else name)
    processor = _processor(args.processor or model_dir, optional=args.processor is None)
    run.set_budget(config, processor)
    if processor is None:
        print(f"note: no processor for {config.model.name_or_path!r} on this machine (offline?): the items below are "
              "before the length filter ([data] max_prompt_tokens); pass --processor DIR to apply it.")
    train_ds, eval_ds = run.prepare(config, processor, None, log=print, report_path=args.output)
    kind = "eval" if config.eval.source else "held-out"
    print(f"run {config.name!r}: {len(train_ds)} training items, {len(eval_ds)} {kind} items")
    _print_items("train", train_ds, args.n, processor)
    _print_items(kind, eval_ds, args.n, processor)
    if args.output:
        print(f"\nthe run's data report saved to {args.output}")
    return 0


def _processor(path, optional: bool = False):
    if not path:
        return None
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(str(path))
    except OSError as err:
        if optional:
            return None
        from vlrl.base.errors import ConfigError

        raise ConfigError(f"no processor at {path}: {err}") from None


def _print_items(label: str, rows, n: int, processor) -> None:
    from vlrl.model import lengths, prompts

    for row in rows.select(range(min(n, len(rows)))):
        pictures, clip = prompts.row_images(row, decode=True), prompts.row_video(row)
        sizes = ("images " if len(pictures) > 1 else "image ") + ", ".join(f"{im.size[0]}x{im.size[1]} {im.mode}"
                                                                         for im in pictures)
        if clip:
            frames, meta = clip
            sizes = f"video of {len(frames)} frames at {float(meta.get('fps') or 0):g} fps"
        tokens = f", {lengths.prompt_tokens(processor, row)} prompt tokens" if processor is not None else ""
        print(f"\n--- {label + ' ' if label else ''}{row['id']}: answer {row['answer']!r} ({row['question_type']}, "
              f"{row['answer_type']}), {sizes}{tokens}")
        print(prompts.render_prompt(row, processor))


def _check_video_flags(args) -> None:
    """The video flags' bad values, refused in one line before anything loads, as `vlrl validate` refuses them."""
    from vlrl.base.errors import ConfigError
    from vlrl.config.validation import video_problems

    problems = video_problems(args.video_fps, args.max_frames, args.video_max_pixels)
    if problems:
        raise ConfigError(" ".join(problems) + " (the flags --video-fps, --max-frames and --video-max-pixels set "
                          "these three)")
