"""Episode runs: a model acting in a visual environment over several turns, trained with GSPO on whole episodes.

    context    the conversation in the OpenAI multimodal schema, the image caps, the processor form
    rollout    multi-turn generation batched across episodes (caps, measured context, counted endings)
    warm       the local model's warm start on random-action turns
    evaluate   one record per episode with its frames, resumable; a run's eval seeds into its files

Training on episodes is `vlrl.training.episode_trainer` (it sits in the training layer, above this one), and
comparing two evals is `vlrl.evaluation.compare`, for episodes as for items. A run's eval and compare stages are
`vlrl.run`'s, for both kinds of run; the training stage and `run()`, which `vlrl run` calls for a run file with an
[env] section, are `vlrl.run_episodes`.
"""
