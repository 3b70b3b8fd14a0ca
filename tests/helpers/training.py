"""A quiet CPU Trainer and the callbacks that stop a run or record its validation rounds."""

import pytorch_lightning as pl


def trainer(tmp_path=None, **kwargs):
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


class StopAt(pl.Callback):
    """Interrupts a run after a given round, as a crash or a time limit would."""

    def __init__(self, round_index):
        self.round_index = round_index

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.round_index:
            trainer.should_stop = True


class Recorder(pl.Callback):
    """The rounds at which Lightning's validation loop ran (sanity checks excluded) and, for
    each, the logged ``val/acc`` and ``val/loss``."""

    def __init__(self):
        self.rounds, self.metrics = [], []

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.rounds.append(trainer.global_step)
            logged = trainer.callback_metrics.items()
            self.metrics.append({k: float(v) for k, v in logged if k in ("val/acc", "val/loss")})


def short_fit(config, output_dir, rounds=3, *extra):
    """`pl-privfed fit` arguments of a short, quiet run of ``config`` into ``output_dir``: no
    logger, no progress bar, ``rounds`` rounds validated once at the end; ``extra`` appended."""
    return [
        "fit",
        "--config",
        str(config),
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_steps",
        str(rounds),
        "--trainer.val_check_interval",
        str(rounds),
        "--output_dir",
        str(output_dir),
        *extra,
    ]
