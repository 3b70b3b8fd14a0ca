"""CUDA checks (skipped without a GPU; CI has none, lent GPU machines run them).

TF32 is disabled: on its own it makes the vmap and loop backends differ by ~5 %.
"""

import pytest
import torch
from helpers.resnet_grid import assert_grid_follows_single_runs, fit_resnet
from torch import nn

from pl_privfed.grads import GradientOracle
from pl_privfed.models import resnet20

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def no_tf32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def cifar_batch(n: int, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, batch, 3, 32, 32, generator=g)
    return inputs.cuda(), torch.randint(0, 10, (n, batch), generator=g).cuda()


def test_vmap_equals_loop_resnet20_batchnorm_cuda():
    torch.manual_seed(0)
    model = resnet20().cuda()
    inputs, targets = cifar_batch(4, 16, 0)
    outs = {}
    for backend in ("vmap", "loop"):
        oracle = GradientOracle(model, nn.CrossEntropyLoss(), backend)
        outs[backend] = oracle(oracle.layout.flatten(model), inputs, targets)
    torch.testing.assert_close(outs["vmap"].grads, outs["loop"].grads, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(outs["vmap"].losses, outs["loop"].losses, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["cnn", "resnet20_groupnorm", "text"])
def test_layer_rules_equal_autograd_on_cuda(name):
    """The layer-rule backend on the GPU against plain autograd per client and per example
    (float64, 1e-10): the mixed models of tests/test_layer_rules.py."""
    from helpers.layer_rules import check_all, mixed_model

    check_all(*mixed_model(name), device="cuda")


def test_cuda_graph_replays_match_eager_calls():
    torch.manual_seed(0)
    eager_model, graph_model = resnet20().cuda(), resnet20().cuda()
    graph_model.load_state_dict(eager_model.state_dict())
    eager = GradientOracle(eager_model, nn.CrossEntropyLoss(), "vmap")
    graphed = GradientOracle(graph_model, nn.CrossEntropyLoss(), "vmap", cuda_graph=True)
    x = eager.layout.flatten(eager_model)
    for step in range(4):  # new inputs and parameters every call; buffers committed in between
        inputs, targets = cifar_batch(3, 8, step)
        a, b = eager(x, inputs, targets), graphed(x, inputs, targets)
        torch.testing.assert_close(b.grads, a.grads, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(b.losses, a.losses, atol=1e-6, rtol=1e-6)
        eager.commit_buffers()
        graphed.commit_buffers()
        for (k, u), v in zip(eager_model.state_dict().items(), graph_model.state_dict().values()):
            torch.testing.assert_close(v, u, atol=1e-6, rtol=1e-5, msg=k)
        x = x - 0.1 * a.grads.mean(0)
    per_client = x + 0.01 * torch.randn(3, x.numel(), device="cuda")
    torch.testing.assert_close(
        graphed(per_client, inputs, targets).grads,
        eager(per_client, inputs, targets).grads,
        atol=1e-6,
        rtol=1e-5,
    )
    assert len(graphed._graphs) == 2  # one capture per input signature (shared, per-client)


def test_module_with_cuda_graphs_follows_eager_module():
    """Twenty DP-α-NormEC rounds on digits (BatchNorm MLP) on the GPU, with and without graphs."""
    import pytorch_lightning as pl

    from pl_privfed import FederatedModule
    from pl_privfed.algorithms import AlphaNormEC
    from pl_privfed.datamodules import DigitsDataModule, DirichletPartitioner
    from pl_privfed.models import MLP
    from pl_privfed.privacy import DPNoise

    finals = []
    for graphs in (False, True):
        torch.manual_seed(0)
        dm = DigitsDataModule(
            num_clients=5,
            batch_size=16,
            partitioner=DirichletPartitioner(concentration=0.5, seed=1),
        )
        alg = AlphaNormEC(0.05, beta=0.1, alpha=0.01, noise=DPNoise(epsilon=8.0, seed=3))
        module = FederatedModule(MLP(64, [16], 10, batch_norm=True), alg, cuda_graphs=graphs)
        trainer = pl.Trainer(
            accelerator="gpu",
            devices=1,
            max_steps=20,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )
        trainer.fit(module, datamodule=dm)
        assert module.oracle.cuda_graph is graphs
        finals.append(
            torch.cat([t.detach().reshape(-1) for t in module.model.state_dict().values()])
        )
    torch.testing.assert_close(finals[1], finals[0], atol=1e-5, rtol=1e-5)


def test_grid_with_cuda_graphs_follows_eager_grid(tmp_path):
    """A 4-configuration grid (ResNet-20 with BatchNorm, per-configuration buffers) on the GPU,
    in float64: the CUDA-graph engine follows the eager one, and each configuration its
    separate run (the same check as tests/test_grid.py's on the CPU)."""
    from pl_privfed.algorithms import AlphaNormEC

    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01)
    grid = {"beta": [0.1, 1.0], "server_normalization": [False, True]}
    eager = assert_grid_follows_single_runs(tmp_path, alg, grid, accelerator="gpu")
    graphed = fit_resnet(tmp_path, alg, grid, accelerator="gpu", cuda_graphs=True)
    assert graphed.oracle.cuda_graph
    torch.testing.assert_close(graphed.grid_params, eager.grid_params, atol=1e-9, rtol=1e-9)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL sharding needs two GPUs")
def test_clients_sharded_over_two_gpus_with_nccl(tmp_path):
    """The two-process families of tests/test_distributed.py on two GPUs (NCCL) equal one
    process on the CPU (float64)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers.ddp_families import fit, state

    root = Path(__file__).resolve().parents[1]
    names = ["dp_alpha_normec", "porter_dp"]
    env = {
        **os.environ,
        "PL_PRIVFED_TEST_ACCELERATOR": "gpu",
        "PYTHONPATH": os.pathsep.join([str(root / "tests"), str(root)]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(root / "tests/helpers/ddp_families.py"),
            str(tmp_path),
            *names,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in names:
        saved = torch.load(tmp_path / f"{name}.pt", weights_only=False)["state"]
        single = state(fit(name, tmp_path / f"cpu-{name}", devices=1))
        for key, value in single.items():
            torch.testing.assert_close(saved[key].cpu(), value, rtol=1e-10, atol=1e-10, msg=key)
