"""The training layer: the one GSPO training core and the supervised warm start.

It owns the trainer built from a run config (`train`), its episode rollouts inside TRL's batch
(`episode_trainer`), the rollout/training mismatch and its correction (`mismatch`), DAPO's redraws
(`dynamic_sampling`), the trainer callbacks (`callbacks`), the collapse monitor (`collapse`), the bridge to TRL's
private surface (`trl_bridge`), the SFT loop (`sft`) and the warm-start policy (`warmstart`). It may import every
layer below it, the episode rollouts included; never export, report or the stages.
"""
