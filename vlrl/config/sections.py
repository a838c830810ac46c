"""The sections of a run file as dataclasses ([model] [data] [training] [eval] [export] [env]), their defaults, and the
names each setting may take. Reading a run file is `vlrl.config.runfile`; checking one is `vlrl.config.validation`.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field

from vlrl.config.recipe import TRAINING_DEFAULTS


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"  # "tiny": the offline tiny Qwen3-VL, built and warm-started locally
    load_in_4bit: bool = False
    max_seq_length: int = 2048
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    train_projector: bool = False  # also LoRA on the vision->language merger (off: the recipe keeps vision fixed)
    # Where the language model's LoRA goes (LORA_TARGETS): "layers", the attention and MLP projections (the recipe);
    # "head", the output projection over the vocabulary alone (its rows of the action tokens move their logits
    # directly: what the tiny model learns an action preference through); "layers+head", both
    lora_targets: str = "layers"
    finetune_vision_layers: bool = False  # the vision tower stays frozen: RL signal is too sparse to retrain it
    backend: str = "auto"  # auto | unsloth | transformers
    # A 4-bit base on a CUDA GPU, repacked once at load (vlrl.engine.weights): "auto" (int8 per channel through
    # gemlite where it runs: 3.1x bitsandbytes' decoding at 16 rows), "int8", "fp8", or "nf4" (kept as loaded)
    decode_format: str = "auto"
    warm_start_steps: int = 0  # tiny / tiny-small only: supervised steps that teach the answer format before RL
    warm_start_items: int = 0  # tiny / tiny-small only: generated items the warm start draws from (0: 512 / 4096)
    # The generated tasks and difficulty the warm start trains on (empty / 0: the run's [data] tasks and difficulty):
    # a curriculum, e.g. a warm start on two_chart_compare at difficulty 1 before GSPO on two_chart_close at 2
    warm_start_tasks: list[str] = field(default_factory=list)
    warm_start_difficulty: int = 0
    # An episode run's warm start plays its environment with this player (WARM_START_PLAYERS): "random", uniformly
    # drawn actions (valid, blind); "scripted", Crafter's scripted player (vlrl.envs.crafter_player: wood, a table,
    # a wood pickaxe, water; deliberately imperfect), whose turns teach a policy that can act
    warm_start_player: str = "random"
    # At most this many GiB of the GPU for this process, the CUDA context counted (vlrl.model.memory_cap): 23 shows on
    # a larger card whether a run fits a 24 GB one (out of memory here = out of memory there). 0: no cap
    memory_cap_gib: float = 0.0


@dataclass
class DataConfig:
    source: str = "synthetic"  # synthetic | a hub id or local directory or file (docs/data.md: the layouts vlrl reads)
    split: str = "testmini"  # your own data: the <split>.jsonl (or .json) of the directory, e.g. "train"
    # Which loader reads `source` (LOADERS): "auto" picks one from the source's name (geo3k and ViRL39K by name, else
    # MathVista's layout, which reads a directory of <split>.jsonl too); name it to be sure: "generic" for your own
    loader: str = "auto"
    # Your own columns, by what they hold (COLUMNS): question, answer, image (one picture or a list), id, choices,
    # answer_type; e.g. {question = "prompt", image = "picture", id = "uid"}. A column not named keeps the loader's own.
    columns: dict = field(default_factory=dict)
    all_answers: bool = False  # keep answers that are not numbers (text, expressions); false: the loader's default
    num_items: int = 200  # synthetic only
    difficulty: int = 1  # synthetic only
    tasks: list[str] = field(default_factory=list)  # synthetic only: vlrl.base.synthetic task names; empty: the six default
    image_size: int = 512  # side of the square pictures; 0: each picture's own size (a data set's; not synthetic)
    # Pictures kept per item (a list of images per row, docs/data.md); those past it are dropped with their <image>
    # markers and counted in the data report, never cut silently
    max_images: int = 1
    # The pixel budget per picture, as Qwen's own resizing takes it (the processor's size: shortest_edge = min_pixels,
    # longest_edge = max_pixels; vlrl.model.pixel_budget): a picture is scaled, aspect kept, to between the two.
    # 0: the processor's own. `vlrl data inspect` shows the image tokens per item a budget gives
    min_pixels: int = 0
    max_pixels: int = 0
    # A row's video (a file or a list of frames, docs/data.md): frames kept one every 1 / video_fps seconds, at most
    # max_frames of them (past it, that many spread over the whole clip; 0: no cap), through the processor's video
    # path; video_max_pixels caps a clip's pixels, all its frames together (the video processor's longest_edge; 0:
    # the processor's own)
    video_fps: float = 2.0
    max_frames: int = 16
    video_max_pixels: int = 0
    hold_out: int = 100  # items held out of this source for the evals; 0 with an [eval] source
    max_prompt_tokens: int = 1024  # the recipe's max_prompt_length, enforced by measuring, never by truncation
    seed: int = 0


@dataclass
class TrainingConfig:
    # the recipe's own values are its defaults (`vlrl.config.recipe.TRAINING_DEFAULTS`): defined there once
    recipe: str = "gspo"
    learning_rate: float = TRAINING_DEFAULTS["learning_rate"]
    per_device_train_batch_size: int = TRAINING_DEFAULTS["per_device_train_batch_size"]
    gradient_accumulation_steps: int = TRAINING_DEFAULTS["gradient_accumulation_steps"]
    num_generations: int = TRAINING_DEFAULTS["num_generations"]
    max_completion_length: int = TRAINING_DEFAULTS["max_completion_length"]
    num_train_epochs: float = TRAINING_DEFAULTS["num_train_epochs"]
    max_steps: int = -1  # -1: run num_train_epochs; a positive number caps the optimizer steps
    temperature: float = TRAINING_DEFAULTS["temperature"]
    logging_steps: int = TRAINING_DEFAULTS["logging_steps"]
    save_steps: int = 50  # a checkpoint (adapter, optimizer, scheduler, RNG) every this many steps; --resume uses it
    stop_on_degeneration: float = 0.0  # 0: never; else stop when this share of a step's completions degenerates
    # true: stop when the policy has collapsed (flat groups, repeated samples: vlrl.training.collapse), back to the
    # last checkpoint before it; false: say so and train on
    stop_on_collapse: bool = False
    # Completions each process decodes per generate call; 0: TRL's default, the whole optimizer step's rollouts
    # (batch x accumulation) at once. A multiple of the batch below it decodes each micro-batch's rollouts just before
    # its forward pass: the same on-policy step in less memory (the 8B recipe on 24 GB), at a lower decoding
    # throughput. Per process, so a preset decodes as many at once on each of N GPUs as on one (TRL's own
    # generation_batch_size is this times the processes). An episode run plays this many episodes at once.
    generation_batch_size: int = 0
    # The optimizer (OPTIMIZERS): "" is the recipe's AdamW; "sgd", plain SGD, whose step follows the gradient's size
    # (AdamW moves every weight by about the learning rate, the vocabulary rows of a LoRA head included)
    optim: str = ""
    # The optimizer's weight decay; -1: the recipe's (0.1, chosen with AdamW at a learning rate near 5e-6). SGD at a
    # large learning rate wants 0: decay shrinks every weight by learning_rate x weight_decay each step
    weight_decay: float = -1.0
    # The learning-rate warm-up: a value below 1 is a share of the steps, 1 or more a number of steps; -1: the
    # recipe's 0.1. A warm-up's first step runs at learning rate 0 (on grid-tiny's 8 steps, none was not better:
    # bench/results/seeds.md)
    warmup_steps: float = -1.0
    # Dynamic sampling (DAPO): up to this many more draws a step for groups whose rewards are all equal (they teach
    # nothing), single-turn and episode runs alike (vlrl.training.dynamic_sampling). 0: off; the share is logged either way
    dynamic_sampling: int = 0
    # The most tokens (rows x padded width) one training forward and backward takes: a single-turn run trains
    # consecutive micro-batches of a generation batch that fit in it together as one pass, the same gradient in fewer
    # passes (vlrl.training.passes); an episode run splits its segments into passes of at most this many (0: the
    # model's max_seq_length). 0 (single-turn): TRL's micro-batches, one pass each
    pass_tokens: int = 0
    fast_generation: bool = True  # CUDA + transformers backend: static KV cache + compiled decoding (2.8x on 8B 4-bit)
    # CUDA + transformers backend: the decoder layers' training and log-prob forwards compiled (a training pass at the
    # 8B shape 1.6-2.4x faster: vlrl.training.compiled_layers); false: eager, as TRL runs them
    compiled_layers: bool = True
    # Generation and the training forward run different code paths (compiled static-cache decoding, 4-bit, bf16
    # against eager with gradient checkpointing), so the sampled tokens' log-probs differ between them: vlrl.training.mismatch
    # logs that every step, and "token" / "sequence" weight the loss by the truncated ratio pi_train / pi_rollout
    # (TIS). "off" keeps the recipe as it was until the GPU measurement (issue 18) shows how large the mismatch is.
    importance_sampling_correction: str = "off"  # off | token | sequence (transformers backend, single-turn runs)
    importance_sampling_cap: float = 2.0  # the TIS truncation: RLinf's default, a documented starting point
    # Thinking models (Qwen3-VL "-Thinking"): the most tokens a rollout thinks inside <think>...</think>; at the budget
    # </think> is forced and the answer follows (vlrl.grammar.thinking). 0: no budget. Counted in max_completion_length.
    thinking_budget: int = 0
    # The reward set (REWARDS; vlrl.grammar.rewards.reward_funcs builds it): "mathvista", MathVista's string and number
    # rules; "symbolic" also accepts an equivalent expression (math-verify), for geo3k-style answers like 2\sqrt{3}.
    reward: str = "mathvista"
    seed: int = TRAINING_DEFAULTS["seed"]
    # Experiment trackers, passed to TRL as report_to: "none", an integration name ("tensorboard", "trackio",
    # "wandb", ...; TRACKERS) or a list of them. train_log.jsonl is written either way.
    report_to: str | list[str] = TRAINING_DEFAULTS["report_to"]


@dataclass
class EvalConfig:
    batch_size: int = 8  # sequences per generate call (with samples K: batch_size // K items of K draws)
    max_new_tokens: int = 1024
    # K > 0: besides the greedy eval, K seeded samples per item at `temperature` (samples_<when>.jsonl), for pass@k
    samples: int = 0
    temperature: float = 1.0  # of the sampled eval; the recipe samples at 1.0 in training
    seed: int = 0             # of the sampled eval's draws
    thinking_budget: int = 0  # as [training] thinking_budget, for the evals' generations; counted in max_new_tokens
    # A separate eval set: every item of this source's split ("": [data]'s held-out items). [data] then trains on all
    # of its items but those sharing an id, a picture or a question and answer with an eval item (dropped, counted).
    source: str = ""
    split: str = ""


@dataclass
class ExportConfig:
    formats: list[str] = field(default_factory=lambda: ["lora"])


# --- [env]: episode runs (vlrl.episodes) ---------------------------------------------------------------------------
@dataclass
class EnvConfig:
    name: str = ""  # "": a single-turn run on [data]; else grid, crafter, gymnasium:ID, openenv:URL, or a serve-env URL
    options: dict = field(default_factory=dict)  # the environment's own keyword arguments, e.g. {size = 4}
    actions: list[str] = field(default_factory=list)  # names of a Gymnasium environment's discrete actions, in order
    max_turns: int = 8  # turns per episode; the environment may end one sooner
    max_images_per_message: int = 1  # images one observation message keeps (0: text only); the rest dropped, counted
    max_images_in_context: int = 4  # the newest images a context keeps; older ones dropped, counted
    image_drop_step: int = 1  # over the cap, images dropped at a time (k > 1: contexts extend between drops)
    image_size: int = 0  # observations resized to this square side for the model; 0: as the environment draws them
    text: bool = True  # show the environment's state summary (false: image-only)
    train_seeds: int = 64  # training episodes' seeds: TRAIN_SEED_START + 0..n-1, disjoint from the eval seeds
    eval_seeds: int = 32  # eval episodes' seeds: 0..n-1, the same before and after training
    eval_temperature: float = 0.0  # 0: greedy eval episodes; > 0: sampled, seeded (same draws for the same policy)
    updates_per_rollout: int = 1  # optimizer steps per rollout (1: on-policy, the GSPO ratio is 1)


# the loss types whose micro-batches `[training] pass_tokens` can merge: a sum over rows (divided by rows) or over the
# whole batch's tokens; "bnpo" divides each micro-batch by its own tokens (vlrl.training.passes; the training layer's
# vlrl.training.loss.REDUCTIONS says the same, tests/test_passes.py holds them together)
PASS_LOSS_TYPES = ("grpo", "dr_grpo", "luspo", "dapo")
ENV_SEEDS = {"eval": 0, "train": 1_000_000, "warm_start": 2_000_000}  # disjoint seed ranges (counts < 1,000,000)


@dataclass
class RunConfig:
    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    env: EnvConfig = field(default_factory=EnvConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "training": TrainingConfig, "eval": EvalConfig,
             "export": ExportConfig, "env": EnvConfig}
BACKENDS = ("auto", "unsloth", "transformers")
DECODE_FORMATS = ("auto", "nf4", "int8", "fp8")  # [model] decode_format (vlrl.engine.weights)
# The models vlrl builds and warm-starts itself (vlrl.model.tiny, vlrl.training.warmstart), by name -> size; tiny-small: the GPU
# learning demonstration's model; tiny-qwen3.5(-moe): the tiny Qwen3.5 (dense, MoE), of the family LOCAL_FAMILIES
# names (the others are Qwen3-VL).
LOCAL_MODELS = {"tiny": "tiny", "tiny-small": "small", "tiny-qwen3.5": "tiny", "tiny-qwen3.5-moe": "tiny"}
LOCAL_FAMILIES = {"tiny-qwen3.5": "qwen3_5", "tiny-qwen3.5-moe": "qwen3_5_moe"}
LORA_TARGETS = ("layers", "head", "layers+head")
WARM_START_PLAYERS = {"random": "", "scripted": "crafter"}  # [model] warm_start_player -> the environment it needs
LOADERS = ("auto", "synthetic", "mathvista", "geo3k", "virl39k", "generic")  # [data] loader (vlrl.data.LOADERS)
COLUMNS = ("question", "answer", "image", "id", "choices", "answer_type", "video")  # [data] columns' keys (vlrl.data.Fields)
OPTIMIZERS = ("", "sgd")
EXPORT_FORMATS = ("lora", "merged16", "merged4", "gguf")
CORRECTIONS = ("off", "token", "sequence")  # [training] importance_sampling_correction (vlrl.training.mismatch)
REWARDS = ("mathvista", "symbolic")  # the reward sets of vlrl.grammar.rewards.reward_funcs
# What transformers 5.17 accepts as report_to (its INTEGRATION_TO_CALLBACK, plus "all" and "none"); tests check it.
TRACKERS = ("none", "all", "tensorboard", "trackio", "wandb", "mlflow", "comet_ml", "azure_ml", "neptune",
            "codecarbon", "clearml", "dagshub", "flyte", "dvclive", "swanlab", "kubeflow")



def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
