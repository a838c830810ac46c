"""The plots of a run, as PNG files (matplotlib, no display): the before/after comparison with its intervals, and
the training curves (reward parts, completion length, degeneration, rollout/training mismatch) from train_log.jsonl.

    plot_comparison(compare(before, after), "runs/demo/plots/comparison.png")
    plot_training(read_records("runs/demo/train_log.jsonl"), "runs/demo/plots/training.png")
"""

from __future__ import annotations

from pathlib import Path

REWARD_PREFIX, REWARD_SUFFIX = "rewards/", "/mean"  # TRL logs each reward function's mean as rewards/<name>/mean
# vlrl.training.mismatch's numbers: how far generation's log-probs are from the training forward's (log scale)
MISMATCH = {"sampling/rollout_train_kl": "KL(rollout || train)",
            "sampling/sampling_logp_difference/mean": "mean |logp difference|"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(comparison: dict, path: str | Path) -> Path:
    """Accuracy and format compliance before/after as bars with their 95% Wilson intervals; McNemar p in the title
    (an episode run's comparison: its success rate, with the McNemar and return permutation p).

    Args:
        comparison: what `vlrl.evaluation.compare.compare` returns.
        path: the PNG to write.
    """
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    width = 0.36
    episodes = comparison.get("kind") == "episodes"
    metrics = ("success",) if episodes else ("accuracy", "format")
    for offset, side, color in ((-width / 2, "before", "#9aa5b1"), (width / 2, "after", "#2f6fb0")):
        values, low, high = [], [], []
        for metric in metrics:
            value = comparison[f"{metric}_{side}"] or 0.0
            lo, hi = comparison[f"{metric}_{side}_ci95"]
            values.append(value)
            low.append(value - lo)
            high.append(hi - value)
        xs = [i + offset for i in range(len(metrics))]
        ax.bar(xs, values, width, color=color, label=side, yerr=[low, high], capsize=4, ecolor="#333")
        for x, v, h in zip(xs, values, high):
            ax.text(x + width / 8, v + h + 0.01, f"{v:.0%}", ha="left", va="bottom", fontsize=8)
    ax.set_xticks(range(len(metrics)), ["success"] if episodes else ["accuracy", "format compliance"])
    ax.set_ylim(0, 1.1)
    ax.set_ylabel(f"share of {comparison['n_paired']} paired {'episodes' if episodes else 'items'}")
    second = (f"paired permutation p = {comparison['return_permutation_p']:.3g} (return)" if episodes
              else f"{comparison['format_mcnemar_p']:.3g} (format)")
    ax.set_title(f"before -> after, 95% Wilson intervals; McNemar exact p = {comparison['mcnemar_p']:.3g} "
                 f"({metrics[0]}), {second}", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_pass_at_k(pass_at_k: dict, path: str | Path) -> Path:
    """pass@k before and after against k (log scale, k = 1..K) with 95% bootstrap intervals of each side.

    Args:
        pass_at_k: the `pass_at_k` block of a comparison (`vlrl.evaluation.passk.compare_pass_at_k`).
        path: the PNG to write.
    """
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    ks = pass_at_k["k"]
    for side, color in (("before", "#9aa5b1"), ("after", "#2f6fb0")):
        ax.plot(ks, pass_at_k[f"pass_at_k_{side}"], marker="o", color=color, label=side)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("k (draws per item)")
    ax.set_ylabel(f"pass@k over {pass_at_k['n_paired']} items")
    ax.set_title(f"pass@k, {pass_at_k['samples']} draws per item; pass@1 paired permutation p = "
                 f"{pass_at_k['pass_at_1_p']:.3g}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def training_series(log: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """Metric name -> (steps, values) from train_log.jsonl rows, for the metrics the training plot draws.

    >>> training_series([{"step": 1, "reward": 0.3, "rewards/format_reward/mean": 1.0}, {"step": 2, "train_loss": 0}])
    {'reward': ([1], [0.3]), 'rewards/format_reward/mean': ([1], [1.0])}
    """
    wanted = lambda key: (key == "reward" or (key.startswith(REWARD_PREFIX) and key.endswith(REWARD_SUFFIX))
                          or key.startswith("completions/") or "degenera" in key or key in MISMATCH)
    series: dict[str, tuple[list, list]] = {}
    for row in log:
        for key, value in row.items():
            if wanted(key) and isinstance(value, (int, float)) and "step" in row:
                steps, values = series.setdefault(key, ([], []))
                steps.append(row["step"])
                values.append(value)
    return series


def plot_training(log: list[dict], path: str | Path) -> Path | None:
    """Reward components, completion length (or an episode's turns), degeneration and the rollout/training mismatch
    over training steps, each panel drawn only when train_log.jsonl holds its numbers; None when nothing was logged.

    Args:
        log: train_log.jsonl rows (TRL's logged metrics, or an episode run's, with their `step`).
        path: the PNG to write.
    """
    series = training_series(log)
    panels = [panel for panel in (_rewards_panel, _length_panel, _turns_panel, _degeneration_panel,
                                  _mismatch_panel) if panel(None, series)]
    if not panels:
        return None
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), dpi=110, squeeze=False)
    from matplotlib.ticker import MaxNLocator

    for ax, panel in zip(axes[0], panels):
        panel(ax, series)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# Each panel of the training figure: with ax None, whether `series` holds its numbers; else it draws them on ax.

def _rewards_panel(ax, series: dict) -> bool:
    keys = sorted(k for k in series if k.startswith(REWARD_PREFIX))
    if ax is None:
        return bool(keys) or "reward" in series
    for key in keys:
        ax.plot(*series[key], marker=".", label=key[len(REWARD_PREFIX):-len(REWARD_SUFFIX)])
    if "reward" in series:
        ax.plot(*series["reward"], marker=".", color="black", label="total (weighted)")
    ax.set_title("reward (mean per step)", fontsize=9)
    return True


def _length_panel(ax, series: dict) -> bool:
    if ax is None:
        return "completions/mean_length" in series
    steps, mean = series["completions/mean_length"]
    ax.plot(steps, mean, marker=".", label="mean")
    if "completions/min_length" in series and "completions/max_length" in series:
        ax.fill_between(series["completions/min_length"][0], series["completions/min_length"][1],
                        series["completions/max_length"][1], alpha=0.2, label="min-max")
    ax.set_title("completion length (tokens)", fontsize=9)
    return True


def _turns_panel(ax, series: dict) -> bool:
    """An episode run's turns per episode and invalid actions per step (the episode trainer's log)."""
    keys = {"completions/turns_mean": "turns per episode", "completions/invalid_actions": "invalid actions"}
    if ax is None:
        return any(key in series for key in keys)
    for key, label in keys.items():
        if key in series:
            ax.plot(*series[key], marker=".", label=label)
    ax.set_title("episodes: turns and invalid actions", fontsize=9)
    return True


def _degeneration_panel(ax, series: dict) -> bool:
    keys = [k for k in series if "degenera" in k]
    if ax is None:
        return bool(keys) or "completions/clipped_ratio" in series
    for key in keys:
        ax.plot(*series[key], marker=".", color="#b03030", label=key)
    if "completions/clipped_ratio" in series:
        ax.plot(*series["completions/clipped_ratio"], marker=".", color="#888", label="hit max length")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("degenerate / truncated share", fontsize=9)
    return True


def _mismatch_panel(ax, series: dict) -> bool:
    """The rollout/training mismatch per step, log scale (on-policy it sits near float rounding, ~1e-13 on CPU; a
    sampling path the loss does not know shows as 1e-2 and more). A value of exactly 0 has no place on it."""
    points = {label: [(step, value) for step, value in zip(*series.get(key, ([], []))) if value > 0]
              for key, label in MISMATCH.items()}
    if ax is None:
        return any(points.values())
    for label, shown in points.items():
        if shown:
            ax.plot(*zip(*shown), marker=".", label=label)
    ax.set_yscale("log")
    ax.set_title("rollout vs training log-probs", fontsize=9)
    return True
