"""ResNet-20 grids against single runs, shared by tests/test_grid.py (CPU) and
tests/test_gpu.py (CUDA, with and without CUDA graphs)."""

import pytorch_lightning as pl
import torch

from pl_privfed import FederatedModule
from pl_privfed.datamodules import DigitsDataModule
from pl_privfed.grid import GridModule, rebuild_algorithm
from pl_privfed.models import resnet20


class TinyImages(DigitsDataModule):
    """The digits as float64 3 × 8 × 8 images, for ResNet-20 (its adaptive pooling takes any
    size: at 8 × 8 its three stages see 8, 4 and 2 pixels a side, every convolution, BatchNorm
    and downsampling shortcut still runs, at a sixteenth of CIFAR-10's 32 × 32 cost)."""

    def preprocess(self, inputs, train, round_index):
        images = inputs.reshape(-1, 1, 8, 8).repeat(1, 3, 1, 1)
        return images.view(*inputs.shape[:-1], 3, 8, 8).double()


def fit_resnet(root, algorithm, grid, accelerator="cpu", steps=6, **module_kwargs):
    """ResNet-20 (convolutions and BatchNorm) in float64, 3 clients × 8 images, trained for
    ``steps`` rounds as a grid (``grid`` a dict) or a single run (``grid=None``).

    Float64, because in float32 a grid's per-client convolutions and a single run's shared ones
    round differently, and a few normalized rounds amplify that past 1e-5 (seen on the CPU)."""
    torch.manual_seed(0)
    if grid is None:
        module = FederatedModule(resnet20().double(), algorithm, **module_kwargs)
    else:
        module = GridModule(resnet20().double(), algorithm, grid=grid, **module_kwargs)
    pl.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=steps,
        logger=False,
        default_root_dir=root,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    ).fit(module, datamodule=TinyImages(num_clients=3, batch_size=8))
    return module


def assert_grid_follows_single_runs(root, algorithm, grid, **fit_kwargs):
    """Every configuration of the grid ends with the parameters and BatchNorm buffers of its
    own single run (to 1e-9); returns the grid's module."""
    batched = fit_resnet(root, algorithm, grid, **fit_kwargs)
    for k, point in enumerate(batched.grid_points):
        single = fit_resnet(root, rebuild_algorithm(algorithm, point), None, **fit_kwargs)
        torch.testing.assert_close(
            batched.grid_params[k], single.layout.flatten(single.model), atol=1e-9, rtol=1e-9
        )
        for name, buf in single.model.named_buffers():
            grid_buf = getattr(batched, batched._grid_buffer_names[name])[k]
            torch.testing.assert_close(grid_buf, buf, atol=1e-9, rtol=1e-9)
    return batched
