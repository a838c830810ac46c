"""Videos through GRPO training: items whose prompt holds a clip (`video`, `video_metadata`: `vlrl.base.video`) are
tokenized through the processor's video path, decoded by the engine with their clips, and scored by the training
forward with them.

TRL 1.14's GRPOTrainer builds its rollouts' and its loss forward's vision tensors from a row's pictures only: a
clip would reach neither (the prompt would hold `<|video_pad|>` tokens with no `pixel_values_videos` behind them).
`VideoInputs`, mixed into vlrl's single-turn trainer innermost, fills the three places:

- `tokenize_prompts`: each prompt through the processor with its clip's frames and their metadata (Qwen3-VL writes
  each frame's timestamp from it; `vlrl.model.prompts.video_kwargs`), so the prompt ids hold the video's tokens and
  the rollout batch its `pixel_values_videos`, `video_grid_thw` and `mm_token_type_ids`, which the engine decodes
  with (`vlrl.training.mismatch`);
- `generate_and_score`: the batch TRL returns gets each row's clip tensors (a list, one entry a row, so TRL's
  shuffle and split of a generation batch into micro-batches keep them with their rows) and `mm_token_type_ids` over
  prompt + completion, as TRL gives a picture's;
- `token_logps`: the scoring forward gets the micro-batch's clips (`vlrl.training.loss.SCORER_INPUTS` carries them
  there): each call of the model takes the rows it scores.
"""

from __future__ import annotations

import contextlib

import torch

from vlrl.base.errors import ConfigError
from vlrl.model.prompts import row_video, video_kwargs
from vlrl.training.loss import VIDEO_INPUTS as VIDEO_FIELDS  # in a batch: a list of tensors, one a row


class VideoInputs:
    """Mixed into vlrl's single-turn trainer (`vlrl.training.train.build_trainer`), innermost: items with a video
    train with it. A batch mixing items with pictures and items with a video is refused in one line."""

    _videos = None  # the generation batch's clips while TRL tokenizes it: one (frames, metadata) a row
    _prompt_fields = None  # what `tokenize_prompts` gave: each row's clip tensors and prompt token types

    def generate_and_score(self, inputs):
        videos = [row_video(x) for x in inputs]
        if not any(videos):
            return super().generate_and_score(inputs)
        if not all(videos) or any(x.get("image") is not None or x.get("images") for x in inputs):
            raise ConfigError("a training batch mixes items with a video and items with pictures; vlrl trains a video "
                              "item on its clip alone: train them in separate runs.")
        self._videos, self._prompt_fields = videos, None
        try:  # TRL reads a row's `image` key as a picture, None or not: the clip is the item's one input
            out = super().generate_and_score([{k: v for k, v in x.items() if k not in ("image", "images")}
                                              for x in inputs])
            fields = self._prompt_fields
        finally:
            self._videos = self._prompt_fields = None
        return self._with_videos(out, fields)

    def tokenize_prompts(self, prompts):
        if self._videos is None:
            return super().tokenize_prompts(prompts)
        processor = self.processing_class
        ids, rows = [], {"pixel_values_videos": [], "video_grid_thw": [], "mm_token_type_ids": []}
        for prompt, video in zip(prompts, self._videos, strict=True):
            text = processor.apply_chat_template(prompt, chat_template=self.chat_template, add_generation_prompt=True,
                                                 tokenize=False, **self.chat_template_kwargs)
            tokenized = processor(text=[text], return_tensors="pt", **video_kwargs([video]))
            ids.append(tokenized["input_ids"][0].tolist())
            for key, values in rows.items():
                values.append(tokenized[key][0].tolist() if key == "mm_token_type_ids" else tokenized[key])
        self._prompt_fields = rows
        fields = {"pixel_values_videos": torch.cat(rows["pixel_values_videos"]),
                  "video_grid_thw": torch.cat(rows["video_grid_thw"]), "mm_token_type_ids": rows["mm_token_type_ids"]}
        return ids, None, fields

    def _with_videos(self, out: dict, fields: dict) -> dict:
        """TRL's batch with each row's clip tensors and the token types over prompt + completion."""
        device = out["prompt_ids"].device
        width = out["prompt_ids"].size(1)
        types = torch.zeros(out["prompt_ids"].size(0), width + out["completion_ids"].size(1), dtype=torch.long,
                            device=device)
        for row, kinds in enumerate(fields["mm_token_type_ids"]):  # prompts are left-padded
            types[row, width - len(kinds):width] = torch.tensor(kinds, device=device)
        out = {**out, "mm_token_type_ids": types,
               **{key: [t.to(device) for t in fields[key]] for key in VIDEO_FIELDS}}
        if out.get("old_per_token_logps") is not None:  # TRL scored it without the clips: again, with them
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad():
                out["old_per_token_logps"] = self.token_logps(
                    self.model, ids, mask, out["completion_ids"].size(1), mm_token_type_ids=types,
                    **{key: out[key] for key in VIDEO_FIELDS})[0]
        return out

    def token_logps(self, model, *args, **kwargs):
        clips = {key: kwargs.pop(key, None) for key in VIDEO_FIELDS}
        if clips["pixel_values_videos"] is None:
            return super().token_logps(model, *args, **kwargs)
        with clips_fed(self.accelerator.unwrap_model(model), clips):
            return super().token_logps(model, *args, **kwargs)


@contextlib.contextmanager
def clips_fed(model, clips: dict):
    """While inside, each forward of `model` gets the clips of the rows it is called on: `clips` holds one tensor a
    row (`VIDEO_FIELDS`), and successive calls take successive rows (TRL's scoring forward goes through the batch in
    order, a chunk of rows a call)."""
    pixels, grids = list(clips["pixel_values_videos"]), list(clips["video_grid_thw"])
    taken = [0]

    def feed(module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        start, stop = taken[0], taken[0] + input_ids.size(0)
        taken[0] = stop
        return args, {**kwargs, "pixel_values_videos": torch.cat(pixels[start:stop]).to(input_ids.device),
                      "video_grid_thw": torch.cat(grids[start:stop]).to(input_ids.device)}

    # on the backbone that embeds the clips (Qwen3-VL's `Qwen3VLModel`, the innermost module with a video path): the
    # model's forward passes its own `pixel_values_videos=None` down to it, and TRL >= 1.16 may call it directly
    backbone = [m for m in model.modules() if hasattr(m, "get_video_features")][-1]
    handle = backbone.register_forward_pre_hook(feed, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
