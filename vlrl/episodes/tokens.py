"""An episode's contexts as token ids: what the model saw each turn, its earlier replies as the ids it generated
(token in, token out).

Rendering a conversation and tokenizing its text again need not give back the ids a reply was generated as (a
tokenizer has many ways to spell one text, and a sampled reply may take a rare one), so a context built that way
is not what the model produced, and the next turn's context does not extend the previous one. Here the chat
template renders the capped conversation with each reply's place marked (`MARK`); the text between the marks is
tokenized by the processor (each image expanded into its image tokens) and each reply's ids go in its place. So a
reply stays whole, as generated: a template that would rewrite an earlier assistant turn (a thinking model's drops
its reasoning) does not rewrite it here, as in prime-rl's and verl's multi-turn rollouts.

While no image is dropped, turn t+1's context is turn t's context, then its reply's ids, then the new text after the
reply's mark (the template's end of the reply, the next observation and the generation prompt): only that piece is
tokenized. So between image drops each turn's context starts with the previous turn's context and reply, which is
what lets the update score an episode's turns in one forward (`vlrl.episodes.scoring`).
"""

from __future__ import annotations

import itertools

from vlrl.engine.token_types import Tokenized
from vlrl.episodes.context import to_processor

MARK = "\ue000"  # a private-use character: a reply's place in the rendered text


class Contexts:
    """One episode's contexts, turn after turn: `next(messages, replies, dropped)` gives the context that asks for
    the next reply (`token_types.Tokenized`)."""

    def __init__(self, processor):
        self.processor = processor
        self.last: Tokenized | None = None
        self.replies = 0  # replies in the last context
        self.dropped = 0  # images dropped from the last context

    def next(self, messages: list[dict], replies: list[list[int]], dropped: int) -> Tokenized:
        """The context of `messages` (capped: the images it shows, `dropped` of them dropped) asking for the next
        reply; `replies` are the content ids of its assistant messages, in order (each reply's ids without the stop
        token that ended it: the template writes its own end of turn)."""
        pieces, images = _pieces(self.processor, messages)
        marker = getattr(self.processor, "image_token", "<|image_pad|>")
        ends = list(itertools.accumulate(piece.count(marker) for piece in pieces))  # each piece's images end here

        def piece(k: int) -> Tokenized:
            return self._tokenize(pieces[k], images[ends[k] - pieces[k].count(marker):ends[k]])

        if self.last is not None and dropped == self.dropped and len(replies) == self.replies + 1:
            context = _join([self.last, Tokenized(list(replies[-1])), piece(len(pieces) - 1)])  # only the new text
        else:
            parts = [piece(0)]
            for k, reply in enumerate(replies, start=1):
                parts += [Tokenized(list(reply)), piece(k)]
            context = _join(parts)
        self.last, self.replies, self.dropped = context, len(replies), dropped
        return context

    def _tokenize(self, text: str, images: list) -> Tokenized:
        out = self.processor(text=[text], images=images or None, return_tensors="pt")
        pictures = "pixel_values" in out
        return Tokenized(out["input_ids"][0].tolist(), (out["pixel_values"],) if pictures else (),
                         (out["image_grid_thw"],) if pictures else (), type_ids="mm_token_type_ids" in out)


def _pieces(processor, messages: list[dict]) -> tuple[list[str], list]:
    """The rendered context split at its replies' places, and its images in order. An observation's text loses any
    MARK character it holds (a private-use character no environment needs), so the marks are the replies'."""
    marked = [{**m, "content": [{"type": "text", "text": MARK}]} if m["role"] == "assistant" else _unmarked(m)
              for m in messages]
    qwen, images = to_processor(marked)
    text = processor.apply_chat_template(qwen, add_generation_prompt=True, tokenize=False)
    return text.split(MARK), images


def _unmarked(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": content.replace(MARK, "")}
    return {**message, "content": [{**p, "text": p["text"].replace(MARK, "")} if isinstance(p.get("text"), str) else p
                                   for p in content or []]}


def _join(parts: list[Tokenized]) -> Tokenized:
    return Tokenized([i for p in parts for i in p.ids], tuple(x for p in parts for x in p.pixels),
                     tuple(x for p in parts for x in p.grids),
                     type_ids=parts[0].type_ids)  # the first part is the processor's, as every text part
