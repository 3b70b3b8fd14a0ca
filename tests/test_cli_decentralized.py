"""The decentralized and SoteriaFL configs: two rounds each through the CLI on a CPU, real data."""

import json
import math
from pathlib import Path

import pytest
import yaml

from pl_privfed.cli import PrivFedCLI, main

REPO = Path(__file__).resolve().parents[1]
ALGORITHM_CONFIGS = [
    REPO / f"configs/algorithms/{n}.yaml" for n in ("porter_dp", "porter_gc", "beer", "soteriafl")
]
PAPER_CONFIGS = sorted((REPO / "configs/paper/porter").glob("*.yaml"))
# both privacy levels differ only in ε (test_cli instantiates every config): run one of each pair
PAPER_RUNS = [c for c in PAPER_CONFIGS if c.stem.endswith("eps0.01")]


def summary(path):
    return json.loads((path / "summary.json").read_text())


@pytest.mark.parametrize("config", ALGORITHM_CONFIGS, ids=[c.stem for c in ALGORITHM_CONFIGS])
def test_algorithm_config_runs_two_rounds(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.max_steps",
            "2",
            "--trainer.logger",
            "false",
            "--trainer.val_check_interval",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--output_dir",
            str(tmp_path),
        ]
    )
    data = summary(tmp_path)
    assert data["status"] == "finished" and data["rounds"] == 2
    assert data["final_test_accuracy"] is not None
    decentralized = "soteriafl" not in config.stem
    channel = "agent_to_agent" if decentralized else "client_to_server"
    assert data["communication_total_bits_per_agent"][channel] >= 0
    assert "ceil(log2 d)" in data["communication_encoding"]
    if decentralized:  # the uniformly sampled output iterate (Algorithm 1 line 16), evaluated
        out = data["output_iterate"]
        assert out["round"] in (1, 2) and 0 <= out["agent"] < 10
        assert 0 <= out["test_accuracy"] <= 1 and out["test_loss"] > 0
        assert {"consensus_error", "mixing_rate", "tracking_error"} <= set(data["operator_means"])
        assert 0 <= data["operator_means"]["mixing_rate"] < 1
    assert data["private"] == (config.stem in ("porter_dp", "soteriafl"))
    if data["private"]:  # calibration: target: the accountant certifies ε = 8 after 300 rounds
        assert data["privacy"]["sample_rate"] == pytest.approx(
            data["data"]["batch_size"] / min(data["data"]["client_sizes"])
        )
        assert data["privacy"]["accounting"]["sampling"] == "without_replacement"
        assert 0 < data["epsilon"] < 8 and data["privacy"]["rounds_accounted"] == 2


@pytest.mark.parametrize("config", PAPER_RUNS, ids=[c.stem for c in PAPER_RUNS])
def test_paper_001_config_runs_two_rounds(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(config),
            "--config",
            str(REPO / "configs/paper/cpu_smoke.yaml"),
            "--output_dir",
            str(tmp_path),
        ]
    )
    data = summary(tmp_path)
    assert data["status"] == "finished" and data["rounds"] == 2
    assert data["final_test_accuracy"] is not None and data["data"]["num_clients"] == 10
    privacy = data["privacy"]
    alg = data["config"]["model"]["algorithm"]["init_args"]
    # Theorem 1 (eq. 5): σ_p = τ sqrt(T log(1/δ))/(m ε), reported beside the accountant's ε
    m = min(data["data"]["client_sizes"])  # local_dataset_size: null takes the smallest shard
    # cpu_smoke: 720 examples - 72 for validation = 648 over 10 agents (shards of 64 or 65)
    assert alg["local_dataset_size"] is None and m == 64
    sigma = alg["clip_threshold"] * math.sqrt(1000 * math.log(1e3)) / (m * 0.01)
    assert privacy["noise_std"] == pytest.approx(sigma)
    assert privacy["target_epsilon"] == 0.01 and privacy["calibration_rounds"] == 1000
    # ε of 2 releases at noise multiplier ~65 is 0 to the accountant's precision
    assert privacy["rounds_accounted"] == 2 and privacy["epsilon"] >= 0
    assert privacy["epsilon_paper_convention"] > 0
    assert privacy["sample_rate"] == pytest.approx(1 / m)  # b fresh records of m each round
    assert privacy["accounting"]["sampling"] == "without_replacement"
    # accountant: prv in these configs: the RDP bound for sampling without replacement
    assert privacy["accounting"]["accountant"].startswith("dp-accounting RDP")
    assert privacy["epsilon_rdp"] == privacy["epsilon"]
    assert privacy["neighbouring_relation"] == "replace_one"  # paper 001 Def. 4
    bits = data["communication_total_bits_per_agent"]
    assert set(bits) == (
        {"agent_to_agent"} if "porter" in config.stem else {"client_to_server", "server_to_client"}
    )


@pytest.mark.parametrize("dataset", ["a9a", "mnist"])
def test_paper_001_configs_match_their_data(dataset, tmp_path, monkeypatch):
    """``local_dataset_size`` (m) and ``batch_size`` (b) set the sampling rate b/m: check them."""
    monkeypatch.chdir(tmp_path)
    configs = [c for c in PAPER_CONFIGS if c.stem.startswith(dataset)]
    assert len(configs) == 4
    cli = PrivFedCLI(args=["--config", str(configs[0]), "--trainer.logger", "false"], run=False)
    cli.datamodule.setup("fit")
    sizes = cli.datamodule.client_sizes
    assert sizes.max() - sizes.min() <= 1  # shuffled and split evenly
    assert sizes.min() == {"a9a": 2930, "mnist": 5400}[dataset]  # the m of the comments
    for config in configs:
        spec = yaml.safe_load(config.read_text())
        alg, data = spec["model"]["algorithm"]["init_args"], spec["data"]["init_args"]
        assert alg["local_dataset_size"] is None, config.name  # m from the data
        assert alg["batch_size"] == data["batch_size"] == 1, config.name
        assert data == spec_data(configs[0]), config.name  # same data for both algorithms
        if "porter" in config.stem:
            assert alg["topology"] == {
                "graph": "erdos_renyi",
                "p": 0.8,
                "weights": "fdla",
                "seed": 0,
            }
        assert alg["compressor"]["init_args"] == {"ratio": 0.05}


def spec_data(config):
    return yaml.safe_load(config.read_text())["data"]["init_args"]


def test_output_iterate_is_evaluated_at_the_sampled_agent_model(tmp_path):
    """The module evaluates x_out itself (not the average x̄) and puts x̄ back afterwards."""
    import pytorch_lightning as pl
    import torch

    from pl_privfed import FederatedModule
    from pl_privfed.algorithms.decentralized import BEER
    from pl_privfed.datamodules import DigitsDataModule
    from pl_privfed.graphs import Topology
    from pl_privfed.models import MLP

    torch.manual_seed(0)
    dm = DigitsDataModule(num_clients=5, batch_size=16)
    module = FederatedModule(MLP(64, [16], 10), BEER(0.5, 0.3, topology=Topology(graph="ring")))
    pl.Trainer(
        accelerator="cpu",
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    ).fit(module, datamodule=dm)
    out = module.algorithm.output()
    report = module.summary_entries()["output_iterate"]
    assert (report["round"], report["agent"]) == (out["round"], out["agent"])
    x_bar = module.layout.flatten(module.model)
    torch.testing.assert_close(x_bar, module.algorithm.agent_params.mean(0))  # restored
    model = MLP(64, [16], 10)
    module.layout.assign(model, out["params"])
    batches = list(dm.test_dataloader())
    inputs = torch.cat([x for x, _ in batches])
    targets = torch.cat([y for _, y in batches])
    with torch.no_grad():
        logits = model(inputs)
    accuracy = (logits.argmax(-1) == targets).float().mean().item()
    loss = torch.nn.functional.cross_entropy(logits, targets).item()
    assert report["test_accuracy"] == pytest.approx(accuracy)
    assert report["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert not torch.equal(out["params"], x_bar)  # the agents disagree: a real check
