"""`vlrl compare RUN_DIR RUN_DIR...`: one config's runs under several training seeds, each run's paired test and the
pooled result (vlrl.evaluation.seeds)."""

import json

import pytest

from vlrl import cli
from vlrl.base.errors import EvalError
from vlrl.base.stats import mcnemar_exact
from vlrl.config import preset
from vlrl.config.rundir import RunDir
from vlrl.evaluation import seeds


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def run_dir(root, seed, before, after, ids=range(20)):
    """A run of the tiny preset under training `seed` whose evals got `before` and `after` of the items right."""
    run = RunDir(root / f"seed{seed}").start(preset("tiny", overrides=[f"training.seed={seed}"]))
    for path, right in ((run.eval_before, before), (run.eval_after, after)):
        write(path, [{"id": f"item-{i}", "correct": i in right, "format_ok": True} for i in ids])
    return run.path


def test_each_seed_and_the_pooled_result(tmp_path):
    runs = [run_dir(tmp_path, 0, {0, 1}, {0, 1, *range(2, 14)}),   # 12 gained, none lost: p = 2 / 2**12
            run_dir(tmp_path, 1, {0, 1}, {0, 2, 3}),                 # 2 gained, 1 lost
            run_dir(tmp_path, 2, {0, 1, 2}, {0})]                    # below its baseline
    result = seeds.compare_runs(runs)
    assert result["metric"] == "accuracy"
    rows = result["runs"]
    assert [r["seed"] for r in rows] == [0, 1, 2]
    assert [round(r["gain"], 2) for r in rows] == [0.6, 0.05, -0.1]
    assert rows[0]["p"] == mcnemar_exact(12, 0) and rows[0]["significant"]
    assert rows[1]["p"] == mcnemar_exact(2, 1) and not rows[1]["significant"]
    pooled = result["pooled"]
    assert (pooled["runs"], pooled["significant"], pooled["below_baseline"]) == (3, 1, 1)
    assert round(pooled["median_gain"], 2) == 0.05 and pooled["sign_test_p"] == mcnemar_exact(2, 1)
    text = seeds.summary(result)
    assert "1 of 3 runs gained significantly (p < 0.01), 1 ended below its baseline" in text


def test_runs_of_other_items_or_without_evals_are_refused(tmp_path):
    one = run_dir(tmp_path, 0, {0}, {1})
    other = run_dir(tmp_path, 1, {0}, {1}, ids=range(10))
    with pytest.raises(EvalError, match="same held-out items"):
        seeds.compare_runs([one, other])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EvalError, match="eval_before.jsonl"):
        seeds.compare_runs([one, empty])
    with pytest.raises(EvalError, match="two or more"):
        seeds.compare_runs([one])


def test_episode_runs_compare_their_success(tmp_path):
    def episodes(path, successes):
        write(path, [{"kind": "episode", "id": f"seed-{s}", "seed": s, "success": s in successes,
                      "return": float(s in successes), "length": 1,
                      "turns": []} for s in range(16)])

    runs = []
    for seed, after in ((0, set(range(10))), (1, set())):
        run = RunDir(tmp_path / f"grid{seed}").start(preset("grid-tiny", overrides=[f"training.seed={seed}"]))
        episodes(run.eval_before, {0})
        episodes(run.eval_after, after)
        runs.append(run.path)
    result = seeds.compare_runs(runs)
    assert result["metric"] == "success"
    assert [r["significant"] for r in result["runs"]] == [True, False]
    assert result["pooled"]["below_baseline"] == 1


def test_the_cli_compares_run_directories(tmp_path, capsys):
    runs = [str(run_dir(tmp_path, s, {0}, {0, *range(1, 12)})) for s in range(3)]
    assert cli.main(["compare", *runs, "--output", str(tmp_path / "seeds.json")]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 runs gained significantly" in out
    assert json.loads((tmp_path / "seeds.json").read_text())["pooled"]["significant"] == 3
    assert cli.main(["compare", runs[0], runs[1], str(tmp_path / "seed0" / "eval_after.jsonl")]) == 1
    assert "run directories alone" in capsys.readouterr().err


def test_the_committed_seed_runs_are_what_seeds_json_says():
    """bench/results/seeds.json (issue 49): each demonstration's training seeds point to committed before and after
    records that keep their ids and outcomes, every seed of a demonstration on the same held-out items, and the
    figures it lists are the comparison of those records."""
    from pathlib import Path

    from vlrl.evaluation.compare import compare
    from vlrl.evaluation.records import read_records

    root = Path(__file__).resolve().parent.parent
    entries, items = json.loads((root / "bench" / "results" / "seeds.json").read_text()), {}
    for e in entries:
        before, after = (read_records(root / e[side]) for side in ("before", "after"))
        outcome = "success" if e["metric"] == "success" else "correct"
        assert all("id" in r and outcome in r for r in before + after), e["before"]
        ids = {r["id"] for r in before}
        assert ids == {r["id"] for r in after} == items.setdefault(e["demo"], ids), e["after"]
        c = compare(before, after)
        assert (c["n_paired"], c[f"{e['metric']}_before"], c[f"{e['metric']}_after"], c["mcnemar_p"]) == \
            (e["n_paired"], e["before_rate"], e["after_rate"], e["mcnemar_p"]), e["demo"]
    grid = [e for e in entries if e["demo"] == "grid"]
    assert sorted(e["seed"] for e in grid) == list(range(5)) and {e["n_paired"] for e in grid} == {200}


def test_runs_compared_on_their_sampled_evals(tmp_path):
    """records="samples": each item's first seeded draw (samples_before/after.jsonl), as `vlrl compare` reads them."""
    def samples(path, first_right):
        write(path, [{"id": f"item-{i}", "correct": i in first_right, "format_ok": True, "samples": 2,
                      "num_correct": int(i in first_right),
                      "draws": [{"correct": i in first_right, "format_ok": True}, {"correct": False, "format_ok": True}]}
                     for i in range(20)])

    runs = []
    for seed, after in ((0, set(range(14))), (1, {0})):
        run = RunDir(tmp_path / f"s{seed}").start(preset("tiny", overrides=[f"training.seed={seed}"]))
        write(run.eval_before, [{"id": f"item-{i}", "correct": False, "format_ok": True} for i in range(20)])  # greedy
        write(run.eval_after, [{"id": f"item-{i}", "correct": False, "format_ok": True} for i in range(20)])
        samples(run.path / "samples_before.jsonl", {0})
        samples(run.path / "samples_after.jsonl", after)
        runs.append(run.path)
    assert [r["gain"] for r in seeds.compare_runs(runs)["runs"]] == [0.0, 0.0]
    result = seeds.compare_runs(runs, records="samples")
    assert [round(r["gain"], 2) for r in result["runs"]] == [0.65, 0.0]
    assert result["runs"][0]["p"] == mcnemar_exact(13, 0) and result["pooled"]["significant"] == 1
