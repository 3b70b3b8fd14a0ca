"""The decentralized and SoteriaFL configs: two rounds each through the CLI on a CPU, real data."""

import json
import math
from pathlib import Path

import pytest
import yaml

from pl_privfed.cli import PrivFedCLI, main

REPO = Path(__file__).resolve().parents[1]
ALGORITHM_CONFIGS = [REPO / f"configs/algorithms/{n}.yaml" for n in
                     ("porter_dp", "porter_gc", "beer", "soteriafl")]  # fmt: skip
PAPER_CONFIGS = sorted((REPO / "configs/paper/porter").glob("*.yaml"))
# both privacy levels differ only in ε (test_cli instantiates every config): run one of each pair
PAPER_RUNS = [c for c in PAPER_CONFIGS if c.stem.endswith("eps0.01")]


def summary(path):
    return json.loads((path / "summary.json").read_text())


@pytest.mark.parametrize("config", ALGORITHM_CONFIGS, ids=[c.stem for c in ALGORITHM_CONFIGS])
def test_algorithm_config_runs_two_rounds(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.logger", "false",
          "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false",
          "--output_dir", str(tmp_path)])  # fmt: skip
    data = summary(tmp_path)
    assert data["status"] == "finished" and data["rounds"] == 2
    assert data["final_test_accuracy"] is not None
    decentralized = "soteriafl" not in config.stem
    channel = "agent_to_agent" if decentralized else "client_to_server"
    assert data["communication_total_bits_per_agent"][channel] >= 0
    assert "ceil(log2 d)" in data["communication_encoding"]
    if decentralized:
        assert {"consensus_error", "mixing_rate", "tracking_error"} <= set(data["operator_means"])
        assert 0 <= data["operator_means"]["mixing_rate"] < 1
    assert data["private"] == (config.stem in ("porter_dp", "soteriafl"))
    if data["private"]:  # calibration: target: the accountant certifies ε = 8 after 300 rounds
        assert data["privacy"]["sample_rate"] == pytest.approx(
            data["data"]["batch_size"] / min(data["data"]["client_sizes"])
        )
        assert 0 < data["epsilon"] < 8 and data["privacy"]["rounds_accounted"] == 2


@pytest.mark.parametrize("config", PAPER_RUNS, ids=[c.stem for c in PAPER_RUNS])
def test_paper_001_config_runs_two_rounds(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(config), "--config", str(REPO / "configs/paper/cpu_smoke.yaml"),
          "--output_dir", str(tmp_path)])  # fmt: skip
    data = summary(tmp_path)
    assert data["status"] == "finished" and data["rounds"] == 2
    assert data["final_test_accuracy"] is not None and data["data"]["num_clients"] == 10
    privacy = data["privacy"]
    alg = data["config"]["model"]["algorithm"]["init_args"]
    # Theorem 1 (eq. 5): σ_p = τ sqrt(T log(1/δ))/(m ε), reported beside the accountant's ε
    sigma = (
        alg["clip_threshold"] * math.sqrt(1000 * math.log(1e3)) / (alg["local_dataset_size"] * 0.01)
    )
    assert privacy["noise_std"] == pytest.approx(sigma)
    assert privacy["target_epsilon"] == 0.01 and privacy["calibration_rounds"] == 1000
    assert privacy["rounds_accounted"] == 2 and privacy["epsilon"] > 0
    assert privacy["sample_rate"] == pytest.approx(1 / alg["local_dataset_size"])
    bits = data["communication_total_bits_per_agent"]
    assert set(bits) == ({"agent_to_agent"} if "porter" in config.stem else
                         {"client_to_server", "server_to_client"})  # fmt: skip


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
    for config in configs:
        spec = yaml.safe_load(config.read_text())
        alg, data = spec["model"]["algorithm"]["init_args"], spec["data"]["init_args"]
        assert alg["local_dataset_size"] == sizes.min(), config.name
        assert alg["batch_size"] == data["batch_size"] == 1, config.name
        assert data == spec_data(configs[0]), config.name  # same data for both algorithms
        if "porter" in config.stem:
            assert alg["topology"] == {"graph": "erdos_renyi", "p": 0.8, "weights": "fdla",
                                       "seed": 0}  # fmt: skip
        assert alg["compressor"]["init_args"] == {"ratio": 0.05}


def spec_data(config):
    return yaml.safe_load(config.read_text())["data"]["init_args"]
