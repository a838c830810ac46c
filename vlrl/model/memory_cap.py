"""A hard cap on this process's GPU memory, so a run on a large card shows what a smaller card would hold.

    cap_memory(23.0)   # [model] memory_cap_gib = 23: at most 23 GiB, the CUDA context counted, as on a 24 GB card

PyTorch's caching allocator refuses any allocation past `torch.cuda.set_per_process_memory_fraction` of the card with
its out-of-memory error, as a card of that size would. The cap counts what already sits on the card outside the
allocator when it is set (this process's CUDA context, and any other process) against the budget, as a smaller card
would have to hold it too. CUDA libraries loaded later (cuBLAS workspaces, kernel images) are not counted: nvidia-smi
shows the whole process, and the benchmark that cites a cap reads it there.
"""

from __future__ import annotations

from vlrl.base.errors import ConfigError

GIB = 2**30


def cap_fraction(cap_bytes: float, total: int, free: int, reserved: int) -> float:
    """The allocator's share of the card that keeps everything on it within `cap_bytes`.

    Args:
        cap_bytes: the budget for the whole card as this process sees it.
        total, free: `torch.cuda.mem_get_info()` (bytes).
        reserved: what this process's allocator holds already (`torch.cuda.memory_reserved()`).

    Raises:
        ConfigError: the card holds the budget already outside the allocator, or the cap exceeds the card.

    >>> round(cap_fraction(23 * GIB, 140 * GIB, 139 * GIB, 0), 4)   # 1 GiB outside the allocator: 22 GiB of 140
    0.1571
    """
    outside = total - free - reserved
    if cap_bytes > total:
        raise ConfigError(f"[model] memory_cap_gib = {cap_bytes / GIB:g} is more than this GPU has "
                          f"({total / GIB:.1f} GiB); set a smaller cap, or 0 for none.")
    if cap_bytes <= outside:
        raise ConfigError(f"[model] memory_cap_gib = {cap_bytes / GIB:g}: {outside / GIB:.1f} GiB of this GPU is in "
                          "use outside this process's allocator already (its CUDA context, other processes); set a "
                          "larger cap.")
    return (cap_bytes - outside) / total


def cap_problem(cap_gib: float) -> str | None:
    """What is wrong with `[model] memory_cap_gib` in one line (`vlrl validate` and `cap_memory` both say it), or None.

    >>> cap_problem(23) is None, cap_problem(-1)[:36]
    (True, '[model] memory_cap_gib = -1 must be ')
    """
    return None if cap_gib >= 0 else f"[model] memory_cap_gib = {cap_gib:g} must be 0 (no cap) or a size in GiB, e.g. 23."


def cap_memory(cap_gib: float, log=print) -> dict | None:
    """Caps this process's GPU memory at `cap_gib` GiB (0: no cap). Call it once, before the model loads.

    Returns:
        None without a cap; else `cap_gib`, `outside_gib` (the context and anything else on the card when it was
        set) and `allocator_gib` (what the allocator may reserve).

    Raises:
        ConfigError: a cap on a machine without a CUDA GPU, a negative cap, or one `cap_fraction` refuses.
    """
    if not cap_gib:
        return None
    import torch

    if cap_problem(cap_gib):
        raise ConfigError(cap_problem(cap_gib))
    if not torch.cuda.is_available():
        raise ConfigError(f"[model] memory_cap_gib = {cap_gib:g} caps a CUDA GPU's memory, and this machine has none; "
                          "leave it 0 on CPU.")
    device = torch.cuda.current_device()
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device)
    fraction = cap_fraction(cap_gib * GIB, total, free, reserved)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    cap = {"cap_gib": cap_gib, "outside_gib": round((total - free - reserved) / GIB, 3),
           "allocator_gib": round(fraction * total / GIB, 3)}
    log(f"memory cap: {cap_gib:g} GiB on this GPU ({cap['outside_gib']:.2f} GiB already outside the allocator, "
        f"{cap['allocator_gib']:.2f} GiB for it)")
    return cap
