"""The engine's session (`vlrl.engine.session`): an episode's KV cache kept from turn to turn while its context only
grows, on the warm-started tiny model (its replies stop at unequal lengths), with the static cache of the GPU's path
run eager here. What a turn decodes from the kept cache is what a whole prefill gives (tokens and log-probs), only
the new tokens are prefilled, and every context that does not extend its slot's cache is prefilled whole."""

import pytest
import torch

from vlrl import engine
from vlrl.config import runfile as cfg
from vlrl.engine import loop, session, token_types
from vlrl.envs import make
from vlrl.episodes import rollout

SETTINGS = {"max_turns": 5, "max_new_tokens": 24, "max_seq_length": 4096, "temperature": 0.0,
            "record_logps": True}


@pytest.fixture(scope="module")
def policy(tiny_dir):
    from vlrl.model import loading as model

    base, processor = model.load_model(str(tiny_dir), backend="transformers")
    return model.add_lora(base, model.LoraSettings(r=8, alpha=16)), processor


@pytest.fixture
def decodes(monkeypatch):
    """Each session call's stats, in order, with the cache's written length after it and its live contexts' ids."""
    calls, decode = [], engine.Session.decode

    def recorded(self, model, processor, contexts, decoding):
        out = decode(self, model, processor, contexts, decoding)
        written = int(self.state.cache.layers[0].cumulative_length) if self.state is not None else None
        calls.append({**out.stats, "written": written, "state": self.state,
                      "context_tokens": sum(len(c.ids) for c in contexts if c is not None)})
        return out

    monkeypatch.setattr(engine.Session, "decode", recorded)
    monkeypatch.setattr(loop, "STATIC_ON_CPU", True)
    return calls


def _play(policy, seeds, slots=0, **settings):
    model, processor = policy
    return rollout.play(model, processor, lambda: make("grid", size=3), seeds,
                        rollout.Settings(**{**SETTINGS, **settings}), batch_size=slots)


def _same_episodes(ours, theirs):
    assert [e.reply_ids for e in ours] == [e.reply_ids for e in theirs]
    gaps = [abs(a - b) for x, y in zip(ours, theirs) for p, q in zip(x.reply_logps, y.reply_logps)
            for a, b in zip(p, q, strict=True)]
    assert gaps and max(gaps) < 1e-5


def test_turns_decoded_from_the_kept_cache_are_a_whole_prefills(policy, decodes, monkeypatch):
    """Greedy episodes decoded from the kept cache give the dynamic cache's replies and log-probs (rows that stop at
    different lengths, the cache lengthened as the contexts grow); a turn that extends prefills only its new tokens,
    and the slots a decode writes are the ones counted."""
    whole = _play(policy, [0, 1, 2], max_images_in_context=8)
    decodes.clear()
    monkeypatch.setattr(session, "SESSION_CACHE_BUCKET", 128)
    kept = _play(policy, [0, 1, 2], fast_generation=True, max_images_in_context=8)
    _same_episodes(kept, whole)
    assert len({len(r) for e in kept for r in e.reply_ids}) > 1  # replies of unequal lengths
    extended = [d for d in decodes if d.get("reused")]
    # every later turn extends, but where the slots that shorter replies left would take the cache past the length a
    # whole prefill takes: that turn prefills the whole batch, packed again
    assert [d.get("whole") for d in decodes if not d.get("reused")][:1] == ["first"]
    assert {d.get("whole") for d in decodes[1:] if not d.get("reused")} <= {"full"} and len(extended) >= 3
    for call in extended:
        assert call["prefilled"] + call["reused"] == call["context_tokens"]
        assert call["prefilled"] < call["context_tokens"] / 2
        assert call["written"] == call["state"].start + call["steps"] - 1  # the last drawn token is never fed
    assert [d["cache_length"] for d in decodes] == sorted(d["cache_length"] for d in decodes)
    assert len({d["cache_length"] for d in decodes}) > 1  # lengthened in place, never prefilled again for it
    assert all(d["cache_length"] % 128 == 0 for d in decodes)  # the session's one bucket, not the rollout's
    assert {d["rows"] for d in decodes} == {3}
    assert rollout.settings_for(cfg.preset("crafter-tiny"), "train").fast_generation


def test_a_context_that_does_not_extend_its_slot_is_prefilled_whole(policy, decodes):
    """An image dropped from the context, or a new episode in a slot, breaks the extension: that turn prefills the
    whole batch, and the replies stay the dynamic cache's."""
    dropping = {"max_images_in_context": 2, "image_drop_step": 1}
    whole = _play(policy, [0, 1, 2], 2, **dropping)
    decodes.clear()
    kept = _play(policy, [0, 1, 2], 2, fast_generation=True, **dropping)
    _same_episodes(kept, whole)
    whole = [d.get("whole") for d in decodes]
    # turn 2 of the first two episodes extends (two images), turns 3-5 each drop one; then the third episode, new
    # to its slot, alone
    assert whole == ["first", None] + ["new context"] * 3 + ["new context", None] + ["new context"] * 3
    assert decodes[5]["rows"] == 2 and decodes[5]["context_tokens"] == len(kept[2].contexts[0].ids)


def test_extension_needs_the_same_ids_and_the_same_pictures():
    picture = torch.zeros(4, 2)
    taken = token_types.Tokenized([1, 2, 3], (picture,), (torch.tensor([[1, 2, 2]]),))
    grown = token_types.Tokenized([1, 2, 3, 4], (picture,), (torch.tensor([[1, 2, 2]]),))
    assert session._extends(taken, grown)
    assert not session._extends(taken, token_types.Tokenized([1, 2, 3, 4], (picture.clone(),), grown.grids))
    assert not session._extends(taken, token_types.Tokenized([1, 2, 4, 4], (picture,), grown.grids))
    assert not session._extends(taken, taken)  # nothing new: nothing to start decoding from


def test_a_session_takes_one_context_per_slot(policy):
    model, processor = policy
    decoding = engine.decoding_for(model, processor, max_new_tokens=2)
    with pytest.raises(ValueError, match="2 slots"):
        engine.Session(2).decode(model, processor, [None, None], decoding)



def test_flex_decoding_attention_gives_the_same_episodes(policy, decodes, monkeypatch):
    """With `attention.FLEX_ROWS` covering the batch, every decoding step of the kept cache attends through
    FlexAttention (left padding and skipped slots masked as a score modification), and the episodes are the whole
    prefill's: the same greedy replies, log-probs within 1e-5."""
    from vlrl.engine import attention

    whole = _play(policy, [0, 1, 2], max_images_in_context=8)
    calls, flex = [], attention.flex_decode_attention

    def counted(*args, **kwargs):
        calls.append(args[3].shape)
        return flex(*args, **kwargs)

    monkeypatch.setattr(attention, "flex_decode_attention", counted)
    monkeypatch.setattr(attention, "FLEX_ROWS", 8)
    kept = _play(policy, [0, 1, 2], fast_generation=True, max_images_in_context=8)
    _same_episodes(kept, whole)
    assert calls and {shape[0] for shape in calls} == {3}
    assert any(d.get("reused") for d in decodes)  # turns decoded from the kept cache, its skipped slots masked
