"""The evaluation layer: eval records, scored generation, statistics of a before/after pair.

It owns the record files (`records`), batched scored generation (`evaluate`, and `sharded_eval` over a launch's
processes), pass@k (`passk`) and the comparisons of two evals (`compare` for single-turn records, `episode_compare`
for episode records, which `compare` dispatches to), the runs of one config under several training seeds
(`seeds`), and whether a gain needs the picture (`pictures`). It may import base, grammar, model, engine, data,
envs and config; never training, the episode rollouts or the stages.
"""
