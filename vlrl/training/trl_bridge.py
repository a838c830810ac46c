"""The one place vlrl touches TRL's private surface: every private name of TRL (or transformers' Trainer) that vlrl's
trainer relies on is named here and nowhere else, and checked when this module is imported.

Importing it checks, against the TRL installed, each private method vlrl hooks (its name and the parameters vlrl
passes it), each private attribute it reads, and each helper it calls; a missing one stops the import with one line
naming the TRL version and the name (`TrlSurfaceError`), before any trainer is built, never deep inside a step. It is
imported where the trainer is built (`vlrl.training.train.build_trainer`), after the model is loaded (Unsloth first).

`TrlHooks` sits between vlrl's mixins and TRL's GRPOTrainer (`trainer_class`): each private hook of TRL calls a
public method of the same job, which by default does what TRL does, so a mixin overrides a public name and reaches
TRL's own through `super()`:

| vlrl's method | TRL's hook (1.14.2 .. 1.16.0) | what for |
|---|---|---|
| `generate_rollouts` | `_generate_single_turn` | vlrl's decoding engine for rollouts (`rollout_func` would return token ids only, and TRL would restore the dataset row's images) |
| `generate_and_score` | `_generate_and_score_completions` | dynamic sampling's redraws |
| `score_rewards` | `_calculate_rewards` | the weighted rewards dynamic sampling reads |
| `step_inputs` | `_prepare_inputs` | an episode run's batch (`buffered_batches`, `micro_step`) |
| `policy_loss` | `_compute_loss` | vlrl's GSPO loss (`vlrl.training.loss`), the mismatch measured on its forward |
| `token_logps` | `_get_per_token_logps_and_entropies` | placeholders masked; an episode segment's one forward; a video item's clip |
| `tokenize_prompts` | `_tokenize_prompts` | a video item's prompt through the processor's video path (`vlrl.training.video_inputs`) |

TRL's public forms of some jobs (`rollout_func`, `compute_loss_func`) were weighed (docs/design.md: why they do not
fit); `GRPOConfig` fields, reward functions, callbacks and TRL's public helpers are used where they do.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import trl
from trl import GRPOTrainer

from vlrl.base.errors import VlrlError

TRL_VERSION = trl.__version__

# TRL's private methods vlrl hooks, each with the parameters vlrl passes it (by name, or through **kwargs)
HOOKS = {
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
    "_generate_and_score_completions": ("inputs",),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_prepare_inputs": ("generation_batch",),
    "_compute_loss": ("model", "inputs"),
    "_get_per_token_logps_and_entropies": ("model", "compute_entropy"),
    "_tokenize_prompts": ("prompts",),
}
# the public method of `TrlHooks` each hook hands its call to
PUBLIC = {"_generate_single_turn": "generate_rollouts", "_generate_and_score_completions": "generate_and_score",
          "_calculate_rewards": "score_rewards", "_prepare_inputs": "step_inputs", "_compute_loss": "policy_loss",
          "_get_per_token_logps_and_entropies": "token_logps", "_tokenize_prompts": "tokenize_prompts"}
# attributes GRPOTrainer sets for itself that vlrl reads: the metrics it logs, the buffered generation batch, the
# micro-step counter, its FSDP helper
ATTRIBUTES = ("_metrics", "_buffered_inputs", "_step", "_dist")
# public helpers of TRL's modules that vlrl calls (no import path of TRL's is promised stable)
HELPERS = {
    "trl.trainer.utils": ("pad", "nanstd", "split_pixel_values_by_grid", "unsplit_pixel_values_by_grid"),
    "trl.models": ("unwrap_model_for_generation",),
    "trl.models.utils": ("_ForwardRedirection", "disable_gradient_checkpointing"),
}
# TRL's log-prob kernel without [tokens x vocabulary] logits: public in trl.kernels from 1.16, private before
CHUNKED = (("trl.kernels", "ChunkedLogProbFunction"), ("trl.trainer.utils", "_ChunkedLogProbFunction"))


class TrlSurfaceError(VlrlError, ImportError):
    """The installed TRL lacks a name vlrl relies on (one line: the version, the name, the fix)."""


def _missing(name: str, detail: str) -> TrlSurfaceError:
    return TrlSurfaceError(f"trl {TRL_VERSION} has no {name} ({detail}), which vlrl's trainer relies on; install a "
                           "TRL version vlrl supports (pyproject.toml lists them).")


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # a class without Python source (object)
        return ""


def check(trainer: type = GRPOTrainer) -> None:
    """Raises `TrlSurfaceError` on the first private method, attribute or helper vlrl relies on that `trainer` (TRL's
    GRPOTrainer) or TRL's modules lack, or a hooked method that no longer takes what vlrl passes it."""
    import importlib

    for name, wanted in HOOKS.items():
        method = getattr(trainer, name, None)
        if not callable(method):
            raise _missing(f"GRPOTrainer.{name}", "a method vlrl hooks")
        parameters = inspect.signature(method).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        absent = [p for p in wanted if p not in parameters and not takes_any]
        if absent:
            raise _missing(f"GRPOTrainer.{name} parameter {absent[0]!r}", f"it takes {tuple(parameters)[1:]}")
    source = "".join(_source(cls) for cls in trainer.__mro__)  # Unsloth's trainer subclasses TRL's
    for name in ATTRIBUTES:
        if f"self.{name} =" not in source:
            raise _missing(f"GRPOTrainer.{name}", "an attribute GRPOTrainer sets that vlrl reads")
    for module, names in HELPERS.items():
        for name in names:
            if not hasattr(importlib.import_module(module), name):
                raise _missing(f"{module}.{name}", "a helper vlrl calls")
    from transformers import Trainer

    if not callable(getattr(Trainer, "_prepare_inputs", None)):  # a transformers name: its version in the line
        import transformers

        raise TrlSurfaceError(f"transformers {transformers.__version__} has no Trainer._prepare_inputs (how rollouts "
                              "reach the device), which vlrl's trainer relies on; install a transformers version vlrl "
                              "supports (pyproject.toml lists them).")
    if _chunked_function() is None:
        raise _missing(" or ".join(f"{m}.{n}" for m, n in CHUNKED), "the chunked log-prob kernel episode runs score with")


def _chunked_function():
    import importlib

    for module, name in CHUNKED:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None


check()  # at import: a TRL without what vlrl relies on stops here, in one line


def chunked_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                  temperature: float, chunk_size: int, softcap: float | None, scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of `labels` (N) under `hidden` (N, H) @ `weight` (V, H).T (+ `bias`),
    computed `chunk_size` vocabulary rows at a time, the logits never held whole (recomputed in the backward)."""
    function = _chunked_function()
    if function.__name__ == "ChunkedLogProbFunction":  # TRL >= 1.16 returns the outputs asked for, and more
        logps, entropies, *_ = function.apply(hidden, weight, bias, labels, temperature, chunk_size, softcap, scale,
                                              ("entropy",))
        return logps, entropies
    return function.apply(hidden, weight, bias, labels, temperature, chunk_size, softcap, scale)


class TrlHooks:
    """Between vlrl's mixins and TRL's GRPOTrainer: TRL's private hooks call the public methods below; the defaults
    are TRL's own. Also the private state vlrl reads, under public names, and the settings a trainer class's mixins
    declare, given at construction (`settings`)."""

    def __init__(self, *args, settings: dict | None = None, **kwargs):
        settings = settings or {}
        unknown = sorted(k for k in settings if not hasattr(type(self), k))
        if unknown:  # a setting no mixin of this class reads would be silently dropped
            raise TypeError(f"{type(self).__name__} has no setting {unknown[0]!r}")
        super().__init__(*args, **kwargs)
        for key, value in settings.items():  # after TRL's own: nothing of TRL's reads them while it builds
            setattr(self, key, value)

    # --- TRL's private hooks, each handed to a public method --------------------------------------------------------

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return self.generate_rollouts(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _generate_and_score_completions(self, inputs):
        return self.generate_and_score(inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.score_rewards(inputs, prompts, completions, completion_ids_list)

    def _prepare_inputs(self, generation_batch):
        return self.step_inputs(generation_batch)

    def _compute_loss(self, model, inputs):
        return self.policy_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        return self.token_logps(model, *args, **kwargs)

    def _tokenize_prompts(self, prompts):
        return self.tokenize_prompts(prompts)

    # --- the public methods: TRL's behaviour unless a mixin overrides them -----------------------------------------

    def generate_rollouts(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """Completion token ids (and their sampled log-probs, or None) for `num_generations` of each prompt."""
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def generate_and_score(self, inputs: list[dict]) -> dict:
        """A generation batch's completions, rewards and advantages in TRL's batch form."""
        return super()._generate_and_score_completions(inputs)

    def score_rewards(self, inputs, prompts, completions, completion_ids_list) -> torch.Tensor:
        """Each reward function's score of each completion, (completions, functions), gathered over processes."""
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def step_inputs(self, generation_batch):
        """The micro-batch a training step computes its loss on."""
        return super()._prepare_inputs(generation_batch)

    def policy_loss(self, model, inputs: dict) -> torch.Tensor:
        """TRL's GRPO loss of one micro-batch (its forward, ratios, clipping, reduction and metrics)."""
        return super()._compute_loss(model, inputs)

    def token_logps(self, model, *args, **kwargs):
        """(log-probs, entropies or None, auxiliary loss or None) of the completion tokens: TRL's scoring forward."""
        return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def tokenize_prompts(self, prompts: list) -> tuple:
        """(prompt ids, pictures, the processor's other fields) of a batch of conversational prompts: TRL's."""
        return super()._tokenize_prompts(prompts)

    chunked_logps = staticmethod(chunked_logps)

    # --- TRL's private state, under public names -------------------------------------------------------------------

    @property
    def train_metrics(self) -> dict[str, list]:
        """What this trainer logs at the next logging step: name -> values since the last one (averaged by TRL)."""
        return self._metrics["train"]

    def log_metric(self, name: str, value: float) -> None:
        self._metrics["train"][name].append(value)

    @contextlib.contextmanager
    def metrics_discarded(self):
        """While inside, what TRL logs is taken back at the end (dynamic sampling's redraws: the logged numbers stay
        the first draw's); a metric logged through `log_metric` after it is kept."""
        marks = {k: len(v) for k, v in self._metrics["train"].items()}
        try:
            yield
        finally:
            for key, values in self._metrics["train"].items():
                del values[marks.get(key, 0):]

    @property
    def micro_step(self) -> int:
        """Micro-batches trained so far (TRL's counter; a step of gradient accumulation counts each)."""
        return self._step

    @property
    def buffered_batches(self) -> list[dict] | None:
        """The current generation batch's micro-batches (None: none yet, as after a resume)."""
        return self._buffered_inputs

    @buffered_batches.setter
    def buffered_batches(self, batches: list[dict]) -> None:
        self._buffered_inputs = batches

    def to_device(self, inputs: dict) -> dict:
        """`inputs` on the trainer's device, as transformers' Trainer prepares a batch."""
        from transformers import Trainer

        return Trainer._prepare_inputs(self, inputs)

    @contextlib.contextmanager
    def policy_for_generation(self):
        """The policy to decode with, unwrapped from DDP / DeepSpeed and with FSDP's parameters gathered, as TRL's
        own generation takes it."""
        from trl.models import unwrap_model_for_generation

        with (unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                          gather_deepspeed3_params=self.args.ds3_gather_for_generation) as policy,
              self._dist.summon_full_params(self.model_wrapped, recurse=False)):
            yield policy

    def on_unwrapped(self, model, function):
        """`function(the unwrapped model)`, run inside `model`'s (DDP's, FSDP's) forward where it is wrapped, so its
        hooks and gathers apply, as TRL's own chunked scoring enters a wrapped model."""
        from trl.models.utils import _ForwardRedirection

        unwrapped = self.accelerator.unwrap_model(model)
        if model is not unwrapped or self.is_fsdp_enabled:
            return _ForwardRedirection()(model, unwrapped, function, unwrapped)
        return function(unwrapped)


def method_name(trainer, job: str) -> str:
    """The name of `trainer`'s method that does `job` (a public method of `TrlHooks`): `job` itself on vlrl's trainer,
    TRL's hook on TRL's own trainer or Unsloth's, for tools that time a step's parts (bench/)."""
    if isinstance(trainer, TrlHooks):
        return job
    return next(hook for hook, public in PUBLIC.items() if public == job)


@functools.cache
def trainer_class(base: type, mixins: tuple[type, ...]) -> type:
    """vlrl's trainer: `mixins` (outermost first) over `TrlHooks` over `base`, TRL's GRPOTrainer. Its settings are
    given at construction: `trainer_class(...)(model=..., args=..., settings={"importance_sampling_cap": 2.0})`."""

    class VlrlGRPOTrainer(*mixins, TrlHooks, base):
        __doc__ = f"TRL's {base.__name__} with {', '.join(m.__name__ for m in mixins) or 'no mixin'}."

    VlrlGRPOTrainer.__qualname__ = VlrlGRPOTrainer.__name__ = f"Vlrl{base.__name__}"
    return VlrlGRPOTrainer
