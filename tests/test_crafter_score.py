"""Crafter reported as its paper reports it: per-achievement success rates and the Crafter score with intervals, in
the comparison (`vlrl compare`) and the report, from the achievements the episode records keep; and the recorded
random agent at Crafter's own settings (bench/crafter_random.py), which matches the paper's 1.6%."""

import json
import math
import sys
from pathlib import Path

import pytest

from vlrl import cli
from vlrl.envs.achievements import ACHIEVEMENTS, PAPER_RANDOM_SCORE, crafter_report, paired_report, score
from vlrl.evaluation import episode_compare as ecompare
from vlrl.report.episodes import crafter_table

ROOT = Path(__file__).resolve().parents[1]


def record(seed: int, achievements: list[str]) -> dict:
    return {"id": f"seed-{seed}", "kind": "episode", "seed": seed, "success": bool(achievements),
            "return": float(len(achievements)), "length": 3, "turns": [{}] * 3, "env": "crafter",
            "metrics": {"achievements": achievements, "success": bool(achievements)}}


def test_the_score_is_the_papers_geometric_mean():
    rates = [50.0] * 11 + [0.0] * 11
    assert score(rates) == pytest.approx(math.exp(sum(math.log(1 + r) for r in rates) / 22) - 1)
    assert score([0.0] * 22) == 0.0 and score([100.0] * 22) == pytest.approx(100.0)
    assert len(ACHIEVEMENTS) == 22


def test_the_report_has_rates_and_intervals_over_episodes():
    episodes = [["collect_wood", "wake_up"]] * 30 + [["collect_wood"]] * 50 + [[]] * 20
    report = crafter_report(episodes)
    assert report["episodes"] == 100 and report["rates"]["collect_wood"] == 80.0 and report["rates"]["wake_up"] == 30
    low, high = report["rates_ci95"]["collect_wood"]
    assert 70 < low < 80 < high < 88
    assert report["score_ci95"][0] < report["score"] < report["score_ci95"][1]
    assert crafter_report(episodes) == report  # seeded: the same episodes, the same interval
    assert crafter_report([])["score"] is None


def test_compare_and_the_report_score_crafter_episodes(tmp_path, capsys):
    before = [record(i, ["wake_up"] if i < 5 else []) for i in range(20)]
    after = [record(i, ["wake_up", "collect_wood"] if i < 15 else ["collect_wood"]) for i in range(20)]
    c = ecompare.compare(before, after)
    crafter = c["crafter"]
    assert crafter["before"]["rates"]["wake_up"] == 25.0 and crafter["after"]["rates"]["collect_wood"] == 100.0
    assert crafter["achievements"]["collect_wood"] == {"gained": 20, "lost": 0, "mcnemar_p": pytest.approx(2 ** -19)}
    assert crafter["score_delta"] > 0 and crafter["score_delta_ci95"][0] > 0
    text = ecompare.summary(c)
    assert "Crafter score 0.16% [" in text and "collect_wood 0.0% -> 100.0% (20 gained, 0 lost" in text
    html = crafter_table(crafter)
    assert "Crafter score" in html and html.count("<tr>") >= 23 and "McNemar exact" in html
    for name, rows in (("b.jsonl", before), ("a.jsonl", after)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["compare", str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl"), "--output",
                     str(tmp_path / "c.json")]) == 0
    assert "Crafter score 0.16% [" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["crafter"]["after"]["rates"]["collect_wood"] == 100.0
    grid = [{**r, "metrics": {}} for r in before]
    assert "crafter" not in ecompare.compare(grid, grid)  # other environments: no Crafter block


def test_a_paired_report_needs_the_same_episodes():
    assert paired_report([[]], [[], []])["score_delta"] is None


RECORDED = ROOT / "bench" / "results" / "crafter_random.json"


def test_the_recorded_random_agent_matches_the_papers():
    """bench/crafter_random.py at Crafter's settings: the paper's random agent (1.6%) lies in the score's interval."""
    from vlrl.envs.crafter import SETTINGS

    result = json.loads(RECORDED.read_text())
    low, high = result["score_ci95"]
    assert result["episodes"] >= 100 and low <= PAPER_RANDOM_SCORE <= high
    assert result["settings"] == ", ".join(f"{k}={v}" for k, v in SETTINGS.items())
    assert SETTINGS["length"] == 10000 and SETTINGS["max_actions"] == 1 and SETTINGS["area"] == 64
    assert crafter_report([e["achievements"] for e in result["per_episode"]])["score"] == result["score"]


@pytest.mark.slow
def test_the_random_agent_bench_replays_its_recorded_episodes():
    pytest.importorskip("crafter")
    sys.path.insert(0, str(ROOT / "bench"))
    from crafter_random import play_random

    recorded = json.loads(RECORDED.read_text())["per_episode"]
    for seed in (0, 1):
        assert play_random(seed) == recorded[seed]


def test_clustered_bootstrap_draws_whole_worlds():
    """K sampled episodes of one world are not independent: with `cluster=K` the score's interval comes from
    resampling worlds, so worlds that differ widely but whose episodes agree give a wider interval than the same
    episodes treated as independent; cluster 1 is the episode bootstrap as before, the same seeded draws."""
    from vlrl.envs.achievements import crafter_report, paired_report

    episodes = [["collect_wood", "place_table"]] * 4 + [[]] * 4 + [["collect_wood"]] * 4 + [[]] * 4  # 4 worlds x 4
    lone = crafter_report(episodes)
    worlds = crafter_report(episodes, cluster=4)
    assert lone["score"] == worlds["score"] and lone["rates"] == worlds["rates"]
    assert worlds["score_ci95"][1] - worlds["score_ci95"][0] > lone["score_ci95"][1] - lone["score_ci95"][0]
    assert crafter_report(episodes, cluster=1) == lone
    paired = paired_report([[]] * 16, episodes, cluster=4)
    assert paired["achievements"] == {} and paired["score_delta"] == worlds["score"]
    with pytest.raises(ValueError, match="worlds of 3"):
        crafter_report(episodes, cluster=3)
