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


# --- an item's clip taken away ---------------------------------------------------------------------------------------

def clips(counts):
    """Rows with clips of the given frame counts, each frame's red channel naming its row and green its index, and
    each clip's metadata naming its row."""
    return datasets.Dataset.from_list(
        [{"id": str(i), "image": None, "video": [Image.new("RGB", (8, 6), (i, k, 0)) for k in range(n)],
          "video_metadata": {"fps": float(i + 1), "frames_indices": list(range(n)), "source": f"clip-{i}.mp4"}}
         for i, n in enumerate(counts)])


def test_blank_grays_every_frame_and_keeps_each_clips_length_and_timing():
    blank = pictures.replace_pictures(clips([8, 4]), "blank")
    assert [len(row["video"]) for row in blank] == [8, 4]
    assert {frame.getpixel((0, 0)) for row in blank for frame in row["video"]} == {pictures.GRAY}
    assert {frame.size for row in blank for frame in row["video"]} == {(8, 6)}  # the same video tokens
    assert [row["video_metadata"]["source"] for row in blank] == ["clip-0.mp4", "clip-1.mp4"]


def test_still_holds_the_middle_frame_for_the_whole_clip():
    still = pictures.replace_pictures(clips([8, 5, 1]), "still")
    # of 8 frames the 4th (index 3), of 5 the 3rd (index 2): one frame, no motion, as many frames as before
    assert [[frame.getpixel((0, 0))[:2] for frame in row["video"]] for row in still] == [
        [(0, 3)] * 8, [(1, 2)] * 5, [(2, 0)]]
    assert [row["video_metadata"]["frames_indices"] for row in still] == [list(range(8)), list(range(5)), [0]]


def test_shuffled_gives_each_item_another_clip_of_as_many_frames_with_its_timing():
    lines = []
    shuffled = pictures.replace_pictures(clips([8, 8, 4, 8, 3]), "shuffled", seed=2, log=lines.append)
    assert lines == ["shuffled clips: 2 of 5 items left out (no other item has as many frames)"]  # the 4 and the 3
    assert [row["id"] for row in shuffled] == ["0", "1", "3"]
    for row in shuffled:
        owners = {frame.getpixel((0, 0))[0] for frame in row["video"]}
        owner, = owners
        assert owner != int(row["id"]) and len(row["video"]) == 8
        assert [frame.getpixel((0, 0))[1] for frame in row["video"]] == list(range(8))  # its frames, in order
        assert row["video_metadata"]["source"] == f"clip-{owner}.mp4"  # the clip's own frame rate and name
        assert row["video_metadata"]["fps"] == owner + 1


def test_a_mode_for_the_other_kind_of_item_is_one_line_naming_the_right_one():
    from vlrl.base.errors import ConfigError

    with pytest.raises(ConfigError, match="these items have clips: --images still") as refused:
        pictures.replace_pictures(clips([8, 8]), "first")
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="these items have no clip: --images first"):
        pictures.replace_pictures(several([1, 2]), "still")


def test_compare_names_what_was_seen_of_a_clip_and_finds_the_sampled_checks(tmp_path):
    import json

    from vlrl.evaluation.compare import compare

    def rec(i, ok):
        return {"id": str(i), "correct": ok, "format_ok": True, "draws": [{"correct": ok}],
                "video": {"source": f"clip-{i}.mp4", "frames": 8}}

    files = {"samples_before": [rec(i, i < 5) for i in range(20)], "samples_after": [rec(i, i < 15) for i in range(20)],
             "samples_base_still": [rec(i, i % 2 == 0) for i in range(20)],
             "samples_adapter_still": [rec(i, i % 2 == 1) for i in range(20)]}
    for name, records in files.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    before, after = tmp_path / "samples_before.jsonl", tmp_path / "samples_after.jsonl"
    result = pictures.with_picture_checks(compare(before, after), before, after)
    check = result["without_picture"]["still"]
    assert check["clip"] and check["gain"] == pytest.approx(0.5) and check["gain_without"] == 0
    assert check["p_without"] == mcnemar_exact(10, 10) == 1.0
    line, = pictures.summary_lines(result)
    assert line.startswith("with one frame of the clip (its middle frame held): gain +0.0% against +50.0% with it on "
                           "20 items, 0% of it survives (McNemar p = 1); does the gain need the clip? paired permutation")
    verdict = "yes" if check["p_needs_picture"] < 0.05 else "not shown"  # 20 items: p = 0.099, too few to show it
    assert line.endswith(f"paired permutation p = {check['p_needs_picture']:.3g}: {verdict}")
