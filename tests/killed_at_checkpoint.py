"""`vlrl ARGS...` that kills itself (SIGKILL) the moment the trainer has saved checkpoint STEP: every callback's
`on_save` has run, nothing after it does. tests/test_train.py's kill-and-resume, with the kill at the same point on
any machine instead of wherever a poll of the checkpoint's files happens to catch the run.

    python tests/killed_at_checkpoint.py STEP train --config run.toml --run-dir runs/killed
"""

import os
import signal
import sys

from transformers.trainer_callback import CallbackHandler

from vlrl.cli import main


def kill_after_saving(step: int) -> None:
    on_save = CallbackHandler.on_save

    def saved(self, args, state, control, **kwargs):
        control = on_save(self, args, state, control, **kwargs)
        if state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return control

    CallbackHandler.on_save = saved


if __name__ == "__main__":
    kill_after_saving(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
