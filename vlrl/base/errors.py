"""The one error family of vlrl: `VlrlError` and its kinds, each a failure a user can act on.

Every message names what was wrong, the value that was found and the fix, so the CLI prints it as it is (one
line, exit 1) and never a traceback. Each kind also subclasses the built-in error it refines (`ValueError`,
`RuntimeError`), so code written against those keeps working.

    >>> try:
    ...     raise DataError("data/x has no usable row")
    ... except VlrlError as err:
    ...     print(f"{err.kind}: {err}")
    data: data/x has no usable row
"""

from __future__ import annotations


class VlrlError(Exception):
    """A failure vlrl explains: the message says what, which value, and the fix. `kind` names the family member."""

    kind = "error"


class ConfigError(VlrlError, ValueError):
    """A run configuration that cannot work. `problems` holds every problem found (one line each)."""

    kind = "config"

    def __init__(self, message: str | list[str]):
        self.problems = [message] if isinstance(message, str) else list(message)
        text = self.problems[0] if len(self.problems) == 1 else (
            f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems))
        super().__init__(text)


class DataError(VlrlError, ValueError):
    """A data source that cannot be used at all, or data that does not line up (a reward column of the wrong
    length, a training item in the eval set)."""

    kind = "data"


class RunDirError(VlrlError, ValueError):
    """A run directory that does not hold what the command needs, or holds another configuration's run."""

    kind = "run directory"


class EvalError(VlrlError, ValueError):
    """Records that cannot be evaluated or compared (a damaged line, duplicate ids, mixed decoding settings)."""

    kind = "eval"


class ExportError(VlrlError, RuntimeError):
    """An export that failed its verification, or cannot start (no adapter, an untrained one)."""

    kind = "export"


class EnvError(VlrlError, RuntimeError):
    """An environment that cannot be reached or answers wrongly (a `vlrl serve-env` server that is down, a request
    it refused), named by its address."""

    kind = "environment"


class MissingExtra(VlrlError, ImportError):
    """An optional dependency that is not installed; the message names the extra: pip install 'vlrl[gpu]'."""

    kind = "missing extra"


def out_of_memory(err: BaseException) -> str | None:
    """The one line a CUDA out-of-memory error becomes (torch's `OutOfMemoryError`, matched by name so this module
    imports no torch), with the settings that lower memory; None for any other error."""
    if type(err).__name__ != "OutOfMemoryError":
        return None
    return (f"out of GPU memory ({str(err).splitlines()[0][:200]}). What was written stays (records, checkpoints). "
            "Lower [training] generation_batch_size, per_device_train_batch_size or max_completion_length, or [data] "
            "max_pixels; [model] memory_cap_gib shows on a larger card what a smaller one holds.")
