"""Hugging Face ``transformers.Trainer`` on nbtrain's ranks.

Inside ``%%ray_train`` (or a function given to ``nbtrain.launch``) a ``Trainer`` runs
on every rank over the process group nbtrain already joined: each rank has
torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``...), which
``TrainingArguments`` reads. Add :class:`NbtrainCallback` to stream what the
Trainer logs, on every rank, to the dashboard, and to keep its checkpoints with
the run::

    trainer = transformers.Trainer(model=model, args=args, train_dataset=train_set,
                                   callbacks=[nbtrain.huggingface.NbtrainCallback()])
    trainer.train()

``run.checkpoint_dir()`` then holds the last checkpoint the Trainer saved
(``model.safetensors``, ``config.json``...), loadable with ``from_pretrained``.
Ray Train's own ``ray.train.huggingface.transformers.RayTrainReportCallback`` and
``prepare_trainer`` work as well, through nbtrain's Ray Train support.
Needs ``pip install 'nbtrain[huggingface]'`` (transformers and accelerate).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbtrain._cluster.rank.reporting import report
from nbtrain._cluster.rank.session import current_session
from nbtrain._cluster.rank.worker_api import store_checkpoint
from nbtrain._cluster.storage.run_storage import pack_directory

try:
    from transformers import TrainerCallback
except ModuleNotFoundError:
    msg = "nbtrain.huggingface needs transformers on the cluster: pip install 'nbtrain[huggingface]'."
    raise ModuleNotFoundError(msg) from None

__all__ = ["NbtrainCallback"]


class NbtrainCallback(TrainerCallback):
    """Streams the Trainer's logs (loss, learning rate, eval metrics...) from every rank; keeps its checkpoints."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        numbers = {key: value for key, value in (logs or {}).items() if isinstance(value, (int, float))}
        if numbers:
            report(step=state.global_step, **numbers)

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, lr_scheduler: Any = None,
                       **kwargs: Any) -> None:
        """The notebook may steer the Trainer's optimizer (``run.adjust``, pause, commands)."""
        steering = current_session().steering
        steering.epochs_counted = True
        if optimizer is not None:  # Accelerate's wrapper: steered as the torch optimizer inside, with the scheduler
            steering.steer(optimizer, (lr_scheduler,) if lr_scheduler else ())

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        current_session().steering.at_epoch_start(int(state.epoch or 0))  # run.stop(after="epoch")

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if current_session().steering.stop_requested():  # run.stop(after="epoch"): train() returns as it ends
            control.should_training_stop = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if current_session().steering.checkpoint_wanted:  # run.checkpoint_now(): the Trainer saves now
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        current_session().steering.saved_checkpoint()
        if not state.is_world_process_zero:
            return
        saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if saved.is_dir():
            store_checkpoint(pack_directory(saved), "directory")
