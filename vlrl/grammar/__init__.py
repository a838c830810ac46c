"""The answer grammar: how a completion is read and scored, the same in rewards, evals and the browser calculator.

It owns reading values (`values`), multi-choice options (`choices`), the format and matching (`answers`), symbolic
equivalence (`symbolic`), the reward functions TRL calls (`rewards`) and thinking models' budgets (`thinking`). It
may import only `vlrl.base.errors` of vlrl, and never torch, a model or a trainer: the reward calculator runs these
modules in the browser. Users import the rewards as `from vlrl.rewards import format_reward`.
"""
