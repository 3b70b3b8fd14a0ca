"""A tiny command-line configuration (digits, a few rounds) written into a folder."""

from pathlib import Path

#: a small federation that runs many rounds per second on a CPU
TINY = """\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 100000
  val_check_interval: 1000
  check_val_every_n_epoch: null
  num_sanity_val_steps: 0
  log_every_n_steps: 1000
  enable_progress_bar: false
  logger:
    class_path: pytorch_lightning.loggers.CSVLogger
    init_args: {save_dir: logs, name: tiny}
model:
  model:
    class_path: pl_privfed.models.MLP
    init_args: {in_features: 64, hidden_sizes: [8], num_classes: 10}
  algorithm:
    class_path: pl_privfed.algorithms.AlphaNormEC
    init_args: {step_size: 0.1, beta: 0.1, alpha: 0.01}
data:
  class_path: pl_privfed.datamodules.DigitsDataModule
  init_args:
    num_clients: 5
    batch_size: 8
    seed: 0
    partitioner:
      class_path: pl_privfed.datamodules.IIDPartitioner
      init_args: {seed: 1}
"""


def tiny_config(folder: Path) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(TINY)
    return path
