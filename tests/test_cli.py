"""The pl-privfed command: every shipped config instantiates; the quickstart runs end to end."""

import json
from pathlib import Path

import pytest
from helpers import processes
from helpers.training import short_fit

from pl_privfed import FederatedModule
from pl_privfed.cli import PrivFedCLI, main

REPO = Path(__file__).resolve().parents[1]
# full configs; configs/paper/*.yaml are overlays and configs/sweeps/ holds W&B sweep files
CONFIGS = [
    REPO / "configs/quickstart.yaml",
    *sorted((REPO / "configs/private").glob("*.yaml")),
    *sorted(
        [*(REPO / "configs/algorithms").glob("*.yaml"), *(REPO / "configs/paper").glob("*/*.yaml")]
    ),
]
# paper 001's decentralized configs run in test_cli_decentralized.py
PAPER_CONFIGS = sorted(
    c for c in (REPO / "configs/paper").glob("*/*.yaml") if c.parent.name != "porter"
)


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c.relative_to(REPO)) for c in CONFIGS])
def test_every_config_instantiates(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = PrivFedCLI(args=["--config", str(config), "--trainer.logger", "false"], run=False)
    assert isinstance(cli.model, FederatedModule)
    assert cli.datamodule.num_clients >= 1


@pytest.mark.slow
def test_quickstart_runs_through_cli(tmp_path, monkeypatch, capsys):
    """The quickstart (client-level DP over 10,000 MNIST clients, distributed noise) runs, names
    its adversary before training and in its result line, and logs everything. Its 10,000
    clients as one chunk: the iterates do not depend on the chunk size (tests/test_engine.py),
    and in the engine's CPU chunks of 89 clients (178 since 2026-11-27) it took 106.5 s against
    20.5 s (2-core machine shared with other jobs, load 3.7-4.1)."""
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs/quickstart.yaml"),
            "--trainer.max_steps",
            "20",
            "--trainer.val_check_interval",
            "10",
            "--model.client_chunk",
            "all",
        ]
    )
    (summary,) = tmp_path.glob("logs/quickstart/version_*/summary.json")
    data = json.loads(summary.read_text())
    assert data["status"] == "finished" and data["rounds"] == 20
    assert data["private"] and data["epsilon"] > 0 and data["delta"] == 1e-5
    privacy = data["privacy"]
    assert privacy["adversary"] == "server" and privacy["placement"] == "distributed"
    assert privacy["min_contributors"] == 5000 and set(privacy["adversaries"]) == {
        "server",
        "models",
    }
    assert 0 <= data["final_test_accuracy"] <= 1
    assert data["config"]["model"]["algorithm"]["class_path"] == "pl_privfed.algorithms.AlphaNormEC"
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if line.startswith("[pl-privfed]"))
    assert first.startswith("[pl-privfed] privacy: client-level DP, distributed noise")
    assert "against the server (the server: the noised sum" in first
    assert "test accuracy=" in out and "against the server" in out
    assert (summary.parent / "curves.png").is_file()
    assert (
        data["communication_total_bits"]["client_to_server"] == 20 * 10000 * 32 * 7850
    )  # dense noised messages (each with its noise share), d = 7,850
    assert set(data["operator_means"]) >= {"clip_fraction", "update_norm", "ef_gap"}
    # W&B ran offline; its run log holds the resolved config and both artifacts. ``finish()`` only
    # informs W&B's service process that the run is over, and the service closes (flushes) the
    # run log when it gets to it; ``teardown()`` waits for the service to exit, as a process's
    # atexit hook does, so that the file is complete when it is read.
    import wandb

    wandb.teardown()
    (run_log,) = tmp_path.glob("logs/wandb/offline-run-*/run-*.wandb")
    raw = run_log.read_bytes()
    for needle in (b"AlphaNormEC", b"FixedSizePartitioner", b"run-summary", b"training-curves"):
        assert needle in raw, needle


def test_print_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                str(REPO / "configs/algorithms/clip21.yaml"),
                "--model.algorithm.init_args.clip_threshold",
                "0.5",
                "--print_config",
            ]
        )
    assert exit_info.value.code in (0, None)
    assert "clip_threshold: 0.5" in capsys.readouterr().out


@pytest.mark.parametrize(
    "override, message",
    [
        (["--model.algorithm.init_args.step_size", "-1"], "step_size must be"),
        (["--model.algorithm.init_args.beta", "0"], "beta must be"),
        (["--model.algorithm.init_args.alpha", "-0.5"], "alpha must be"),
        (["--model.algorithm.init_args.noise.epsilon", "0"], "epsilon must be"),
        (["--model.algorithm.init_args.noise.delta", "1.5"], "delta must be"),
        (["--data.init_args.num_clients", "5000"], "num_clients=5000 is more than"),
    ],
)
def test_bad_values_fail_before_training(override, message, tmp_path, monkeypatch, capsys):
    """One line on stderr, exit status 2, nothing trained (tests/test_cli_errors.py has more)."""
    monkeypatch.chdir(tmp_path)
    args = [
        "fit",
        "--config",
        str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"),
        "--trainer.logger",
        "false",
    ]
    with pytest.raises(SystemExit) as info:
        main(args + override)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("pl-privfed: error: ") and message in line
    assert not list(tmp_path.glob("**/*.ckpt"))


def test_privacy_budget_from_the_command_line_stops_the_quickstart(tmp_path, monkeypatch):
    """The budget callback appended on the command line joins the CLI's default callbacks."""
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"),
            "--trainer.logger",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.callbacks+=pl_privfed.callbacks.PrivacyBudget",
            "--trainer.callbacks.epsilon=4",
        ]
    )
    data = json.loads((tmp_path / "summary.json").read_text())
    # the papers' calibration targets ε = 8 at 300 rounds; the defensible accounting (replace-one)
    # spends 4 after round 11 by PLD (the default; RDP's bound after round 10; the papers'
    # add/remove convention would after round 46)
    assert data["rounds"] == 11 and data["privacy_budget"]["epsilon_spent"] <= 4.0
    assert data["stopped_reason"].startswith("privacy budget: step 12 would spend")
    assert data["epsilon"] == pytest.approx(data["privacy_budget"]["epsilon_spent"])
    assert data["epsilon_paper_convention"] < data["epsilon"]


def test_output_dir_collects_summary_curves_and_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"),
            "--trainer.logger",
            "false",
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "2",
            "--output_dir",
            str(out),
        ]
    )
    data = json.loads((out / "summary.json").read_text())
    assert data["status"] == "finished" and data["config"]["output_dir"] == str(out)
    assert (out / "config.yaml").is_file()
    assert (out / "curves.png").is_file()
    rows = (out / "curves.csv").read_text().splitlines()
    assert rows[0] == "metric,round,value" and "train/loss,4," in "\n".join(rows)
    assert sum(r.startswith("val/acc,") for r in rows) == 2  # rounds 2 and 4
    assert not any(r.startswith("test/") for r in rows)  # the test set is not a curve
    assert data["final_test_round"] == data["final_val_round"] == 4


# what the cpu_smoke overlay cannot shorten on its own: paper 003's 1,024 images per worker (its MNIST subset has
# 640) and its CIFAR-10 batches of 10 × 1,024 images per client and round
SMOKE_EXTRA = {
    "mnist_per_sample": [
        "--data.init_args.partitioner.init_args.samples_per_client",
        "32",
        "--data.init_args.batch_size",
        "32",
    ],
    "mnist_per_update": [
        "--data.init_args.partitioner.init_args.samples_per_client",
        "32",
        "--data.init_args.batch_size",
        "32",
    ],
}
# CIFAR-10 configs (ResNet-20 on 32 × 32 images, most of these tests' time): minibatches of 4
CIFAR_SMOKE = ["--data.init_args.batch_size", "4"]


def smoke_extra(config):
    if "CIFAR10DataModule" in config.read_text():
        return CIFAR_SMOKE
    return SMOKE_EXTRA.get(config.stem, [])


@pytest.mark.slow
@pytest.mark.parametrize("config", PAPER_CONFIGS, ids=[c.stem for c in PAPER_CONFIGS])
def test_paper_config_runs_two_rounds_on_cpu(config, tmp_path, monkeypatch):
    """Each paper config, shortened by the cpu_smoke overlay, on the real data (CIFAR-10 JPEG,
    MNIST)."""
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
            *smoke_extra(config),
        ]
    )
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["status"] == "finished" and data["rounds"] == 2
    assert data["final_test_accuracy"] is not None and data["final_train_loss"] > 0
    assert data["private"] == ("dp_" in config.stem)
    assert set(data["grad_backend"]) == {"per_client", "per_example"}  # what auto resolved to
    family = config.parent.name
    if family in ("alpha_normec", "fed_alpha_normec"):
        assert data["data"]["source"] == "jpeg"
        assert data["data"]["num_clients"] == (20 if family == "fed_alpha_normec" else 10)
    if family in ("fed_alpha_normec", "clipping_fedavg"):  # p = 1: every client sends
        assert data["client_transmissions"] == 2 * data["data"]["num_clients"]
    if family == "clipping_fedavg" and "mnist" in config.stem:  # rounds 0, 1, 2
        assert [r for r, _ in data["full_grad_norm"]["history"]] == [0, 1, 2]
    if data["private"] and family in ("alpha_normec", "fed_alpha_normec"):
        # K = 300 in the formula, 2 releases accounted
        assert data["privacy"]["calibration_rounds"] == 300
        assert data["privacy"]["rounds_accounted"] == 2


NEW_ALGORITHM_CONFIGS = [
    REPO / f"configs/algorithms/{name}.yaml"
    for name in (
        "fed_alpha_normec",
        "dp_fed_alpha_normec",
        "dp_fedavg_clip",
        "dp_fedavg_normalization",
        "dp_fedavg_per_sample_clipping",
        "dp_fedavg_per_update_clipping",
    )
]


@pytest.mark.parametrize(
    "config", NEW_ALGORITHM_CONFIGS, ids=[c.stem for c in NEW_ALGORITHM_CONFIGS]
)
def test_federated_algorithm_config_runs_two_rounds(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(short_fit(config, tmp_path, 2))
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["status"] == "finished" and data["rounds"] == 2
    assert 0 < data["client_transmissions"] <= 20
    assert data["private"] == config.stem.startswith("dp_")
    if data["private"]:
        assert data["epsilon"] > 0


def test_paper_reading_overlays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = REPO / "configs/paper/alpha_normec/dp_alpha_normec.yaml"
    cli = PrivFedCLI(
        args=[
            "--config",
            str(config),
            "--config",
            str(REPO / "configs/paper/paper_reading.yaml"),
            "--config",
            str(REPO / "configs/paper/calibrate_to_run.yaml"),
            "--trainer.logger",
            "false",
        ],
        run=False,
    )
    assert cli.trainer.max_epochs == 300 and cli.trainer.max_steps == -1
    assert cli.model.algorithm.noise.rounds is None  # calibrated to the run's iteration count
    assert cli.datamodule.split == "paper" and cli.datamodule.num_clients == 10


# --------------------------------------------------------------------------- seeds and sweeps


def test_seed_sets_every_seed_of_a_run(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)

    def cli(*extra):
        args = [
            "--config",
            str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"),
            "--trainer.logger=false",
        ]
        return PrivFedCLI(args=[*args, *extra], run=False)

    seven = cli("--seed", "7")
    assert seven.config["seed_everything"] == 7 and seven.datamodule.seed == 7
    assert seven.datamodule.partitioner.seed == 7 and seven.model.algorithm.noise.seed == 7
    again, other = cli("--seed=7"), cli("--seed=8")
    weights = [next(c.model.model.parameters()) for c in (seven, again, other)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
    plain = cli()  # without --seed the config's seeds stand
    assert plain.datamodule.seed == 0 and plain.config["seed_everything"] == 0


def test_set_seeds_keeps_the_test_split_fixed():
    from jsonargparse import Namespace

    from pl_privfed.cli import set_seeds

    config = Namespace(
        seed_everything=0,
        model=Namespace(algorithm=Namespace(init_args=Namespace(sampling_seed=0, beta=0.1))),
        data=Namespace(
            init_args=Namespace(
                seed=0, split_seed=42, partitioner=Namespace(init_args=Namespace(seed=0))
            )
        ),
    )
    done = set_seeds(config, 5)
    assert config.data.init_args.split_seed == 42 and config.model.algorithm.init_args.beta == 0.1
    assert done == [
        "seed_everything",
        "model.algorithm.init_args.sampling_seed",
        "data.init_args.seed",
        "data.init_args.partitioner.init_args.seed",
    ]
    assert config.data.init_args.partitioner.init_args.seed == 5


def test_agent_arguments_read_nulls_and_find_configs_from_any_directory(tmp_path, monkeypatch):
    from pl_privfed.cli import agent_arguments

    monkeypatch.chdir(tmp_path)
    args = agent_arguments(
        [
            "fit",
            "--config",
            "configs/algorithms/dp_alpha_normec_digits.yaml",
            "--config=configs/paper/cpu_smoke.yaml",
            "--a.b=None",
            "--c=True",
            "--d=Nonesuch",
        ]
    )
    assert args == [
        "fit",
        "--config",
        str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"),
        f"--config={REPO / 'configs/paper/cpu_smoke.yaml'}",
        "--a.b=null",
        "--c=True",
        "--d=Nonesuch",
    ]
    local = "configs/algorithms/dp_alpha_normec_digits.yaml"
    (tmp_path / "configs" / "algorithms").mkdir(parents=True)
    (tmp_path / local).write_text("{}")  # a local file wins
    assert agent_arguments(["--config", local])[1] == local


def test_a_sweep_run_keeps_its_logs_and_names_its_wandb_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "0003-abc"
    args = [
        "--config",
        str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"),
        f"--output_dir={out}",
        "--run_name=beta=0.1 seed=2",
        "--run_group=quickstart_grid",
    ]
    cli = PrivFedCLI(args=args, run=False)
    csv_logger, wandb_logger = cli.trainer.loggers
    assert Path(csv_logger.log_dir).is_relative_to(out) and wandb_logger.save_dir == str(out)
    assert wandb_logger._wandb_init["name"] == "beta=0.1 seed=2"
    assert wandb_logger._wandb_init["group"] == "quickstart_grid"
    # under `wandb agent`: the name from the sweep parameters the agent wrote, with W&B's writer
    from wandb.sdk.lib.config_util import save_config_file_from_dict

    params = tmp_path / "wandb" / "config-abc.yaml"
    save_config_file_from_dict(
        str(params), {"model.algorithm.init_args.beta": {"value": 0.1}, "seed": {"value": 2}}
    )
    assert "wandb_version" in params.read_text()
    monkeypatch.setenv("WANDB_SWEEP_PARAM_PATH", str(params))
    cli = PrivFedCLI(
        args=["--config", str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")], run=False
    )
    assert cli.trainer.loggers[1]._wandb_init["name"] == "beta=0.1 seed=2"


def test_help_lists_every_subcommand_and_predict_is_not_offered(capsys):
    """Today --help listed fit/validate/test/predict only, and predict failed
    ("predict_dataloader must be implemented")."""
    import re

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in ("fit", "validate", "test", "sweep", "report", "compare", "demo"):
        assert re.search(rf"^\s+{name}\s+\S", out, re.M), name
    assert "predict" not in out and "--debug" in out
    with pytest.raises(SystemExit) as info:
        main(["predict", "--config", str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")])
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "invalid choice: 'predict'" in line and "'demo'" in line
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "choose a subcommand: fit, validate, test, sweep" in capsys.readouterr().err


@pytest.mark.slow
def test_a_normal_run_prints_no_warning(tmp_path):
    """Every run printed Lightning's two tips, its pytree deprecation and logging-interval
    warnings and W&B's offline warnings (the console script, as a user runs it)."""
    config = REPO / "configs/algorithms/dp_alpha_normec_digits.yaml"
    overrides = ["--trainer.max_steps", "12", "--trainer.val_check_interval", "6"]
    proc = processes.cli(["fit", "--config", config, *overrides], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for noise in ("Warning", "warn", "deprecated", "Tip", "wandb:", "GPU available", "Seed set"):
        assert noise not in proc.stderr, proc.stderr
    out = proc.stdout.replace("\r", "\n")
    assert "round 12/12" in out and "[pl-privfed] rounds=12" in out
    assert "W&B run saved offline in logs/wandb/offline-run-" in out  # and how to upload it


def test_print_config_prints_the_seeds_the_run_uses(tmp_path, monkeypatch, capsys):
    """Today ``--seed_everything 1 --print_config`` printed ``seed: null`` and every component
    seed 0: the printed file did not reproduce the seeded run. Now the seeds are fanned out
    while the arguments are parsed, and the printed file runs the same run."""
    import yaml

    monkeypatch.chdir(tmp_path)
    config = str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.logger=false"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, *quiet, "--seed_everything", "1", "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert printed.startswith("# pytorch_lightning==")  # jsonargparse's own output
    seeded = yaml.safe_load(printed)
    assert seeded["seed"] == 1 and seeded["seed_everything"] == 1
    data = seeded["data"]["init_args"]
    assert data["seed"] == 1 and data["partitioner"]["init_args"]["seed"] == 1
    assert seeded["model"]["algorithm"]["init_args"]["noise"]["seed"] == 1
    (tmp_path / "printed.yaml").write_text(printed)
    rounds = ["--trainer.max_steps", "2"]
    main(
        [
            "fit",
            "--config",
            config,
            *quiet,
            *rounds,
            "--seed_everything",
            "1",
            "--output_dir",
            "direct",
        ]
    )
    main(["fit", "--config", "printed.yaml", *rounds, "--output_dir", "printed"])
    direct, again = (
        json.loads((tmp_path / d / "summary.json").read_text()) for d in ("direct", "printed")
    )
    assert {k: v for k, v in direct["seeds"].items() if k != "set_by"} == {
        k: v for k, v in again["seeds"].items() if k != "set_by"
    }
    for key in ("final_val_accuracy", "final_val_loss", "final_test_accuracy", "epsilon"):
        assert direct[key] == again[key], key


def test_a_subcommand_is_one_function_and_one_registration(tmp_path, capsys):
    """docs/package.md, "A new subcommand": a typed function registered with ``@subcommand`` is
    parsed by jsonargparse from its signature, listed in ``--help`` and run by ``main``."""
    from pl_privfed.cli import COMMANDS, subcommand

    @subcommand("hello")
    def hello(name: str, *rest: str, times: int = 1, loud: bool = False) -> int:
        """Greet someone.

        Args:
            name: who to greet
            rest: arguments after --
            times: how often
            loud: shout
        """
        print(" ".join([("HELLO " if loud else "hello ") + name] * times), *rest)
        return 3

    try:
        with pytest.raises(SystemExit) as exit_info:
            main(["hello", "world", "--times", "2", "--loud", "--", "x"])
        assert exit_info.value.code == 3
        assert capsys.readouterr().out == "HELLO world HELLO world x\n"
        with pytest.raises(SystemExit) as exit_info:
            main(["hello", "world", "--times", "two"])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.startswith(
            "pl-privfed: error: times: Expected a <class 'int'>"
        )
        with pytest.raises(SystemExit):
            main(["--help"])
        assert "Greet someone." in capsys.readouterr().out
        with pytest.raises(SystemExit):
            main(["hello", "--help"])
        out = capsys.readouterr().out
        assert "--times TIMES" in out and "how often" in out and "--loud" in out
    finally:
        del COMMANDS["hello"]
