"""`vlrl env play` and `vlrl serve-env` from the command line: the files a model-free episode leaves (frames,
episode.jsonl, metrics.json, filmstrip.png), the same files for the same seed, a URL instead of a name, and one-line
errors."""

import json
import socket

import pytest
from PIL import Image

from vlrl.cli import main
from vlrl.envs.play import play

pytest.importorskip("crafter")

SMALL = ["--set", "size=64", "--set", "area=16"]


def test_env_play_writes_frames_steps_and_a_filmstrip(tmp_path, capsys):
    out = tmp_path / "play"
    out.mkdir()
    (out / "frame_099.png").write_bytes(b"old")  # an earlier, longer episode's frame goes
    assert main(["env", "play", "crafter", "--seed", "1", "--steps", "4", "--output", str(out), *SMALL]) == 0
    assert "crafter seed 1, random policy: 4 turns" in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("frame_*.png")) == [f"frame_00{i}.png" for i in range(5)]
    assert Image.open(out / "frame_000.png").size == (64, 64)
    lines = [json.loads(line) for line in (out / "episode.jsonl").read_text().splitlines()]
    assert lines[0]["reset"] == 1 and lines[0]["text"].startswith("Vitals:") and lines[0]["frame"] == "frame_000.png"
    assert [line["turn"] for line in lines] == [0, 1, 2, 3, 4]
    step = lines[1]
    assert step["reply"].startswith("<SOLUTION>") and len(step["info"]["actions"]) == 1
    assert {"reward", "done", "info", "text", "frame"} <= set(step)
    assert json.loads((out / "metrics.json").read_text())["length"] == 4
    assert Image.open(out / "filmstrip.png").width > 5 * 64


def test_the_same_seed_gives_the_same_episode_and_a_noop_policy_waits(tmp_path):
    first = play("crafter", seed=2, steps=6, output=tmp_path / "a", options={"size": 64, "area": 16})
    again = play("crafter", seed=2, steps=6, output=tmp_path / "b", options={"size": 64, "area": 16})
    assert first == again
    assert (tmp_path / "a" / "episode.jsonl").read_text() == (tmp_path / "b" / "episode.jsonl").read_text()
    play("crafter", seed=2, policy="noop", steps=2, output=tmp_path / "c", options={"size": 64, "area": 16})
    lines = (tmp_path / "c" / "episode.jsonl").read_text().splitlines()
    assert [json.loads(line).get("reply") for line in lines] == [None] + ["<SOLUTION>noop</SOLUTION>"] * 2


def test_env_play_runs_on_a_served_environment(tmp_path):
    from vlrl.envs.server import make_server

    with make_server("crafter", {"size": 64, "area": 16}, port=0) as server:
        url = server.url
        assert play(url, seed=1, steps=3, output=tmp_path / "remote") == play(
            "crafter", seed=1, steps=3, output=tmp_path / "local", options={"size": 64, "area": 16})
        assert ((tmp_path / "remote" / "frame_003.png").read_bytes()
                == (tmp_path / "local" / "frame_003.png").read_bytes())
        assert server.service.health()["sessions"] == 0  # play closed its session


@pytest.mark.parametrize("argv,words", [
    (["env", "play", "crafter", "--set", "size=4"], "size must be a whole number in 16..1024, got 4"),
    (["env", "play", "crafter", "--set", "sizes"], "'sizes' is not key=value"),
    (["env", "play", "chess"], "unknown environment 'chess'"),
    (["env", "play", "http://127.0.0.1:{port}"], "no environment server answered at http://127.0.0.1:{port}"),
    (["env", "play", "crafter", "--steps", "-1"], "steps must be a whole number >= 0"),
    (["serve-env", "crafter", "--set", "colour=red"], "has no option 'colour'"),
    (["serve-env", "crafter", "--port", "{busy}", *SMALL], "cannot listen on 127.0.0.1:{busy}"),
])
def test_env_commands_fail_with_one_line(argv, words, tmp_path, capsys):
    with socket.socket() as free, socket.socket() as busy:
        free.bind(("127.0.0.1", 0))
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ports = {"port": free.getsockname()[1], "busy": busy.getsockname()[1]}
        free.close()
        argv = [a.format(**ports) for a in argv] + (["--output", str(tmp_path)] if argv[0] == "env" else [])
        assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vlrl {argv[0]}: ") and words.format(**ports) in err and "Traceback" not in err
