"""Decoding steps that read each shared input once: the LoRA layers a model calls on one and the same tensor (an
attention layer's q/k/v, an MLP's gate/up, a Gated DeltaNet layer's input projections) computed as one LoRA pair and,
over 8-bit packed bases (`vlrl.engine.weights`), one base matmul.

Why: a decoding step reads the weights once, so its time should be their bytes over the memory's bandwidth, but it
was spent in many small kernels: each LoRA layer costs its base matmul, two LoRA matmuls and an add. Seven layers a
decoder layer read four inputs, so grouping them by input leaves four base matmuls and four LoRA pairs where there
were seven, and the small key/value projections run inside a matmul wide enough to fill the GPU (the kernel counts
and times: bench/results/engine.md, "Each shared input read once").

How: the groups are found once per model, from one eager forward (the first static decode's prefill): consecutive
LoRA-layer calls on the same input tensor, outside the vision tower (`recording`). A group of packed bases has its
8-bit weights and scales laid out in one buffer, each layer's own buffers views of it (no memory added; training and
prefill still compute through each layer, on the same bytes); bf16 bases stay one matmul each (views would make a
saved model's tensors share storage). LoRA's A matrices are stacked and its B matrices put on a block diagonal, copied
when a decode starts (`fused`) into buffers kept across decodes (a CUDA graph's addresses hold). While `fused` is on,
the group's first layer computes every member's output with PEFT's arithmetic (only summation order differs); every
other forward runs each layer as PEFT does.

    with recording(model):            # once: the groups, from the call order of one forward
        logits = model(**prefill)
    with fused(model):                # the decoding steps
        logits = model(**step)
"""

from __future__ import annotations

import contextlib
import functools

import torch

from vlrl.engine.weights import VISION_MARKERS, PackedLinear

GROUPS = "_vlrl_input_groups"  # on the model: (the LoRA layers looked at, their groups), by `recording`
ENABLED = True  # False: every layer computes on its own (the tests compare the two)


class Group:
    """LoRA layers called on one input, in call order: `members`, with their adapter's name and output sizes."""

    def __init__(self, members: list, adapter: str):
        self.members = members
        self.adapter = adapter
        self.sizes = [m.base_layer.out_features for m in members]
        self.scaling = members[0].scaling[adapter]
        self.casts_delta_first = type(members[0]) is not _lora_classes()[0]
        self.base = _fuse_bases([m.base_layer for m in members])
        self.lora_a = self.lora_b = None
        self.active = False
        self.pending = None  # the followers' outputs, between the first member's call and theirs
        # each member's grouped forward, made once (a compiled decode's graph guards on its identity) and set on the
        # member only while the group is on: outside a decode the members run their class's forward, so the
        # compiled training layers (`vlrl.training.compiled_layers`) see no per-layer object and share one graph
        self.forwards = [functools.partial(_member_forward, self, index, member.forward)
                         for index, member in enumerate(members)]

    def start(self) -> bool:
        """Readies the group for a decode: False (it stays off) where PEFT would not compute every member with its
        one adapter (adapters disabled or merged, another adapter active)."""
        if any(m.disable_adapters or m.merged or list(m.active_adapters) != [self.adapter] for m in self.members):
            return False
        if self.base is not None and not _laid_out(self.base, [m.base_layer for m in self.members]):
            self.base = _fuse_bases([m.base_layer for m in self.members])  # the model was moved since
        a = [m.lora_A[self.adapter].weight for m in self.members]
        b = [m.lora_B[self.adapter].weight for m in self.members]
        ranks = [w.shape[0] for w in a]
        if self.lora_a is None or self.lora_a.dtype != a[0].dtype or self.lora_a.device != a[0].device:
            self.lora_a = torch.empty(sum(ranks), a[0].shape[1], dtype=a[0].dtype, device=a[0].device)
            self.lora_b = torch.zeros(sum(self.sizes), sum(ranks), dtype=a[0].dtype, device=a[0].device)
            for t in (self.lora_a, self.lora_b):
                _static(t)
        row = col = 0
        for wa, wb, rank, size in zip(a, b, ranks, self.sizes):
            self.lora_a[col:col + rank].copy_(wa)
            self.lora_b[row:row + size, col:col + rank].copy_(wb)
            row, col = row + size, col + rank
        for member, forward in zip(self.members, self.forwards):
            member.forward = forward
        self.active = True
        return True

    def stop(self) -> None:
        self.active, self.pending = False, None
        for member in self.members:
            member.__dict__.pop("forward", None)

    def compute(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every member's output for `x`, as PEFT's forward of each would give it."""
        lora = torch.nn.functional.linear(x.to(self.lora_a.dtype), self.lora_a)
        delta = torch.nn.functional.linear(lora, self.lora_b) * self.scaling
        if self.base is not None:
            return self._add(self.base(x), delta).split(self.sizes, dim=-1)
        parts = delta.split(self.sizes, dim=-1)
        return tuple(self._add(member.base_layer(x), part) for member, part in zip(self.members, parts))

    def _add(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The base's output plus the LoRA delta in the order of the members' PEFT class: `Linear` adds, then casts
        to the base's dtype; `Linear4bit` casts the delta first where autocast is off."""
        if self.casts_delta_first and not torch.is_autocast_enabled():
            return y + delta.to(y.dtype)
        return (y + delta).to(y.dtype)


def _member_forward(group: Group, index: int, original, x, *args, **kwargs):
    """A grouped LoRA layer's forward: PEFT's own unless the group is on; then the first member computes the group
    and each other member takes its part (its own forward if the first did not run before it)."""
    if not group.active or args or kwargs:
        return original(x, *args, **kwargs)
    if index == 0:
        outs = group.compute(x)
        group.pending = outs
        return outs[0]
    if group.pending is None:
        return original(x)
    out = group.pending[index]
    if index == len(group.members) - 1:
        group.pending = None
    return out


def _fuse_bases(bases: list) -> PackedLinear | None:
    """One `PackedLinear` over packed bases that share their input width, format and backend, one scale per output
    channel; each base's buffers become views of its buffers. None for other bases."""
    first = bases[0]
    if not all(isinstance(b, PackedLinear) and b.group == b.in_features == first.in_features and b.fmt == first.fmt
               and b.backend == first.backend and (b.bias is None) == (first.bias is None) for b in bases):
        return None
    with torch.no_grad():
        qweight = torch.cat([b.qweight for b in bases], dim=0)
        scales = torch.cat([b.scales for b in bases], dim=1)
        bias = None if first.bias is None else torch.cat([b.bias for b in bases])
        fused = PackedLinear(qweight, scales, bias, backend=first.backend)
        start = 0
        for b in bases:
            end = start + b.out_features
            b._buffers["qweight"] = qweight[start:end]
            b._buffers["scales"] = scales[:, start:end]
            if bias is not None:
                b._buffers["bias"] = bias[start:end]
            b._build_kernel()
            start = end
    for t in (qweight, scales):
        _static(t)
    return fused


def _laid_out(fused: PackedLinear, bases: list) -> bool:
    """Whether each base's weights are still the view of `fused`'s buffer they were made (a `.to()` of the model
    moves each buffer on its own)."""
    start = fused.qweight.data_ptr()
    for b in bases:
        if b.qweight.data_ptr() != start:
            return False
        start += b.qweight.numel() * b.qweight.element_size()
    return True


def _static(t: torch.Tensor) -> None:
    """Marks a tensor held outside the module tree as living at a fixed address, as parameters and buffers are, so a
    CUDA graph reads it in place instead of copying it in at every replay."""
    if t.is_cuda:
        torch._dynamo.mark_static_address(t)


def _lora_classes() -> tuple:
    """PEFT's LoRA layer classes whose forward `Group.compute` reproduces: `Linear` (over a plain or packed base) and,
    where bitsandbytes runs (CUDA), `Linear4bit`, which PEFT puts over a 4-bit base and keeps over its packing."""
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:
        return ()
    try:
        from peft.tuners.lora.bnb import Linear4bit
    except ImportError:  # no bitsandbytes, or no GPU for it
        return (Linear,)
    return Linear, Linear4bit


def _lora_layers(model) -> dict:
    """PEFT LoRA layers of `model` outside its vision tower (`_lora_classes`), with one vanilla adapter (no DoRA or
    other variant, no bias on B): {layer: adapter name}."""
    classes = _lora_classes()
    if not classes:
        return {}
    found = {}
    for name, m in model.named_modules():
        if type(m) not in classes or any(v in f".{name}." for v in VISION_MARKERS) or len(m.lora_A) != 1:
            continue
        adapter = next(iter(m.lora_A))
        if adapter not in m.lora_variant and m.lora_B[adapter].bias is None:
            found[m] = adapter
    return found


@contextlib.contextmanager
def recording(model):
    """Around one eager forward of `model`: if its groups are not known yet, records the order of its LoRA layers'
    calls and whether each shares the previous call's input, and builds the groups when the forward ends."""
    if not ENABLED:
        yield
        return
    layers = _lora_layers(model)
    seen = tuple(id(layer) for layer in layers)
    if getattr(model, GROUPS, (None,))[0] == seen:  # looked for already (LoRA added since: looked for again)
        yield
        return
    calls = []
    last = [None]

    def hook(module, args):
        x = args[0] if args else None
        calls.append((module, x is not None and x is last[0]))
        last[0] = x

    hooks = [layer.register_forward_pre_hook(hook) for layer in layers]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        last[0] = None
    setattr(model, GROUPS, (seen, _groups(calls, layers)))


def groups(model) -> list[Group]:
    """The groups `recording` last found in `model` (none before it has run)."""
    return getattr(model, GROUPS, (None, []))[1]


def _groups(calls: list, layers: dict) -> list[Group]:
    """Groups from the recorded calls: each run of consecutive calls on one input, two layers or more, each layer
    called once in the forward, one adapter and one scaling for the run."""
    counts = {}
    for module, _ in calls:
        counts[module] = counts.get(module, 0) + 1
    runs, run = [], []
    for module, shared in calls:
        if not shared and run:
            runs.append(run)
            run = []
        run.append(module)
    runs.append(run)
    groups = []
    for run in runs:
        adapters = {layers[m] for m in run}
        if len(run) < 2 or any(counts[m] != 1 for m in run) or len(adapters) != 1 or len({type(m) for m in run}) != 1:
            continue
        adapter = adapters.pop()
        if len({m.scaling[adapter] for m in run}) == 1:
            groups.append(Group(run, adapter))
    return groups


@contextlib.contextmanager
def fused(model):
    """For the span of the block, `model`'s groups (found by `recording`) compute as one; off again after."""
    live = [g for g in groups(model) if ENABLED and g.start()]
    try:
        yield len(live)
    finally:
        for g in live:
            g.stop()
