"""The decoding loop: a batch of tokenized contexts (pictures included) -> completions, for training rollouts, episode
turns and evals alike.

One prefill over the left-padded contexts, then one token per step for every row: the model's forward (compiled and
replayed as a CUDA graph over a static KV cache on a GPU, eager elsewhere), then `TokenChooser` picks each row's token
on the device. The host never waits for the device inside the loop except once every `CHECK_EVERY` steps, to see
whether every row has stopped: it queues the next steps while the GPU runs, so the Python work of a step is hidden
behind the device's instead of added to it (`transformers`' `generate` checks its stopping criteria every step).

The model inputs of each step are built by the model's own `prepare_inputs_for_generation` and
`_prepare_position_ids_for_generation`, which is what `generate` calls: multimodal position ids (Qwen-VL's M-RoPE),
the 4-D mask a static cache needs and the pictures dropped after the prefill come out as `generate` makes them, so
greedy decoding here gives `generate`'s tokens (tests/test_engine.py).
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field

import torch

from vlrl.engine.fusion import fused, recording
from vlrl.engine.sampling import Budget, TokenChooser

CHECK_EVERY = 8  # steps between the host's looks at "has every row stopped?": at most 7 wasted steps a batch
CACHE_BUCKET = 256  # a static cache's length is a multiple of this: one compiled graph serves many batches (a
# `Session`, whose contexts grow every turn, steps by its SESSION_CACHE_BUCKET instead)
RECOMPILE_LIMIT = 32  # compiled shapes per process (rows x cache length) before torch falls back to eager
STATIC_ON_CPU = False  # the static cache off CUDA (never compiled there): the tests run the GPU's code path on CPU


@dataclass(frozen=True)
class Decoding:
    """How one batch is decoded.

    Args:
        max_new_tokens: the completion budget; a completion that reaches it ends with finish reason "length".
        temperature: 0 decodes greedily; > 0 draws from softmax(logits / temperature), the whole vocabulary.
        stop_ids: the tokens that end a completion (kept in it, as a trained token).
        suppress_ids: tokens never produced (image and video placeholders: `vlrl.model.vision_tokens.vision_token_ids`).
        pad_id: written after a row has stopped.
        budget: the thinking budget, or None.
        static: a static KV cache sized to the batch's longest context plus `max_new_tokens` (rounded up to
            `cache_bucket`, at least `min_cache_length`) and compiled decoding (CUDA only); False: a dynamic cache,
            eager. Each (rows, cache length) pair is one compiled graph (about a minute at the 8B shape), so callers
            that know their contexts fix both: `min_cache_length` from the data set's longest prompt, `rows` from
            the batch size (smaller batches are padded with rows that attend to one pad token).
        record_logps: record each produced token's log-probability under the distribution it was drawn from.
        synced: the processes of a launch step together until every process's rows have stopped. Under FSDP or
            ZeRO-3 each forward gathers the sharded weights from every process, so a process that stopped early
            would leave the others waiting (`decoding_for` sets it for such a launch).
    """

    max_new_tokens: int
    temperature: float = 0.0
    stop_ids: tuple[int, ...] = ()
    suppress_ids: tuple[int, ...] = ()
    pad_id: int = 0
    budget: Budget | None = None
    static: bool = False
    record_logps: bool = False
    cache_bucket: int = CACHE_BUCKET
    min_cache_length: int = 0
    rows: int = 0
    synced: bool = False

    def cache_for(self, longest_context: int) -> int:
        """The static cache length for contexts of at most `longest_context` tokens (`cache_length`)."""
        return cache_length(longest_context, self.max_new_tokens, bucket=self.cache_bucket, least=self.min_cache_length)


@dataclass
class Decoded:
    """One batch's completions, in input row order."""

    tokens: list[list[int]]  # each cut after its stop token, which is kept
    stopped: list[bool]  # True: ended at a stop token ("stop"); False: reached max_new_tokens ("length")
    prompt_tokens: list[int]  # each context's real length (padding left out)
    logps: list[list[float]] | None = None  # per token of `tokens`, when recorded
    stats: dict = field(default_factory=dict)  # steps decoded, cache length, whether compiled, prefill_s, decode_s

    @property
    def finish_reasons(self) -> list[str]:
        return ["stop" if s else "length" for s in self.stopped]


def static_on(device: torch.device, decoding: Decoding) -> bool:
    """Whether `decoding` takes the static path on `device`: a static cache (compiled on CUDA; eager on a CPU only
    where `STATIC_ON_CPU` says so, for the tests)."""
    return decoding.static and (device.type == "cuda" or STATIC_ON_CPU)


def cache_length(longest_context: int, max_new_tokens: int, *, bucket: int = CACHE_BUCKET, least: int = 0) -> int:
    """The static KV cache's length for a batch: its longest context plus the completion budget (at least `least`),
    rounded up to a multiple of `bucket`, so batches of nearby lengths share one compiled decoding graph, and no
    more than that: every decoding step reads the whole static cache (16 rows x 1,536 tokens is 3.6 GB at the 8B
    shape, as much as its 4-bit weights), and the cache limits how many rows decode at once.

    >>> cache_length(300, 1024), cache_length(1500, 256), cache_length(2048, 0), cache_length(10, 10, least=700)
    (1536, 1792, 2048, 768)
    """
    needed = max(longest_context + max_new_tokens, least)
    return -(-needed // bucket) * bucket


def _all_stopped(stopped: torch.Tensor, synced: bool) -> bool:
    """Whether every row has stopped; `synced`: every row of every process of the launch."""
    done = stopped.all().to(torch.int32)
    if synced:
        torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MIN)
    return bool(done)


def decode(model, inputs: dict, decoding: Decoding) -> Decoded:
    """Decodes every row of `inputs` (the processor's batch: left-padded `input_ids` and `attention_mask`, and the
    pictures' `pixel_values`, `image_grid_thw`, `mm_token_type_ids`, on the model's device).

    Args:
        model: a transformers model or a PEFT model around one; put in eval mode for the call.
        inputs: the batch, as the processor returns it (left padding).
        decoding: how to decode (`Decoding`).

    Returns:
        `Decoded`: each row's tokens cut after its stop token, why it ended, its context length, and with
        `record_logps` each token's log-probability.
    """
    input_ids = inputs["input_ids"]
    static = static_on(input_ids.device, decoding)
    decoded, _ = run(model, decoding, lambda base: prefill(base, inputs, decoding, static=static),
                     rows=input_ids.shape[0])
    return decoded


@dataclass
class Prefilled:
    """A batch's state once its contexts are in the KV cache, as the decoding steps take it: the cache, the last
    context position's logits, each row's last position id, which cache slots each row attends to (`attend`: rows x
    slots, True for the slots of the completion too, a static cache's; or the 2-D mask of a dynamic one), the slot of
    the first new token, the contexts' ids (left-padded: the thinking budget looks for an open block in them), their
    real lengths, and rows that only pad the batch (stopped from the start)."""

    cache: object
    logits: torch.Tensor
    positions: torch.Tensor
    attend: torch.Tensor
    start: int
    prompt_ids: torch.Tensor
    prompt_tokens: list[int]
    padding_rows: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    tokens: torch.Tensor | None = None  # after `run`: every row's drawn tokens
    steps: int = 0  # after `run`: the decoding steps taken

    @property
    def written(self) -> int:
        """The cache slots written after `run`: the contexts' and every drawn token but the last (never fed)."""
        return self.start + self.steps - 1


def prefill(base, inputs: dict, decoding: Decoding, *, static: bool, cache=None) -> Prefilled:
    """The contexts of `inputs` (left-padded, on the model's device) through one forward into a new KV cache (a
    static one of `cache_length`'s length with `static`), or into `cache` (a static cache of the right length and
    rows, emptied first: `vlrl.engine.session` keeps one across calls); rows added up to `decoding.rows` pad a static
    batch to its compiled shape."""
    inputs = dict(inputs)
    input_ids, mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
    rows, width = input_ids.shape
    length = decoding.cache_for(width) if static else 0
    padding_rows = []
    if static and decoding.rows > rows:
        padding_rows = list(range(rows, decoding.rows))
        input_ids, mask, inputs = _pad_rows(input_ids, mask, inputs, decoding.rows - rows, decoding.pad_id)
    full_mask = torch.ones(input_ids.shape[0], width + decoding.max_new_tokens, dtype=mask.dtype, device=mask.device)
    full_mask[:, :width] = mask
    if cache is None or not length or cache.layers[0].max_cache_len != length:
        cache = _new_cache(base, length)
    else:
        cache.reset()
    positions = base._prepare_position_ids_for_generation(input_ids, {"attention_mask": mask, **inputs})
    step_inputs = base.prepare_inputs_for_generation(
        input_ids, past_key_values=cache, attention_mask=mask, position_ids=positions, use_cache=True,
        is_first_iteration=True, logits_to_keep=1, **inputs)
    with recording(base) if static and not decoding.synced else contextlib.nullcontext():
        logits = base(**step_inputs, return_dict=True).logits[:, -1]  # the prefill: eager, its shape varies
    attend = full_mask
    if length and masks_own(base):
        attend = torch.ones(input_ids.shape[0], length, dtype=torch.bool, device=mask.device)
        attend[:, :full_mask.shape[1]] = full_mask.bool()
    return Prefilled(cache=cache, logits=logits, positions=positions[..., -1:], attend=attend, start=width,
                     prompt_ids=input_ids, prompt_tokens=mask[:rows].sum(dim=1).tolist(), padding_rows=padding_rows,
                     stats={"cache_length": length, "prefilled": int(mask.sum())})


def run(model, decoding: Decoding, prefill_with, *, rows: int) -> tuple[Decoded, Prefilled]:
    """Decodes a batch: `prefill_with(base)` (a `Prefilled`) runs under the decode's modes, then one token per step
    for every row until each has stopped or the budget is spent. Returns the first `rows` rows' `Decoded` and the
    batch's state after the last step (its cache holds every fed token)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    device = next(base.parameters()).device
    cuda = device.type == "cuda"
    static = static_on(device, decoding)
    was_training = model.training
    model.eval()
    steps = fused_groups = 0
    marks = Marks(cuda)
    try:
        with torch.no_grad(), _decode_mode(base, static, cuda, decoding.synced):
            marks.mark()
            state = prefill_with(base)
            marks.mark()
            chooser = TokenChooser(state.prompt_ids, stop_ids=decoding.stop_ids, suppress_ids=decoding.suppress_ids,
                                   pad_id=decoding.pad_id, temperature=decoding.temperature, budget=decoding.budget,
                                   record_logps=decoding.record_logps)
            chooser.stopped[state.padding_rows] = True  # rows that pad the batch decode nothing and wait for no stop
            tokens = torch.full((state.prompt_ids.shape[0], decoding.max_new_tokens), decoding.pad_id,
                                dtype=torch.long, device=device)
            forward = _compiled_forward(base) if static and cuda else base.__call__
            step_mask = _step_mask(state.attend, static=bool(state.stats["cache_length"]))
            logits, positions, cache = state.logits, state.positions, state.cache
            grouping = static and not decoding.synced  # FSDP's flat parameters are not regrouped
            with fused(base) if grouping else contextlib.nullcontext(0) as fused_groups:
                for step in range(decoding.max_new_tokens):
                    token = chooser(logits)
                    tokens[:, step] = token
                    steps = step + 1
                    if steps == decoding.max_new_tokens or (steps % CHECK_EVERY == 0 and
                                                            _all_stopped(chooser.stopped, decoding.synced)):
                        break
                    positions = positions[..., -1:] + 1
                    # the new token sits at slot start + step: it sees its context and every token before it
                    step_inputs = base.prepare_inputs_for_generation(
                        token.unsqueeze(1), past_key_values=cache, attention_mask=step_mask(state.start + step),
                        position_ids=positions, use_cache=True, is_first_iteration=False, logits_to_keep=1)
                    if static and cuda:
                        torch.compiler.cudagraph_mark_step_begin()
                    logits = forward(**step_inputs, return_dict=True).logits[:, -1]
            marks.mark()
            state.tokens, state.steps = tokens, steps
    finally:
        model.train(was_training)
    stats = {"steps": steps, "compiled": static and cuda, "rows": state.prompt_ids.shape[0],
             "fused_groups": fused_groups, **state.stats}
    decoded = _collect(tokens[:rows, :steps], state.prompt_tokens[:rows], chooser, decoding, stats)
    decoded.stats["prefill_s"], decoded.stats["decode_s"] = marks.seconds()  # read once the tokens are on the host
    return decoded, state


class Marks:
    """The seconds between points of a decode without making the host wait inside it: CUDA events on the device's
    stream (read after the decode's tokens reach the host, which waited for them anyway), the host's clock on a CPU,
    whose work is done when its call returns. A decode's `prefill_s` (the pictures' encoder and the contexts' forward)
    and `decode_s` (its decoding steps, a first step's compiling included) in `Decoded.stats`."""

    def __init__(self, cuda: bool):
        self.cuda, self.points = cuda, []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.points.append(event)
        else:
            self.points.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """The seconds between each mark and the next."""
        if self.cuda:
            self.points[-1].synchronize()
            return [start.elapsed_time(end) / 1000 for start, end in zip(self.points, self.points[1:])]
        return [end - start for start, end in zip(self.points, self.points[1:])]


def masks_own(base) -> bool:
    """Whether the decoding steps' masks are made here (`_step_mask`): the model attends through SDPA or the grouped
    decoding attention, which take a 4-D boolean mask over the static cache's slots."""
    from vlrl.engine.attention import NAME

    return getattr(base.config.get_text_config(), "_attn_implementation", None) in ("sdpa", NAME)


def _step_mask(attend: torch.Tensor, *, static: bool):
    """A function of the new token's slot giving the mask its decoding step takes. Over a static cache whose masks
    are made here (`attend` covers its slots): the 4-D boolean mask transformers would build (True: attend), made
    on the device without a look at its values (transformers' own, `create_masks_for_generate`, asks whether any
    position is padding: a host sync every step). Otherwise the 2-D mask up to the new token."""
    if not static or attend.dtype != torch.bool:
        return lambda slot: attend[:, :slot + 1]
    slots = torch.arange(attend.shape[1], device=attend.device)
    return lambda slot: (attend & (slots <= slot))[:, None, None, :]


def _pad_rows(input_ids, mask, inputs: dict, extra: int, pad_id: int):
    """`extra` more rows that attend to one pad token and hold no picture: the batch keeps its compiled shape."""
    width = input_ids.shape[1]
    input_ids = torch.cat([input_ids, input_ids.new_full((extra, width), pad_id)])
    filler = mask.new_zeros((extra, width))
    filler[:, -1] = 1
    mask = torch.cat([mask, filler])
    if "mm_token_type_ids" in inputs:
        types = inputs["mm_token_type_ids"]
        inputs = {**inputs, "mm_token_type_ids": torch.cat([types, types.new_zeros((extra, width))])}
    return input_ids, mask, inputs


def _collect(tokens: torch.Tensor, prompt_tokens: list[int], chooser: TokenChooser, decoding: Decoding,
             stats: dict) -> Decoded:
    stops = set(decoding.stop_ids)
    cut, stopped = [], []
    for row in tokens.tolist():
        end = next((i for i, t in enumerate(row) if t in stops), None)
        cut.append(row if end is None else row[:end + 1])
        stopped.append(end is not None)
    logps = chooser.logps_of([len(c) for c in cut]) if decoding.record_logps else None
    return Decoded(tokens=cut, stopped=stopped, prompt_tokens=prompt_tokens, logps=logps, stats=stats)


def _new_cache(base, length: int):
    from transformers import DynamicCache, StaticCache

    if length:
        return StaticCache(config=base.config, max_cache_len=length)
    return DynamicCache(config=base.config)


def _compiled_forward(base):
    """The model's forward compiled as `generate` compiles it (inductor, CUDA graphs), cached on the model; the
    process-wide settings it needs are `compile_switches`'."""
    from transformers import CompileConfig

    return base.get_compiled_call(CompileConfig())


@contextlib.contextmanager
def compile_switches(base):
    """For the span of a compiled decode, the process-wide settings it needs, each back as it was on every way out
    (an exception included): dynamo's recompile limit at least `RECOMPILE_LIMIT` (one graph per batch rows x cache
    length), and a bitsandbytes 4-bit model's quantizer marked compileable (bitsandbytes >= 0.45 registers its
    kernels as torch ops, while transformers still calls its quantizer not compileable) through a subclass for this
    one instance, so other models in the process keep the library's answer and isinstance checks still hold."""
    quantizer = getattr(base, "hf_quantizer", None)
    cls, limit = type(quantizer), torch._dynamo.config.recompile_limit
    try:
        if quantizer is not None and not quantizer.is_compileable:
            quantizer.__class__ = _compileable(cls)
        torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
        yield
    finally:
        torch._dynamo.config.recompile_limit = limit
        if quantizer is not None:
            quantizer.__class__ = cls


@functools.cache
def _compileable(cls: type) -> type:
    # one subclass per quantizer class, the same object at every decode: a guard on the class still holds
    return type(cls.__name__, (cls,), {"is_compileable": property(lambda self: True)})


@contextlib.contextmanager
def _decode_mode(base, static: bool, cuda: bool, sharded: bool = False):
    """What a decode runs under: the model's own decode switches and, on the static path (the engine's own; the
    Unsloth backend decodes through its kernels instead), attention that reads each key/value head once
    (`vlrl.engine.attention`) and on a GPU autocast to the model's 16-bit dtype, as the trainer's forward runs
    (accelerate's mixed precision): the LoRA weights, kept in fp32 for the optimizer, then multiply in bf16 on the
    tensor cores instead of in fp32 (3.9 ms of a 15.5 ms step at the 8B shape, bench/results/engine.md), and the
    sampled tokens' log-probs come from the arithmetic the training forward uses; those weights rounded once per
    decode (`half_trainables`), not in every step. The process-wide settings a decode changes (`compile_switches`,
    gemlite's split-K sums: `vlrl.engine.weights.fp32_splitk_sums`) are back as they were when it ends, however."""
    from vlrl.engine.attention import grouped
    from vlrl.engine.weights import fp32_splitk_sums

    optimize = getattr(base, "_optimize_model_for_decode", None)
    half = static and cuda and base.dtype in (torch.bfloat16, torch.float16)
    with (optimize() if optimize is not None else contextlib.nullcontext(),
          compile_switches(base) if static and cuda else contextlib.nullcontext(),
          fp32_splitk_sums(),
          grouped(base) if static else contextlib.nullcontext(),
          torch.autocast("cuda", dtype=base.dtype) if half else contextlib.nullcontext(),
          half_trainables(base, base.dtype) if half and not sharded else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def half_trainables(model, dtype: torch.dtype):
    """For the span of the block, each fp32 trainable weight of `model` (the LoRA matrices, kept in fp32 for the
    optimizer) holds its value rounded to `dtype`, in a buffer kept on the parameter and refilled on each entry; on
    exit the fp32 tensors are back, untouched. Autocast rounds those weights the same way in every matmul, so the
    decode computes the same numbers: it rounds each once per decode instead of once per step (0.47 ms and ~500
    kernels of a 13 ms step at the 8B shape, bench/results/engine.md), and the buffers keep the addresses the
    step's CUDA graph was recorded with. Not for sharded parameters (FSDP's flat ones).

    >>> layer = torch.nn.Linear(4, 2)
    >>> with half_trainables(layer, torch.bfloat16):
    ...     layer.weight.dtype
    torch.bfloat16
    >>> layer.weight.dtype
    torch.float32
    """
    swapped = []
    try:  # a failure part-way (out of memory for the next buffer) puts back the weights already swapped
        with torch.no_grad():
            for weight in model.parameters():
                if not weight.requires_grad or weight.dtype != torch.float32:
                    continue
                rounded = getattr(weight, "_vlrl_rounded", None)
                if rounded is None or rounded.shape != weight.shape or rounded.device != weight.device \
                        or rounded.dtype != dtype:
                    rounded = weight._vlrl_rounded = torch.empty_like(weight, dtype=dtype)
                rounded.copy_(weight)
                swapped.append((weight, weight.data))
                weight.data = rounded
        yield
    finally:
        for weight, full in swapped:
            weight.data = full
