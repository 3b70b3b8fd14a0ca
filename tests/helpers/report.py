"""Results written without training for the report's tests, and readers of its figures."""

import itertools
import json

import numpy as np
from matplotlib.collections import QuadMesh

from pl_privfed.results import column_names, render_value, result_columns, run_id, save_results


def write_results(root, algorithm, grid, result, curves=None, summary=None, seeds=(0, 1, 2)):
    """``<root>/results.csv`` as a sweep writes it, one run per grid point and seed: ``result``
    maps the point and seed to the result columns, ``curves`` to ``{metric: [(round, value)]}``,
    ``summary`` to extra ``summary.json`` entries; the runs' algorithm is ``algorithm``."""
    keys = [*grid, "seed"]
    names = column_names(keys)
    rows = []
    for index, values in enumerate(itertools.product(*grid.values(), seeds)):
        params = dict(zip(keys, values, strict=True))
        point, seed = {k: params[k] for k in grid}, params["seed"]
        run_dir = root / "runs" / run_id(index, params)
        run_dir.mkdir(parents=True)
        res = {"status": "finished", **result(point, seed)}
        init_args = {k: v for k, v in point.items() if k == "server_normalization"}
        data = {
            **res,
            "private": False,
            **(summary(point, seed) if summary else {}),
            "config": {
                "model": {
                    "algorithm": {
                        "class_path": f"pl_privfed.algorithms.{algorithm}",
                        "init_args": init_args,
                    }
                }
            },
        }
        (run_dir / "summary.json").write_text(json.dumps(data))
        lines = ["metric,round,value"]
        for metric, points in (curves(point, seed) if curves else {}).items():
            lines += [f"{metric},{r},{v!r}" for r, v in points]
        (run_dir / "curves.csv").write_text("\n".join(lines) + "\n")
        row = {"run": run_dir.name, "status": res["status"], "run_dir": str(run_dir)}
        row.update({names[k]: render_value(v) for k, v in params.items()})
        row.update({c: res.get(c) for c in result_columns()})
        rows.append(row)
    return save_results(root, names, rows)


def decentralized_sweep(root, algorithm, accuracy, bits=True):
    """A PORTER-like sweep over (η, γ) without a GradientNorm history."""
    grid = {"step_size": [0.01, 0.1], "consensus_step_size": [0.5, 1.0]}

    def result(point, seed):
        acc = accuracy + point["step_size"] + 0.01 * seed
        return {"final_val_accuracy": acc, "final_test_accuracy": acc - 0.02, "rounds": 4}

    def summary(point, seed):
        return (
            {"rounds": 4, "communication_total_bits_per_agent": {"agent_to_agent": 400.0}}
            if bits
            else {}
        )

    def curves(point, seed):
        return {"val/acc": [(k, accuracy * k / 4 + 0.01 * seed) for k in (1, 2, 3, 4)]}

    return write_results(root, algorithm, grid, result, curves, summary)


def heat(ax):
    """The heatmap drawn on ``ax`` (seaborn's QuadMesh); ``None`` on a colour bar or a plot."""
    meshes = [c for c in ax.collections if isinstance(c, QuadMesh)]
    return meshes[0] if meshes and ax.get_label() != "<colorbar>" else None


def band_y(ax):
    """The y values of every band (fill_between) on ``ax``."""
    return np.concatenate([p.vertices[:, 1] for c in ax.collections for p in c.get_paths()])
