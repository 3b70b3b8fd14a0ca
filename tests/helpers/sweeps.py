"""Sweep files written for a test, a sweep's results read back, a W&B agent's command line."""

import csv
import functools
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")


def write_sweep(directory, parameters, name="tiny", command=None):
    spec = {
        "name": name,
        "method": "grid",
        "metric": {"name": "val/acc", "goal": "maximize"},
        "parameters": parameters,
        "command": command or ["${env}", "pl-privfed", "fit", "--config", QUICKSTART, "${args}"],
    }
    path = Path(directory) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@functools.cache
def _sweep_spec(text: str) -> dict:
    """A sweep file's YAML, parsed once per text (a test builds thousands of points' command
    lines from the shipped sweeps; the result is only read)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def wandb_agent_command(sweep_file, params):
    """The command line ``wandb agent`` runs for one point: W&B's own construction
    (``create_sweep_command`` for the macros, ``create_sweep_command_args`` for ``${args}``),
    substituted as ``wandb_agent.Agent._command_run`` does."""
    from wandb.sdk.launch.sweeps import utils as sweep_utils

    spec = _sweep_spec(Path(sweep_file).read_text())
    command = sweep_utils.create_sweep_command(list(spec["command"]))
    sweep_vars = sweep_utils.create_sweep_command_args(
        {"args": {k: {"value": v} for k, v in params.items()}}
    )
    sweep_vars.update(
        interpreter=["python"], program=[spec.get("program", "")], env=["/usr/bin/env"]
    )
    out = []
    for chunk in map(str, command):
        if chunk.startswith("${") and chunk.endswith("}"):
            out += sweep_vars.get(chunk[2:-1]) or []
        else:
            out.append(chunk)
    return out
