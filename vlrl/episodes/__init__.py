"""Episode runs: a model acting in a visual environment over several turns, trained with GSPO on whole episodes.

    context    the conversation in the OpenAI multimodal schema, the image caps, the processor form
    rollout    multi-turn generation batched across episodes (caps, measured context, counted endings)
    trainer    GSPO over episodes in TRL's GRPOTrainer: one advantage per episode, every assistant turn a row
    warm       the local model's warm start on random-action turns
    evaluate   one record per episode with its frames, resumable
    compare    success (exact McNemar) and return (paired permutation) before and after

Their stages and `run()`, which `vlrl run` calls for a run file with an [env] section, are `vlrl.run_episodes`.
"""
