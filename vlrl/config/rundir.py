"""`RunDir`: one run's directory, the one owner of its paths, its configuration guard and its config.

Every stage and command reads and writes a run through this object, so a file is named in one place and a run
directory is found the same way everywhere:

    config.toml  data_report.json  eval_before.jsonl  samples_before.jsonl  eval_images/  grpo_config.json
    train_log.jsonl  checkpoints/  eval_after.jsonl  samples_after.jsonl  comparison.json  plots/  report.html
    adapter/  export.json      merged16/  merged4/  gguf/
    episode_frames/{before,after}/seed-<seed>/t<turn>.png   (an episode run's observations)

    >>> run = RunDir("runs/demo")
    >>> run.eval_before.as_posix(), run.export_dir("gguf").as_posix()
    ('runs/demo/eval_before.jsonl', 'runs/demo/gguf')
"""

from __future__ import annotations

from pathlib import Path

from vlrl.base import distributed
from vlrl.base.errors import RunDirError
from vlrl.config import runfile as cfg

RUNS = Path("runs")  # where a run lands when no directory is named: runs/<the config's name>


class RunDir:
    """The directory of one run. Paths are attributes; `start()` claims it for a configuration, `config` reads the
    configuration it holds."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._claimed: str | None = None  # the configuration (its TOML) this object has claimed the directory for

    @classmethod
    def for_config(cls, config: cfg.RunConfig, path: str | Path | None = None) -> RunDir:
        """The run directory a command uses: `path` when given, else runs/<the config's name>. A path that is (or
        lies under) a file is refused at once, before anything loads."""
        path = Path(path) if path is not None else RUNS / config.name
        blocking = next((p for p in (path, *path.parents) if p.exists()), None)
        if blocking is not None and not blocking.is_dir():
            where = "is a file" if blocking == path else f"lies under {blocking}, a file"
            raise RunDirError(f"--run-dir {path} {where}; a run directory is a folder (made when missing): give a "
                              f"new or existing directory, e.g. runs/{config.name}.")
        return cls(path)

    @classmethod
    def of(cls, run_dir: str | Path | RunDir) -> RunDir:
        """`run_dir` as a RunDir (a path, or already one)."""
        return run_dir if isinstance(run_dir, RunDir) else cls(run_dir)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # --- the files of a run -----------------------------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.path / "config.toml"

    @property
    def data_report(self) -> Path:
        return self.path / "data_report.json"

    @property
    def eval_before(self) -> Path:
        return self.path / "eval_before.jsonl"

    @property
    def eval_after(self) -> Path:
        return self.path / "eval_after.jsonl"

    @property
    def samples_before(self) -> Path:
        """The sampled eval before training ([eval] samples = K draws per item, for pass@k)."""
        return self.path / "samples_before.jsonl"

    @property
    def samples_after(self) -> Path:
        return self.path / "samples_after.jsonl"

    @property
    def eval_images(self) -> Path:
        return self.path / "eval_images"

    def episode_frames(self, when: str) -> Path:
        """An episode run's saved observations of eval_<when>: episode_frames/<when>/seed-<seed>/t<turn>.png."""
        return self.path / "episode_frames" / when

    @property
    def grpo_config(self) -> Path:
        return self.path / "grpo_config.json"

    @property
    def train_log(self) -> Path:
        return self.path / "train_log.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def comparison(self) -> Path:
        return self.path / "comparison.json"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    @property
    def report(self) -> Path:
        return self.path / "report.html"

    @property
    def adapter(self) -> Path:
        return self.path / "adapter"

    @property
    def export_record(self) -> Path:
        return self.path / "export.json"

    def export_dir(self, fmt: str) -> Path:
        """Where `vlrl export --format fmt` writes: adapter/ for lora, else a folder named after the format."""
        return self.adapter if fmt == "lora" else self.path / fmt

    def eval_file(self, name: str) -> Path:
        """An eval record file of this run by its stem (eval_before, eval_adapter_sampled, ...)."""
        return self.path / f"{name}.jsonl"

    # --- the configuration ------------------------------------------------------------------------------------
    def start(self, config: cfg.RunConfig, *, action: str = "run") -> RunDir:
        """Claims the directory for `config`: creates it and writes config.toml. A directory that holds a run of
        another configuration is refused, since its records would mix with this one's; the same configuration
        continues where it stopped. Under several processes the main one claims it, and a refusal stops them all.
        Claimed once: starting it again for the same configuration (the stages, then `train.train`) does nothing."""
        text = cfg.to_toml(config)
        if self._claimed != text:
            distributed.on_main(self._claim, config, action)
            self._claimed = text
        return self

    def _claim(self, config: cfg.RunConfig, action: str) -> None:
        self.check_same(config, action=action)
        self.path.mkdir(parents=True, exist_ok=True)
        text = cfg.to_toml(config)
        if not self.config_file.exists() or self.config_file.read_text() != text:  # a finished run stays untouched
            self.config_file.write_text(text)

    def check_same(self, config: cfg.RunConfig, *, action: str = "run") -> None:
        """Raises RunDirError, naming every changed setting, when this directory holds another configuration's
        work. A run that stopped before any stage wrote its results (a model that would not load, an environment
        that refused its options) left only its config.toml: the corrected configuration takes the directory over."""
        if not self.has_results():
            return
        changed = cfg.differences(config, self.config_file)
        if changed:
            raise RunDirError(
                f"cannot {action} into {self.path}: it holds a run with a different configuration "
                f"({'; '.join(changed)}), whose records would mix with this one's. Use another --run-dir, delete "
                f"that directory, or use the run file it started with ({self.config_file}).")

    def has_results(self) -> bool:
        """Whether a stage has written anything here besides config.toml and data_report.json (which every run
        writes again before its first result): records, checkpoints, an adapter."""
        if not self.path.is_dir():
            return False
        return any(entry.name not in (self.config_file.name, self.data_report.name) for entry in self.path.iterdir())

    @property
    def config(self) -> cfg.RunConfig:
        """The configuration this run started with (config.toml), validated; RunDirError when there is none."""
        self.require(self.config_file, what="a run")
        return cfg.load(self.config_file)

    @property
    def name(self) -> str:
        """The run's name from its config.toml, or the directory's name when it has none."""
        if self.config_file.exists():
            return cfg.load(self.config_file).name
        return self.path.name

    def require(self, *paths: Path, what: str = "this command's input") -> None:
        """RunDirError naming what is missing and how to make it, unless every path exists."""
        if not self.path.is_dir():
            raise RunDirError(f"no run directory at {self.path}; give the --run-dir of a run (`vlrl run` makes one).")
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            names = ", ".join(str(Path(p).relative_to(self.path)) for p in missing)
            raise RunDirError(f"{self.path} holds no {names}, which {what} needs: the run has not reached that stage. "
                              "Finish it with `vlrl run` (or the command that writes it) first.")
