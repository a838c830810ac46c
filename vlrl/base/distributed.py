"""Several processes of one run (`accelerate launch`, torchrun): which process this is, the main one that writes the
run directory, and the few collective steps vlrl needs around TRL's own (waiting, gathering, sharing an outcome).

    accelerate launch --num_processes 2 -m vlrl run --preset tiny     # docs/multi-gpu.md

Outside a launch every helper is the one-process case (rank 0 of 1, the main process, nothing to wait for) and
imports nothing. Inside one, the process group is accelerate's (`PartialState`, gloo on CPU, NCCL on GPUs): the one
the trainer joins later, started here when vlrl needs it first.

    >>> world_size(), rank(), is_main()
    (1, 0, True)
    >>> on_main(sum, [1, 2, 3])
    6
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ACCELERATE_CONFIGS = ("ddp", "fsdp", "zero3")  # shipped in vlrl/accelerate_configs/, described in docs/multi-gpu.md


def accelerate_config(name: str) -> Path:
    """The path of a shipped `accelerate launch --config_file`: "ddp", "fsdp" or "zero3".

    >>> accelerate_config("ddp").name
    'ddp.yaml'
    """
    if name not in ACCELERATE_CONFIGS:
        from vlrl.base.errors import ConfigError

        raise ConfigError(f"no shipped accelerate config {name!r}; choose one of {', '.join(ACCELERATE_CONFIGS)}.")
    return Path(__file__).resolve().parents[1] / "accelerate_configs" / f"{name}.yaml"


def sharded_launch() -> str | None:
    """The engine that shards the weights in this launch, "FSDP" or "DeepSpeed" (accelerate launch says so in each
    process's environment); None for DDP and for one process."""
    for variable, name in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "").lower() in ("1", "true"):
            return name
    return None


def world_size() -> int:
    """The processes of this launch: `accelerate launch` and torchrun set WORLD_SIZE in each; 1 otherwise."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank() -> int:
    """This process's index in the launch (RANK), 0 outside one."""
    return int(os.environ.get("RANK", "0") or 0) if world_size() > 1 else 0


def local_rank() -> int:
    """This process's index on its machine (LOCAL_RANK): the GPU it owns. 0 outside a launch."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0) if world_size() > 1 else 0


def is_main() -> bool:
    """Whether this process writes the run directory (the launch's rank 0)."""
    return rank() == 0


def print_main(*args, **kwargs) -> None:
    """`print` on the main process only: the other processes run the same stages and would repeat every line."""
    if is_main():
        print(*args, **{"flush": True, **kwargs})


def _group():
    """torch.distributed, its process group started (accelerate's, so the trainer's Accelerator reuses it)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())  # gloo on CPU (as TRL's use_cpu), NCCL on GPUs
    return dist


def end(exit_code: int | None = None) -> None:
    """Leaves the launch's process group, the last thing a launched process does (nothing outside a launch, or when
    no group was started); given an exit code, a process that left its group then exits with it at once.

    Left to the interpreter's exit, torch 2.14's gloo group aborts a process now and then ("terminate called without
    an active exception", SIGABRT; a 2-process launch on CPU of a script that only broadcasts and exits: 6 of 17
    launches, 0 of 8 with the group left), and the launcher then stops the other processes: a finished run fails.
    Leaving the group is not always enough: with the group left, the tests' 2-process runs still aborted after their
    last line, in the interpreter's teardown (CI, once; the episode run here, 1 of 6 launches). So a launched process
    that finished runs Python's exit handlers (the trackers', logging's), flushes its output and ends with
    `os._exit`, skipping the teardown (the episode run: 0 aborts in 10 launches, each ~2 s shorter); vlrl closes
    what it writes before."""
    if world_size() == 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():  # no group, no teardown to skip
        return
    dist.destroy_process_group()
    if exit_code is not None:
        import atexit
        import sys

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(exit_code)


def barrier() -> None:
    """Waits until every process of the launch gets here."""
    if world_size() > 1:
        _group().barrier()


@contextlib.contextmanager
def main_first():
    """The block runs on the main process first and on the others after it, e.g. building a cache they then read
    (the warm-started tiny model, a data set's download) instead of every process building it at once."""
    if not is_main():
        barrier()
    try:
        yield
    finally:
        if is_main():
            barrier()


def all_gather(value) -> list:
    """Every process's `value` (any picklable object), in rank order, on every process."""
    if world_size() == 1:
        return [value]
    out = [None] * world_size()
    _group().all_gather_object(out, value)
    return out


def all_sum(values: list[float]) -> list[float]:
    """Each number summed over the processes (the same list length on each), on every process.

    >>> all_sum([1, 2.5])
    [1, 2.5]
    """
    if world_size() == 1:
        return values
    return [sum(column) for column in zip(*all_gather(list(values)))]


def gathered_lora(model) -> dict:
    """The model's LoRA weights whole, on the CPU of every process, from the shards each holds under FSDP (DTensors).
    A collective: every process calls it, in the same order. Plain tensors (one process, DDP) are copied as they are.
    """
    from torch.distributed.tensor import DTensor

    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
            for name, p in model.state_dict().items() if "lora_" in name}


def on_main(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on the main process only (what writes the run directory). Every process returns its
    result (None on the others when it cannot be pickled) or raises its error, so a refusal (another
    configuration's run, a failed check) stops every process at once instead of leaving them waiting."""
    if world_size() == 1:
        return fn(*args, **kwargs)
    result = error = None
    if is_main():
        try:
            result = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - shared with the others below, then raised here as it was
            error = err
    shared = [(result if _picklable(result) else None,
               error if _picklable(error) else RuntimeError(f"the main process failed: {error!r}"))]
    _group().broadcast_object_list(shared, src=0)
    if is_main():
        if error is not None:
            raise error
        return result
    if shared[0][1] is not None:
        raise shared[0][1]
    return shared[0][0]


def _picklable(value) -> bool:
    import pickle

    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - whatever fails to pickle is sent as a description (or None) instead
        return False
    return True
