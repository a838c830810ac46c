"""Does a gain need the picture? `vlrl.evaluation.pictures`: the pictures taken away, and what of the gain survives.
(The CLI end to end, on the tiny run: tests/test_run.py.)"""

import datasets
import pytest
from PIL import Image

from vlrl.base.stats import mcnemar_exact, paired_permutation
from vlrl.evaluation import pictures


def several(counts):
    """Rows with `images` lists of the given lengths, each picture's red channel naming its row."""
    return datasets.Dataset.from_list(
        [{"id": str(i), "images": [Image.new("RGB", (6 + k, 4), (i, k, 0)) for k in range(n)]}
         for i, n in enumerate(counts)])


def test_blank_keeps_every_item_and_each_pictures_size():
    blank = pictures.replace_pictures(several([1, 2, 3]), "blank")
    assert [len(row["images"]) for row in blank] == [1, 2, 3]
    assert [im.size for im in blank[2]["images"]] == [(6, 4), (7, 4), (8, 4)]  # the same image tokens
    assert {im.getpixel((0, 0)) for row in blank for im in row["images"]} == {pictures.GRAY}


def test_shuffled_gives_each_item_another_items_pictures_and_counts_the_rest():
    lines = []
    shuffled = pictures.replace_pictures(several([2, 1, 2, 2, 3, 1]), "shuffled", seed=3, log=lines.append)
    assert lines == ["shuffled pictures: 1 of 6 items left out (no other item has as many pictures)"]  # the 3
    assert [row["id"] for row in shuffled] == ["0", "1", "2", "3", "5"]
    for row in shuffled:
        owners = {im.getpixel((0, 0))[0] for im in row["images"]}
        assert len(owners) == 1 and owners != {int(row["id"])}  # all from one other item, never its own
        assert len(row["images"]) == len(several([2, 1, 2, 2, 3, 1])[int(row["id"])]["images"])


def test_shuffled_is_seeded():
    def owners(seed):
        return [row["images"][0].getpixel((0, 0))[0]
                for row in pictures.replace_pictures(several([1] * 6), "shuffled", seed=seed)]

    assert owners(0) == owners(0) and sorted(owners(0)) == list(range(6))


def test_picture_check_against_the_counts_written_out():
    rec = lambda i, ok: {"id": str(i), "correct": ok, "format_ok": True}
    before = [rec(i, i < 2) for i in range(20)]                   # 2 right
    after = [rec(i, i < 12) for i in range(20)]                   # 12 right: +10 items
    before_blank = [rec(i, i < 2) for i in range(20)]             # the same 2 right without the picture
    after_blank = [rec(i, i < 5 or i == 19) for i in range(20)]   # 3 gained (2, 3, 4) and 19: +4 items
    c = pictures.picture_check(before, after, before_blank, after_blank, "blank")
    assert c["n_paired"] == 20
    assert c["gain"] == pytest.approx(0.5) and c["gain_without"] == pytest.approx(0.2)
    assert c["surviving_share"] == pytest.approx(0.4)
    assert c["p_without"] == mcnemar_exact(4, 0)
    # per item: gain with the picture minus gain without; items 5..11 gained only with it, item 19 only without
    assert c["p_needs_picture"] == paired_permutation([1] * 7 + [-1])


def test_compare_finds_the_checks_beside_the_after_file(tmp_path):
    import json

    rec = lambda i, ok: {"id": str(i), "correct": ok, "format_ok": True}
    files = {"eval_before": [rec(i, False) for i in range(10)], "eval_after": [rec(i, True) for i in range(10)],
             "eval_base_shuffled": [rec(i, False) for i in range(10)],
             "eval_adapter_shuffled": [rec(i, i < 9) for i in range(10)]}
    for name, records in files.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    from vlrl.evaluation.compare import compare

    before, after = tmp_path / "eval_before.jsonl", tmp_path / "eval_after.jsonl"
    result = pictures.with_picture_checks(compare(before, after), before, after)
    assert list(result["without_picture"]) == ["shuffled"]  # no blank evals there
    assert result["without_picture"]["shuffled"]["surviving_share"] == pytest.approx(0.9)
    line, = pictures.summary_lines(result)
    assert line.startswith("without the picture (shuffled): gain +90.0% against +100.0% with it on 10 items, 90%")
