"""`vlrl validate` builds what is cheap (the environment reset once, a server's /health, a local source's first
rows), environment options are checked in one place for every command, and every failure a user can cause is one
line (issue 33, point 4)."""

import json
import time
import types
import urllib.error
import urllib.request

import pytest

from vlrl.base.errors import ConfigError, VlrlError
from vlrl.cli import main
from vlrl.config import runfile as cfg
from vlrl.config.preflight import first_rows, health_problem, preflight
from vlrl.envs import make, option_problems

BAD_SIZE = "grid: size must be a whole number in 2..64, got 'abc'"


def _error_line(capsys, command: str) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"vlrl {command}: "), captured.err
    return lines[0]


def test_a_new_users_bad_option_is_refused_by_validate_and_run_leaves_nothing(tmp_path, capsys):
    """As a new user hit it: size="abc" passed `vlrl validate`, then `vlrl run` died in a TypeError traceback and
    left a config.toml that refused the corrected rerun."""
    bad = ["--preset", "grid-tiny", "--set", 'env.options={size="abc"}']
    assert main(["validate", *bad]) == 1
    assert BAD_SIZE in _error_line(capsys, "validate")
    run_dir = tmp_path / "run"
    assert main(["run", *bad, "--run-dir", str(run_dir)]) == 1
    assert BAD_SIZE in _error_line(capsys, "run")
    assert not run_dir.exists()  # refused on reading the configuration: nothing claims the directory


# grid-tiny's LoRA on the output layer, which TRL 1.16 refuses (`validation.head_adapter_problem`), on the layers here:
# these tests check the environment, on either end of the TRL range
LAYERS = ("--set", 'model.lora_targets="layers"')


def test_validate_builds_the_environment_and_resets_it_once(capsys):
    assert main(["validate", "--preset", "grid-tiny", *LAYERS]) == 0
    out = capsys.readouterr().out
    assert "grid-tiny: ok" in out and "environment 'grid': built and reset to seed 0 (a 64x64 picture, 4 actions)" in out


def test_one_check_of_environment_options_for_every_command(capsys):
    """validate (the run file's rules), run and env play (make), and serve-env (its 400) say the same line."""
    config = cfg.preset("grid-tiny")
    assert option_problems("grid", {"size": "abc"}) == [BAD_SIZE]
    config.env.options = {"size": "abc"}
    from vlrl.config.validation import problems_of

    assert f"[env] options: {BAD_SIZE}" in problems_of(config)
    with pytest.raises(ConfigError, match="size must be a whole number"):
        make("grid", size="abc")
    assert main(["env", "play", "grid", "--set", "size=abc"]) == 1
    assert BAD_SIZE in _error_line(capsys, "env")
    from vlrl.envs.sessions import EnvService, Refused

    with pytest.raises(Refused) as refused:
        EnvService("grid", {}).reset({"seed": 0, "options": {"size": "abc"}})
    assert refused.value.status == 400 and str(refused.value) == BAD_SIZE


def test_a_server_answers_a_refused_option_with_400_and_validate_asks_it():
    from vlrl.envs.server import make_server

    server = make_server("grid", {}, port=0).start()
    try:
        request = urllib.request.Request(server.url + "/reset", method="POST",
                                         data=json.dumps({"seed": 0, "options": {"size": "abc"}}).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=10)
        assert answer.value.code == 400 and json.loads(answer.value.read())["error"] == BAD_SIZE
        config = cfg.preset("grid-tiny")
        config.env.name, config.env.options, config.model.lora_targets = server.url, {}, "layers"
        checked, problems = preflight(config)
        assert problems == [] and "answered /health" in checked[1]  # after the model's line
        config.env.options = {"size": "abc"}  # a served environment's options are the server's to check
        checked, problems = preflight(config)
        assert len(problems) == 1 and "refused them (400)" in problems[0] and BAD_SIZE in problems[0]
    finally:
        server.stop()


def test_an_unreachable_server_is_one_line_within_the_timeout(capsys):
    started = time.monotonic()
    assert main(["validate", "--preset", "grid-tiny", *LAYERS, "--set", 'env.name="http://127.0.0.1:9"']) == 1
    line = _error_line(capsys, "validate")
    assert "no environment server answered at http://127.0.0.1:9/health" in line and "vlrl serve-env" in line
    assert "--" not in line  # no flag of another command (tests/test_first_hour.py's rule)
    assert time.monotonic() - started < 10
    assert health_problem("openenv-nowhere:1", timeout=0.5) is not None  # a malformed address is a line too


def test_validate_reads_the_first_rows_of_local_data_and_never_the_hub(capsys):
    assert main(["validate", "tiny", "--set", 'data.source="data/mathvista_sample"',
                 "--set", 'data.split="testmini"']) == 0
    assert "[data] source = 'data/mathvista_sample': first 8 rows read, 8 usable" in capsys.readouterr().out
    assert main(["validate", "tiny", "--set", 'data.source="data/mathvista_sample"', "--set", 'data.split="testmini"',
                 "--set", 'data.columns={question="prompt_text"}']) == 1
    line = _error_line(capsys, "validate")
    assert "its first 8 rows (split 'testmini') has no usable row" in line and "no column 'prompt_text'" in line
    config = cfg.preset("qwen3-vl-8b-mathvista")  # hub data sets: noted, not read (the test runs with the hub offline too)
    checked, problems = preflight(config)
    data_lines = [line for line in checked if line.startswith(("[data]", "[eval]"))]
    assert all("not read (a hub id" in line for line in data_lines) and len(data_lines) == 2
    # its hub model: asked once, in the local hub cache or answered for, else one line (no hub here: tests/test_new_user.py)
    assert problems == [] or (len(problems) == 1 and problems[0].startswith("[model] name_or_path = "))


def test_first_rows_reads_each_local_layout_without_the_rest(tmp_path):
    rows, root = first_rows("data/virl39k_sample", "train", 3)  # ViRL39K's parquet table
    assert len(rows) == 3 and "qid" in rows[0] and root.name == "virl39k_sample"
    (tmp_path / "mine.jsonl").write_text('{"question": "q1", "answer": "1"}\nnot json\n{"question": "q3"}\n')
    rows, root = first_rows(tmp_path / "mine.jsonl", "train", 2)
    assert rows[0]["answer"] == "1" and "__invalid__" in rows[1] and root == tmp_path.resolve()
    (tmp_path / "data.csv").write_text("question,answer\nq,1\n")
    assert first_rows(tmp_path / "data.csv", "train", 2) is None  # read whole by `vlrl run`, through datasets


def test_a_4bit_model_without_cuda_and_an_unknown_family_are_one_line(tmp_path, capsys):
    import torch

    from vlrl.model.loading import family_of, load_model

    if torch.cuda.is_available():
        pytest.skip("this machine has the GPU a 4-bit model needs")
    with pytest.raises(VlrlError, match="load_in_4bit needs a CUDA GPU"):
        load_model(str(tmp_path), load_in_4bit=True)  # refused before anything in the directory is read
    with pytest.raises(ConfigError, match="unsupported model family 'llava'"):
        family_of(types.SimpleNamespace(config=types.SimpleNamespace(model_type="llava")))
