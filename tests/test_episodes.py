"""Episode runs: the grid environment, the conversation and its image caps, the advantages, passes and seeds of the
episode trainer, the episode comparison; then, on the tiny model (slow), real rollouts (caps, truncation, invalid
actions, an environment that raises), TRL's loss over a step's turns in passes, an interrupted episode run resumed to
the uninterrupted one's adapter, and episode eval records with resume."""

import itertools
import json
from dataclasses import replace

import pytest
import torch

from vlrl.base.errors import ConfigError
from vlrl.config import runfile as cfg
from vlrl.envs import Env, make
from vlrl.envs.grid import GridEnv, shortest_path
from vlrl.episodes import context, scoring
from vlrl.evaluation import episode_compare as ecompare
from vlrl.training import episode_trainer as trainer

MOVE = "<REASONING>go</REASONING><SOLUTION>{}</SOLUTION>"


# --- the grid ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_grid_episode_is_a_function_of_the_seed(difficulty):
    a, b = GridEnv(size=5, difficulty=difficulty), GridEnv(size=5, difficulty=difficulty)
    for seed in range(5):
        first, second = a.reset(seed), b.reset(seed)
        assert first.text == second.text and first.image.tobytes() == second.image.tobytes()
        for action in ("right", "down", "left"):
            x, y = a.step(MOVE.format(action)), b.step(MOVE.format(action))
            assert (x.reward, x.done, x.info, x.observation.text) == (y.reward, y.done, y.info, y.observation.text)
            if x.done:
                break


@pytest.mark.parametrize("difficulty", [2, 3])
def test_grid_is_always_solvable_and_varies_with_the_seed(difficulty):
    env = GridEnv(size=5, difficulty=difficulty)
    layouts = {env.layout(seed) for seed in range(60)}
    assert len(layouts) > 30
    for agent, goal, walls in layouts:
        assert agent != goal and agent not in walls and goal not in walls
        assert shortest_path(5, agent, goal, walls) is not None
    assert any(walls for _, _, walls in layouts) == (difficulty == 3)


def test_grid_rewards_the_goal_counts_invalid_actions_and_caps_turns():
    env = make("grid", size=3, difficulty=1, max_turns=6)
    obs = env.reset(0)
    assert "row 0, column 0" in obs.text and obs.image.size == (64, 64)
    bump = env.step(MOVE.format("up"))  # into the border: stays
    assert bump.info["position"] == [0, 0] and bump.reward == 0 and not bump.done
    invalid = env.step("I would like to fly")
    assert invalid.info["invalid"] and not invalid.done
    for action in ("right", "right", "down"):
        assert not env.step(MOVE.format(action)).done
    last = env.step(MOVE.format("down"))
    assert last.done and last.reward == 1.0
    assert env.metrics() == {"success": True, "return": 1.0, "length": 6, "invalid_turns": 1, "distance": 0}
    env.reset(0)
    for _ in range(6):
        step = env.step(MOVE.format("left"))
    assert step.done and not env.metrics()["success"]
    assert GridEnv(text=False).reset(0).text == ""  # image-only mode


# --- the conversation ----------------------------------------------------------------------------------------------

def test_messages_follow_the_openai_schema_and_caps_count_every_drop():
    image = GridEnv().reset(0).image
    messages, dropped = context.first_message("Actions: up.", "state", [image, image], max_images=1)
    assert dropped == 1
    user = messages[1]
    assert user["content"][0] == {"type": "text", "text": "Actions: up.\n" + context.FORMAT.instruction + "\nstate"}
    assert user["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    for _ in range(3):
        messages += [context.assistant_message("x"), context.user_message("s", [image], max_images=1)[0]]
    capped, dropped = context.cap_context(messages, max_images=2)
    assert context.count_images(messages) == 4 and context.count_images(capped) == 2 and dropped == 2
    kept = [context.count_images(context.cap_context(messages[:n], max_images=3, step=3)[0]) for n in (2, 4, 6, 8)]
    assert kept == [1, 2, 3, 1]  # over the cap, the oldest go three at a time
    assert capped[-1] == messages[-1] and capped[1]["content"][1] == {"type": "text", "text": context.DROPPED}
    qwen, images = context.to_processor(capped)
    assert len(images) == 2 and images[0].size == (64, 64)
    assert sum(p["type"] == "image" for m in qwen for p in m["content"]) == 2


# --- the objective (TRL's, over turn rows) --------------------------------------------------------------------------

def test_advantages_follow_trls_rule_and_leave_failed_episodes_out():
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    adv, flat = trainer.group_advantages(returns, 4, "none")
    assert adv[:4].tolist() == [0.5, -0.5, 0.5, -0.5] and adv[4:].tolist() == [-0.25, -0.25, -0.25, 0.75]
    assert flat.tolist() == [False, False]
    scaled, _ = trainer.group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), 4, "group")
    assert scaled[0].item() == pytest.approx(0.5 / (1 / 3) ** 0.5, rel=1e-3)  # TRL's std: Bessel-corrected
    same, flat = trainer.group_advantages(torch.tensor([2.0, 2.0]), 2, "group")
    assert same.tolist() == [0.0, 0.0] and flat.tolist() == [True]  # one outcome in the group: nothing to learn
    failed, _ = trainer.group_advantages(torch.tensor([1.0, 0.0, float("nan")]), 3, "none")
    assert failed[:2].tolist() == [0.5, -0.5] and failed[2].isnan()  # out of the statistics, and trains nothing
    for scale in ("group", "batch"):  # a group with one episode left (its other failed): no spread, advantage 0
        lone, flat = trainer.group_advantages(torch.tensor([1.0, float("nan"), 0.0, 2.0]), 2, scale)
        assert lone[0].item() == 0.0 and lone[1].isnan() and lone[2:].abs().gt(0).all() and flat.tolist()[0]
    lone, _ = trainer.group_advantages(torch.tensor([float("nan"), 3.0]), 2, "batch")  # one return in the batch
    assert lone[1].item() == 0.0


def test_turn_rows_count_the_turns_they_leave_out_by_why():
    from types import SimpleNamespace

    def episode(*replies):
        return SimpleNamespace(reply_ids=list(replies), reply_logps=[], contexts=[None] * len(replies))

    dropped = {}
    advantages = trainer.group_advantages(torch.tensor([1.0, float("nan"), 0.0, 2.0]), 2, "group")[0].tolist()
    rows = trainer.turn_rows([episode([1], [2]), episode([3]), episode([4], []), episode([5])], advantages, dropped)
    assert [r["episode"] for r in rows] == [0, 0, 2, 3]  # the lone survivor's turns train (advantage 0)
    assert dropped == {"failed_episode": 1, "empty_reply": 1}


def test_passes_keep_every_turn_and_weigh_as_trls_reduction():
    from vlrl.engine.token_types import Tokenized

    segments = [[{"prompt": Tokenized([0] * p), "reply_ids": [0] * r}] for p, r in ((90, 10), (280, 20), (150, 50),
                                                                                      (800, 100))]
    chunks = trainer.passes(segments, 600)
    assert [len(c) for c in chunks] == [2, 1, 1] and [s for c in chunks for s in c] == segments
    assert [len(c) for c in trainer.passes(segments, 1)] == [1, 1, 1, 1]  # over the budget still trains, alone
    lengths = [[len(s) for s in c] for c in trainer.split_turns([[0] * 3, [0], [0], [0], [0] * 2], 2)]
    assert lengths == [[3, 1], [1, 1, 2]]  # whole segments, about as many turns in each micro-batch, none lost
    assert [len(c) for c in trainer.split_turns([[0]], 2)] == [1, 0]
    for loss_type in ("grpo", "dr_grpo", "bnpo", "dapo"):  # the weights of a micro-batch's passes add up as TRL sums
        weights = [trainer.pass_weight(loss_type, 1, n, 3, 60) for n in (10, 20, 30)]
        assert sum(weights) == pytest.approx(3.0 if loss_type == "dapo" else 1.0)
    with pytest.raises(ConfigError, match="loss type 'made_up'"):
        trainer.pass_weight("made_up", 1, 1, 1, 1)


def test_training_seeds_never_meet_the_eval_seeds():
    from vlrl.episodes.rollout import seeds_for

    c = cfg.preset("grid-tiny", overrides=["training.num_generations=4"])
    train, held = seeds_for(c, "train"), seeds_for(c, "eval")
    assert not set(train) & set(held) and len(train) == c.env.train_seeds
    rows = trainer.seed_dataset(train)
    assert rows[0]["seed"] == train[0] and rows.num_rows == len(train)


# --- the comparison ------------------------------------------------------------------------------------------------

def _episode(seed, success, ret=None):
    return {"id": f"seed-{seed}", "kind": "episode", "seed": seed, "success": success,
            "return": float(success) if ret is None else ret, "length": 2, "status": "done", "turns": [{}, {}]}


def test_compare_of_episode_records_uses_mcnemar_and_the_paired_permutation(tmp_path):
    from vlrl import cli
    from vlrl.base.stats import mcnemar_exact, paired_permutation
    from vlrl.evaluation.compare import compare, summary

    before = [_episode(i, i < 3) for i in range(20)]
    after = [_episode(i, i < 12 and i != 1) for i in range(20)]
    c = compare(before, after)
    assert c["kind"] == "episodes" and c["table"]["failure_to_success"] == 9 and c["success_to_failure"] == ["seed-1"]
    assert c["mcnemar_p"] == mcnemar_exact(9, 1)
    assert c["return_permutation_p"] == paired_permutation([a["return"] - b["return"] for b, a in zip(before, after)])
    assert "McNemar exact p" in summary(c) and "paired permutation p" in summary(c)
    for name, records in (("b.jsonl", before), ("a.jsonl", after)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli.main(["compare", str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl"), "--output",
                     str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text()) == ecompare.compare(before, after)


# --- the configuration ---------------------------------------------------------------------------------------------

def test_env_section_validates_every_problem_in_one_pass():
    with pytest.raises(cfg.ConfigError) as err:
        cfg.from_dict({"env": {"name": "gird", "max_turns": 0, "max_images_in_context": -1, "eval_seeds": 10 ** 6,
                               "options": "size=4", "image_drop_step": 2}})
    text = str(err.value)
    for part in ("Did you mean 'grid'", "max_turns = 0", "max_images_in_context = -1", "1,000,000",
                 "options = 'size=4' must be a table", "image_drop_step = 2 must be between 1 and"):
        assert part in text
    url = cfg.from_dict({"env": {"name": "http://127.0.0.1:8765"}})  # a served environment validates offline
    assert url.env.name.startswith("http")
    from vlrl.base.errors import MissingExtra

    for name in ("grid-tiny", "crafter-tiny", "qwen3-vl-2b-crafter", "qwen3-vl-8b-crafter"):
        c = cfg.preset(name)
        try:  # the preset's options are its environment's own: building it checks them (no world until reset)
            make(c.env.name, **c.env.options).close()
        except MissingExtra:  # crafter presets without the envs extra: the options cannot be checked here
            assert c.env.name == "crafter"


# --- on the tiny model: real generation, real environment steps, real optimizer steps ----------------------------

class Exploding(Env):
    """A grid that raises on its second step (an environment server that went away)."""

    name, actions = "exploding", ("up", "down", "left", "right")

    def __init__(self):
        self.grid, self.turns = GridEnv(size=3), 0

    def reset(self, seed):
        return self.grid.reset(seed)

    def step(self, reply):
        self.turns += 1
        if self.turns == 2:
            raise ConnectionError("the environment server closed the connection")
        return self.grid.step(reply)

    def metrics(self):
        return self.grid.metrics()


@pytest.fixture(scope="module")
def policy(tiny_base_dir):
    from vlrl.model import loading as model

    base, processor = model.load_model(str(tiny_base_dir), backend="transformers")
    return model.add_lora(base, model.LoraSettings(r=8, alpha=16)), processor


@pytest.mark.slow
def test_rollouts_count_drops_truncation_invalid_actions_and_failures(policy):
    import torch

    from vlrl.episodes.rollout import Settings, play, summary

    model, processor = policy
    torch.manual_seed(0)
    settings = Settings(max_turns=3, max_new_tokens=8, max_seq_length=4096, max_images_in_context=1)
    episodes = play(model, processor, lambda: make("grid", size=3), [0, 0, 1], settings)
    s = summary(episodes)
    assert [e.seed for e in episodes] == [0, 0, 1] and all(e.status == "max_turns" for e in episodes)
    assert s["invalid_actions"] == 9  # a random model names no action: every turn invalid, every episode goes on
    assert s["dropped_images"] == 3 * 2 and all(len(e.frames) == 4 for e in episodes)
    # a context budget that the third turn would overflow: the episode ends truncated, before the overflow
    wide = Settings(max_turns=3, max_new_tokens=8, max_seq_length=4096, max_images_in_context=4)
    torch.manual_seed(1)
    full = play(model, processor, lambda: make("grid", size=3), [0], wide)[0]
    budget = full.turns[2]["context_tokens"] + 8 - 1  # the same draws again (reseeded): one token too many
    torch.manual_seed(1)
    short = play(model, processor, lambda: make("grid", size=3), [0],
                 Settings(max_turns=3, max_new_tokens=8, max_seq_length=budget, max_images_in_context=4))[0]
    assert short.status == "truncated" and len(short.turns) == 2
    assert all(t["context_tokens"] + 8 <= budget for t in short.turns)
    # an environment that raises fails its own episode, with the reason; the others finish
    mixed = play(model, processor, lambda: Exploding(), [0, 1], settings) + play(
        model, processor, lambda: make("grid", size=3), [2], settings)
    assert [e.status for e in mixed] == ["failed", "failed", "max_turns"]
    assert "ConnectionError" in mixed[0].failure and summary(mixed)["failed"] == 2


class Lasting(Env):
    """A grid whose episode of seed s ends after s + 1 steps, whatever the replies: episodes of unequal lengths."""

    name, actions = "lasting", ("up", "down", "left", "right")

    def __init__(self):
        self.grid, self.turns, self.length = GridEnv(size=3), 0, 0

    def reset(self, seed):
        self.turns, self.length = 0, seed + 1
        return self.grid.reset(seed)

    def step(self, reply):
        self.turns += 1
        result = self.grid.step(reply)
        return replace(result, done=self.turns >= self.length)

    def metrics(self):
        return self.grid.metrics()


@pytest.mark.slow
def test_an_ended_episode_hands_its_slot_to_the_next_seed(policy, monkeypatch):
    """With fewer slots than episodes, an episode that ends is replaced at the next turn by the next seed's, so every
    turn decodes a full batch while seeds wait; each episode still plays to its own end, returned in seed order."""
    from vlrl import engine
    from vlrl.episodes.rollout import Settings, play

    model, processor = policy
    decoded, complete = [], engine.complete_tokenized

    def recording(model, processor, contexts, decoding, session):
        decoded.append((sum(c is not None for c in contexts), session.rows))  # the session sets the decoding's rows
        return complete(model, processor, contexts, decoding, session=session)

    monkeypatch.setattr(engine, "complete_tokenized", recording)
    settings = Settings(max_turns=8, max_new_tokens=4, max_seq_length=4096, max_images_in_context=1)
    episodes = play(model, processor, Lasting, [2, 0, 0, 1], settings, batch_size=2)
    assert [e.seed for e in episodes] == [2, 0, 0, 1] and [len(e.turns) for e in episodes] == [3, 1, 1, 2]
    assert all(e.status == "done" for e in episodes)
    # slots of 2: {2, 0} -> 0 ends, the second 0 joins -> it ends, 1 joins -> 2 ends -> 1 alone (chunks of 2 played
    # one after the other would decode 2, 1, 1 then 2, 1)
    assert decoded == [(2, 2), (2, 2), (2, 2), (1, 2)]


@pytest.mark.slow
def test_episode_replies_never_hold_an_image_placeholder(policy):
    """A reply holding <|image_pad|> would break its turn's training forward (one image token more than pictures);
    the policy here prefers it at every step, by far, and no reply holds one."""
    from vlrl.episodes.rollout import Settings, play
    from vlrl.model.vision_tokens import vision_token_ids

    model, processor = policy
    placeholder = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    hook = model.get_base_model().lm_head.register_forward_hook(
        lambda module, args, logits: logits.index_add_(-1, torch.tensor([placeholder]),
                                                       torch.full((*logits.shape[:-1], 1), 1000.0)))
    try:
        episodes = play(model, processor, lambda: make("grid", size=3), [0, 1],
                        Settings(max_turns=2, max_new_tokens=6, max_seq_length=4096))
    finally:
        hook.remove()
    replies = [ids for e in episodes for ids in e.reply_ids]
    assert len(replies) == 4 and not any(set(ids) & set(vision_token_ids(processor)) for ids in replies)


def _episode_config(*extra):
    """grid-tiny, small: 4 episodes of one seed a step, 2 turns each."""
    return cfg.preset("grid-tiny", overrides=["training.per_device_train_batch_size=4", "training.num_generations=4",
                                              "training.max_steps=2", "training.save_steps=1", "env.max_turns=2",
                                              "env.options={size=3, difficulty=1, max_turns=2, shaping=true}",
                                              *extra])


def test_an_episode_runs_eval_is_the_one_eval_stage(policy, tmp_path):
    """`vlrl.run.evaluate_policy` is the eval stage of single-turn and episode runs alike: for an [env] run it plays
    the eval seeds into the run's eval file; the episode stages keep no second one."""
    from vlrl import run as stages
    from vlrl import run_episodes

    model, processor = policy
    config = _episode_config("env.eval_seeds=2", "eval.batch_size=2")
    run = stages.start(config, tmp_path / "run")
    records = stages.evaluate_policy(config, model, processor, None, run, "before", log=lambda *_: None)
    assert [r["kind"] for r in records] == ["episode", "episode"] and [r["seed"] for r in records] == [0, 1]
    assert len(run.eval_before.read_text().splitlines()) == 2 and run.episode_frames("before").is_dir()
    assert not hasattr(run_episodes, "evaluate_episodes") and not hasattr(run_episodes, "environment")


def test_an_episode_rollout_decodes_with_the_trainers_one_decoding(policy, tmp_path, monkeypatch):
    """The trainer builds one `Decoding` from the config (its suppressed ids mask the training forward) and its
    rollouts play with that one: no second is built per step from the same settings."""
    from vlrl import engine
    from vlrl.episodes import rollout
    from vlrl.training import train

    model, processor = policy
    config = _episode_config()
    built = train.build_trainer(config, model, processor, trainer.seed_dataset([1_000_000]), tmp_path / "run",
                                log=lambda *_: None)
    assert built.rollout_decoding == rollout.decoding_for(model, processor, built.play_settings)
    assert built.rollout_decoding.record_logps and built.play_settings.record_logps
    assert built.rollout_decoding.max_new_tokens == config.training.max_completion_length
    built_again = []
    monkeypatch.setattr(engine, "decoding_for", lambda *a, **k: built_again.append(k) or pytest.fail("built again"))
    episodes = built._play([0, 0])
    assert len(episodes) == 2 and not built_again


@pytest.mark.slow
def test_an_episode_step_in_passes_is_trls_loss_over_the_whole_micro_batch(policy, tmp_path):
    """The trainer an episode run gets is vlrl's GRPOTrainer; a step's turns split into passes (one per turn here)
    give the loss and gradient of one pass over them all, for each reduction TRL has."""
    from vlrl.episodes.rollout import play
    from vlrl.training import train

    model, processor = policy
    config = _episode_config()
    built = train.build_trainer(config, model, processor, trainer.seed_dataset([1_000_000]), tmp_path / "run",
                                log=lambda *_: None)
    assert isinstance(built, trainer.EpisodeRollouts) and type(built).__name__.endswith("GRPOTrainer")
    assert (built.loss_type, built.importance_sampling_level) == ("grpo", "sequence")  # gspo-paper's, from TRL
    torch.manual_seed(1)
    settings = built.play_settings
    episodes = play(model, processor, built.make_env, [0, 0], settings)
    rows = trainer.turn_rows(episodes, [1.0, -0.5])
    assert len(rows) == 4 and all(len(r["prompt"].image_grid_thw) == 1 + (i % 2) for i, r in enumerate(rows))
    built.current_gradient_accumulation_steps = 1
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for loss_type in ("grpo", "dr_grpo", "bnpo", "dapo"):
        built.loss_type = loss_type
        results = []
        for budget in (10**6, 1):
            built.pass_tokens = budget
            micro = built._micro_batches(rows)[0]
            assert len(micro["passes"]) == (1 if budget > 1 else len(scoring.segments(rows)))
            loss = built.compute_loss(model, micro)
            loss.backward()
            results.append((loss.item(), torch.cat([p.grad.flatten() for p in params]).clone()))
            for p in params:
                p.grad = None
        (whole, whole_grad), (split, split_grad) = results
        assert split == pytest.approx(whole, abs=1e-6), loss_type
        assert torch.allclose(split_grad, whole_grad, atol=1e-6) and whole_grad.abs().sum() > 0, loss_type


@pytest.mark.slow
def test_a_rollout_trained_on_twice_scores_its_turns_at_the_rollouts_weights(policy, tmp_path):
    """`[env] updates_per_rollout = 2`: a rollout spans two optimizer steps, so its turns carry the rollout policy's
    log-probs (`old_per_token_logps`), which the turns' own scoring gives (an ImportError before: TRL's
    `disable_gradient_checkpointing` was imported from a module that never had it)."""
    from vlrl.episodes.rollout import play
    from vlrl.training import train

    model, processor = policy
    built = train.build_trainer(_episode_config("env.updates_per_rollout=2"), model, processor,
                                trainer.seed_dataset([1_000_000]), tmp_path / "run", log=lambda *_: None)
    assert built.num_iterations == 2
    torch.manual_seed(1)
    rows = trainer.turn_rows(play(model, processor, built.make_env, [0, 0], built.play_settings), [1.0, -0.5])
    model.eval()  # no dropout: the two scorings compare exactly
    inputs = built._micro_batches(rows)[0]["passes"][0][0]
    built._merged = inputs["merged"]
    with torch.no_grad():
        scored = built._merged_logps(model, False)[0]
    built._merged = None
    assert torch.equal(inputs["old_per_token_logps"], scored)


def test_contexts_are_the_templates_tokens_with_each_reply_as_generated(tiny_base_dir):
    """An episode's contexts (`vlrl.episodes.tokens`): the processor's tokens of the rendered conversation where a
    reply's text tokenizes back to its ids; a reply generated in other ids (here "left" spelled letter by letter)
    stays in those ids; between image drops each context extends the previous one and its reply."""
    from transformers import AutoProcessor

    from vlrl.episodes.tokens import Contexts
    from vlrl.model.prompts import batch_inputs

    processor = AutoProcessor.from_pretrained(str(tiny_base_dir))
    image = GridEnv().reset(0).image
    messages, _ = context.first_message("Actions: up.", "state", [image], max_images=1)
    contexts, replies, built = Contexts(processor), [], []
    spelled = [processor.tokenizer.convert_tokens_to_ids(c) for c in "left"]
    for turn in range(5):
        capped, dropped = context.cap_context(messages, max_images=2, step=2)
        built.append((contexts.next(capped, replies, dropped), dropped))
        text, images = context.prompt_text(processor, capped)
        whole = batch_inputs(processor, [text], images, padding_side="left")
        same = built[-1][0].ids == whole["input_ids"][0].tolist()
        assert same == (turn < 3), turn  # until the spelled reply is in the context
        assert torch.equal(built[-1][0].pixel_values, whole["pixel_values"])
        reply = "up" if turn != 2 else "left"
        replies.append(processor.tokenizer(reply)["input_ids"] if turn != 2 else spelled)
        messages += [context.assistant_message(reply), context.user_message("s", [image], max_images=1)[0]]
    extends = [scoring.extends(a, replies[t], b) for t, ((a, _), (b, _)) in enumerate(itertools.pairwise(built))]
    assert [d for _, d in built] == [0, 0, 2, 2, 4] and extends == [True, False, True, False]
    assert built[1][0].pixels[0] is built[0][0].pixels[0]  # an extended context shares its images' tensors
    assert spelled == built[3][0].ids[len(built[2][0].ids):][:4]  # the reply as generated, not "left" retokenized


@pytest.mark.slow
@pytest.mark.parametrize("targets", ["layers", pytest.param("head", marks=pytest.mark.head_lora)])
def test_a_segments_forward_gives_each_turn_what_its_own_forward_gives(policy, tiny_base_dir, tmp_path, targets):
    """Turns scored one forward per segment (`vlrl.episodes.scoring`): each reply token's log-prob and entropy, and
    the gradient of their sum, as TRL's own forward over each turn's context and reply gives them; with the output
    layer as it is (chunked over the vocabulary) and adapted by LoRA (the tiny presets')."""
    from trl.trainer.utils import pad

    from vlrl.engine.token_types import token_batch
    from vlrl.episodes.rollout import play
    from vlrl.model import loading as models
    from vlrl.training import train
    from vlrl.training.mismatch import masked

    model, processor = policy
    if targets == "head":
        base, processor = models.load_model(str(tiny_base_dir), backend="transformers")
        model = models.add_lora(base, models.LoraSettings(r=8, alpha=16, targets="head"))
    config = _episode_config("env.max_turns=4", "env.options={size=3, difficulty=1, max_turns=4, shaping=true}",
                             "env.max_images_in_context=2", "env.image_drop_step=2")
    built = train.build_trainer(config, model, processor, trainer.seed_dataset([1_000_000]), tmp_path / "run",
                                log=lambda *_: None)
    torch.manual_seed(0)
    episodes = play(model, processor, built.make_env, [0, 1], built.play_settings)
    rows = trainer.turn_rows(episodes, [1.0, -0.5])
    segments = scoring.segments(rows)
    assert len(rows) == 8 and [len(s) for s in segments] == [2, 2, 2, 2]  # an image drop every second turn
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    built._merged = built._pass_inputs(segments, 1)["merged"]
    ours, our_entropy = built._merged_logps(model, True)
    built._merged = None
    prompts = token_batch(processor, [r["prompt"] for r in rows], padding_side="left")
    replies = [torch.tensor(r["reply_ids"]) for r in rows]
    ids = pad(replies, padding_value=processor.tokenizer.pad_token_id, padding_side="right")
    mask = pad([torch.ones_like(x) for x in replies], padding_value=0, padding_side="right")
    with masked(model, built.suppressed_token_ids):  # TRL's forward, as the mismatch trainer runs it
        theirs, their_entropy, _ = super(trainer.EpisodeRollouts, built).token_logps(
            model, torch.cat([prompts["input_ids"], ids], 1), torch.cat([prompts["attention_mask"], mask], 1),
            ids.size(1), compute_entropy=True, pixel_values=prompts["pixel_values"],
            image_grid_thw=prompts["image_grid_thw"], num_images=[len(r["prompt"].image_grid_thw) for r in rows],
            mm_token_type_ids=torch.cat([prompts["mm_token_type_ids"], torch.zeros_like(ids)], 1))
    real = mask.bool()
    assert (ours - theirs)[real].abs().max() < 1e-4 and (our_entropy - their_entropy)[real].abs().max() < 1e-3
    grads = []
    for logps in (ours, theirs):
        logps[real].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in params]).clone())
        for p in params:
            p.grad = None
    assert torch.allclose(grads[0], grads[1], atol=1e-4) and grads[1].abs().sum() > 0


def test_reply_logps_through_the_chunked_output_layer_are_its_full_softmaxs(policy):
    """The output layer as it is (LoRA on the layers only) is scored in chunks over the vocabulary by TRL's chunked
    log-prob function, whose outputs changed in trl 1.16 (five fields, `outputs` picking them): each reply token's
    log-prob and entropy are still those of the whole masked softmax at the temperature."""
    from contextlib import nullcontext

    from vlrl.model.vision_tokens import mask_tokens
    from vlrl.training import trl_bridge

    model, processor = policy
    ids = torch.tensor([processor.tokenizer("The bar for 2024 is 17, the tallest of the four.")["input_ids"]])
    positions, labels = torch.arange(2, ids.shape[1] - 1), ids[0, 3:]
    merged = {"forward": {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "positions": positions,
              "labels": labels}
    suppressed = (processor.tokenizer.convert_tokens_to_ids("<|image_pad|>"),)
    with torch.no_grad():
        logps, entropy = scoring.reply_logps(model, merged, torch.ones(1, len(labels)), temperature=0.7,
                                             suppressed=suppressed, autocast=nullcontext, compute_entropy=True,
                                             chunked=trl_bridge.chunked_logps)
        every = (mask_tokens(model(**merged["forward"]).logits[0, positions].float(), list(suppressed)) / 0.7)
        every = every.log_softmax(-1)
    assert logps.shape == entropy.shape == (1, len(labels))
    assert (logps[0] - every.gather(-1, labels[:, None])[:, 0]).abs().max() < 1e-4
    assert (entropy[0] + (every.exp() * every).sum(-1)).abs().max() < 1e-3


@pytest.mark.slow
@pytest.mark.head_lora  # grid-tiny's LoRA on the output layer
def test_an_interrupted_episode_run_resumes_to_the_uninterrupted_adapter(tmp_path):
    """Two steps uninterrupted, then the same run cut back to its first checkpoint (a kill right after it) and
    resumed by `vlrl train --resume`, which takes an episode run as it takes a single-turn one: the same adapter bit
    for bit on CPU, each step logged once, and the adapter exported and verified."""
    import shutil

    from safetensors.torch import load_file

    from vlrl import cli, export
    from vlrl import run as stages
    from vlrl.evaluation.records import read_records
    from vlrl.run_episodes import train_episodes

    config = _episode_config()
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    stages.start(config, whole)
    policy, processor = stages.load_policy(config, log=lambda *_: None)
    train_episodes(config, policy, processor, whole, log=lambda *_: None)
    shutil.copytree(whole, cut, ignore=shutil.ignore_patterns("checkpoint-2"))
    assert cli.main(["train", "--run-dir", str(cut), "--resume"]) == 0
    assert export.verify_adapter(cut / "adapter")["nonzero_lora_B"] > 0
    adapters = [load_file(str(d / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors")) for d in (whole, cut)]
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    logs = [read_records(d / "train_log.jsonl") for d in (whole, cut)]
    assert [r["step"] for r in logs[1] if "reward" in r] == [1, 2]  # no row twice
    assert [r["loss"] for r in logs[1] if "reward" in r] == [r["loss"] for r in logs[0] if "reward" in r]
    resolved = json.loads((whole / "grpo_config.json").read_text())
    assert resolved["vlrl"]["processes"] == 1 and resolved["vlrl"]["rollouts"] == "episodes"
    assert resolved["weight_decay"] == 0.0 and resolved["lr_scheduler_type"] == "cosine"  # the recipe, as set


@pytest.mark.slow
def test_episode_eval_writes_records_and_frames_and_resumes(policy, tmp_path):
    from vlrl.base.errors import EvalError
    from vlrl.episodes.evaluate import evaluate
    from vlrl.episodes.rollout import Settings

    model, processor = policy
    settings = Settings(max_turns=2, max_new_tokens=6, max_seq_length=4096, temperature=0.0)
    path, frames = tmp_path / "eval_before.jsonl", tmp_path / "frames"
    run = lambda seeds, s=settings: evaluate(model, processor, lambda: make("grid", size=3), seeds, path, s,
                                             env_name="grid", frame_dir=frames, batch_size=2)
    records = run([0, 1])
    assert [r["seed"] for r in records] == [0, 1] and all(r["kind"] == "episode" for r in records)
    first = records[0]
    assert len(first["turns"]) == 2 and first["frames"] == ["seed-0/t0.png", "seed-0/t1.png", "seed-0/t2.png"]
    assert all((frames / f).is_file() for f in first["frames"])
    path.write_text(path.read_text() + '{"id": "seed-2", "kind": "epis')  # an interrupt tore the last line
    again = run([0, 1, 2])
    assert again[:2] == records and again[2]["seed"] == 2 and len(path.read_text().splitlines()) == 3
    with pytest.raises(EvalError, match="resume with the same settings"):
        run([3], Settings(max_turns=3, max_new_tokens=6, max_seq_length=4096, temperature=0.0))


@pytest.mark.slow
def test_sampled_episodes_give_success_and_achievements_at_k(policy, tmp_path):
    """K sampled episodes per world (`[eval] samples`): one record per world, its draws seeded (the same policy
    draws the same episodes), and the comparison's success@k (`pass_at_k`, measure "success") and, for Crafter,
    achievements@k with the worlds that any episode reached each achievement in."""
    pytest.importorskip("crafter")
    from vlrl.base.errors import EvalError
    from vlrl.episodes.evaluate import sample
    from vlrl.episodes.rollout import Settings
    from vlrl.evaluation import compare

    model, processor = policy
    settings = Settings(max_turns=2, max_new_tokens=8, max_seq_length=4096, temperature=1.0)
    make_env = lambda: make("crafter", size=64, area=32, max_turns=2)
    path = tmp_path / "samples_before.jsonl"
    records = sample(model, processor, make_env, [0, 1], path, settings, samples=3, env_name="crafter", batch_size=6)
    assert [r["seed"] for r in records] == [0, 1] and all(len(r["draws"]) == 3 for r in records)
    assert all(isinstance(d["achievements"], list) and d["length"] == 2 for r in records for d in r["draws"])
    again = sample(model, processor, make_env, [0, 1], tmp_path / "again.jsonl", settings, samples=3,
                   env_name="crafter", batch_size=6)
    assert again == records  # seeded per world
    assert sample(model, processor, make_env, [0, 1], path, settings, samples=3, env_name="crafter") == records
    with pytest.raises(EvalError, match="temperature above 0"):
        sample(model, processor, make_env, [0], path, Settings(temperature=0.0), samples=3, env_name="crafter")
    # an "after" whose episodes all unlocked collect_wood, and one world place_table too
    after = [{**r, "draws": [{**d, "correct": True, "achievements": ["collect_wood"] + (["place_table"] if r["seed"]
              else [])} for d in r["draws"]]} for r in records]
    (tmp_path / "samples_after.jsonl").write_text("".join(json.dumps(r) + "\n" for r in after))
    episode = lambda s: {"id": f"seed-{s}", "kind": "episode", "seed": s, "success": False, "return": 0.0,
                         "turns": [], "metrics": {"achievements": []}}
    c = compare.with_samples(compare.compare([episode(0), episode(1)], [episode(0), episode(1)]), path,
                             tmp_path / "samples_after.jsonl")
    assert c["pass_at_k"]["measure"] == "success" and c["pass_at_k"]["pass_at_k_after"] == [1.0, 1.0, 1.0]
    ak = c["achievements_at_k"]
    assert ak["achievements_at_k_after"] == [1.5, 1.5, 1.5] and ak["reached_after"]["place_table"] == 0.5
    summary = compare.summary(c)
    assert "success@3" in summary and "achievements@3" in summary and "place_table 0% -> 50%" in summary


@pytest.mark.slow
def test_crafter_tiny_runs_end_to_end(tmp_path, monkeypatch):
    """The crafter-tiny preset's whole loop on real Crafter worlds: baseline episodes, two GSPO steps, episodes after,
    the comparison and the report. The export stage then verifies the adapter: trained when some group's returns
    differed, else refused with its reason (four turns of the tiny model rarely unlock an achievement)."""
    pytest.importorskip("crafter")
    from vlrl import cli, export
    from vlrl.episodes import rollout
    from vlrl.evaluation.records import read_records

    played, play_batch = [], rollout._play_batch  # how many episodes each rollout batch played together

    def recording(model, processor, make_env, seeds, settings, session, decoding):
        played.append((len(seeds), session.rows))
        return play_batch(model, processor, make_env, seeds, settings, session, decoding)

    monkeypatch.setattr(rollout, "_play_batch", recording)
    run = tmp_path / "crafter"
    # two of each step's four training episodes at a time: the 2B/8B presets' cap on the rollout's memory
    code = cli.main(["run", "--preset", "crafter-tiny", "--run-dir", str(run), "--set",
                     "training.generation_batch_size=2"])
    # the 4 eval episodes at once, before and after; each step's 4 training episodes through 2 slots
    assert played == [(4, 4), (4, 2), (4, 2), (4, 4)]
    before, after = read_records(run / "eval_before.jsonl"), read_records(run / "eval_after.jsonl")
    assert [r["seed"] for r in before] == [r["seed"] for r in after] == [0, 1, 2, 3]
    assert all(r["env"] == "crafter" and r["length"] >= 1 for r in before + after)
    assert all((run / "episode_frames" / "after" / f).is_file() for r in after for f in r["frames"])
    steps = [r for r in read_records(run / "train_log.jsonl") if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and (run / "report.html").is_file()
    assert all(0 < r["rollout_time"] < r["step_time"] for r in steps)  # the episodes' playing, within the step
    # within it, the engine's prefills and decoding steps (the session's counters), as single-turn steps log them
    assert all(0 < r["rollout/prefill_time"] < r["rollout_time"] for r in steps)
    assert all(0 < r["rollout/decode_ms_per_step"] < 1000 * r["rollout_time"] for r in steps)
    # each turn's sampling log-probs reach the loss: the mismatch is measured, as validation's refusal of TIS says
    assert all(0 <= r["sampling/rollout_train_kl"] < 1e-3 for r in steps)
    if any(r["grad_norm"] > 0 for r in steps):
        assert code == 0 and export.verify_adapter(run / "adapter")["nonzero_lora_B"] > 0
    else:  # no reward anywhere: no advantage, no update, and the export says so instead of shipping a zero adapter
        assert code == 1


def test_an_episode_runs_rollout_batch_need_not_divide_like_trls():
    config = cfg.preset("crafter-tiny", overrides=["training.generation_batch_size=2"])
    assert config.training.generation_batch_size == 2  # under per_device_train_batch_size 4: fine for episodes
    with pytest.raises(ConfigError, match="must be a multiple of per_device_train_batch_size"):
        cfg.preset("tiny", overrides=["training.generation_batch_size=3"])


def test_episode_runs_take_several_processes_and_refuse_unsloth():
    assert cfg.preset("grid-tiny", overrides=["training.per_device_train_batch_size=4",
                                              "training.num_generations=4"], num_processes=2).env.name == "grid"
    with pytest.raises(ConfigError, match='backend = "unsloth" with \\[env\\] name'):
        cfg.preset("grid-tiny", overrides=["model.backend=unsloth"])


def test_sgd_at_a_large_step_refuses_the_recipes_weight_decay():
    with pytest.raises(ConfigError, match=r"shrinks every trained weight by 50% a step; set \[training\] weight_d"):
        cfg.preset("grid-tiny", overrides=["training.weight_decay=-1"])
    assert cfg.preset("grid-tiny").training.weight_decay == 0.0
