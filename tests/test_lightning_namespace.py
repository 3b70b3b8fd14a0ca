"""``pl_privfed.lightning``: the package on ``lightning.pytorch`` (issue 31, item 6).

``lightning.pytorch.Trainer().fit(pl_privfed.FederatedModule(...))`` raised "model must be a
LightningModule", and under ``lightning.pytorch`` the package's progress bar and checkpoint
callback were taken for plain callbacks (the trainer added its own: two bars, two checkpoint
writers) and ``RunSummary`` found no logger folder. ``pl_privfed.lightning`` is the same source
on ``lightning.pytorch`` (:mod:`pl_privfed.mirror`); both namespaces live in one process.
"""

import ast
import json
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning
import torch
from torch import nn

import pl_privfed
from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.mirror import ImportRewriter, scan
from pl_privfed.privacy import DPNoise

L = pytest.importorskip("lightning.pytorch")
pll = pytest.importorskip("pl_privfed.lightning")  # after pl_privfed: both in one process

NAMESPACES = {
    "pytorch_lightning": (pytorch_lightning, pl_privfed, pl_privfed.datamodules),
    "lightning.pytorch": (L, pll, pll),
}


DOC = Path(__file__).resolve().parents[1] / "docs" / "python_api.md"


def test_the_documented_lightning_example_runs(tmp_path, monkeypatch):
    """docs/python_api.md, "Under lightning.pytorch": the documented import, as written."""
    section = DOC.read_text().split("## Under `lightning.pytorch`", 1)[1]
    (code, *_) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.global_step == 20 and type(trainer.progress_bar_callback) is pll.RoundProgressBar
    folder = tmp_path / "logs" / "lightning_api" / "lightning_logs" / "version_0"
    assert tmp_path / trainer.log_dir == folder  # the logger's folder
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["epsilon"] == pytest.approx(8.0, abs=0.01)
    assert [p.name for p in (folder / "checkpoints").iterdir()] == ["round=000020.ckpt"]


def fit(namespace: str, folder):
    """Six private rounds of the digits under ``namespace``'s Trainer, with the package's
    callbacks from the matching namespace and a CSV logger; the trainer and the module."""
    lightning, package, datamodules = NAMESPACES[namespace]
    lightning.seed_everything(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    noise = DPNoise(epsilon=8.0, delta=1e-5, calibration="target")
    module = package.FederatedModule(
        model, AlphaNormEC(alpha=0.01, step_size=0.5, beta=1.0, noise=noise)
    )
    data = datamodules.DigitsDataModule(num_clients=4, batch_size=16, seed=0)
    logger = lightning.loggers.CSVLogger(folder, name="run")
    trainer = lightning.Trainer(
        max_steps=6,
        val_check_interval=3,
        check_val_every_n_epoch=None,
        logger=logger,
        enable_model_summary=False,
        callbacks=package.default_callbacks(),
    )
    trainer.fit(module, datamodule=data)
    return trainer, module


def test_a_lightning_pytorch_trainer_fits_the_module_as_pytorch_lightning_does(tmp_path):
    trainer, module = fit("lightning.pytorch", tmp_path / "L")
    assert isinstance(module, L.LightningModule) and trainer.global_step == 6
    # the package's bar is the trainer's only progress bar, its checkpoint the only checkpoint
    bars = [c for c in trainer.callbacks if isinstance(c, L.callbacks.ProgressBar)]
    assert bars == [trainer.progress_bar_callback]
    assert isinstance(trainer.progress_bar_callback, pll.RoundProgressBar)
    assert [type(c) for c in trainer.checkpoint_callbacks] == [pll.RoundCheckpoint]
    folder = tmp_path / "L" / "run" / "version_0"
    assert [p.name for p in (folder / "checkpoints").iterdir()] == ["round=000006.ckpt"]
    # RunSummary writes into the logger's folder
    assert trainer.logger.log_dir == str(folder)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds"] == 6

    reference, same = fit("pytorch_lightning", tmp_path / "pl")
    assert isinstance(same, pytorch_lightning.LightningModule)
    assert not isinstance(same, L.LightningModule) and not isinstance(module, type(same))
    assert isinstance(reference.progress_bar_callback, pl_privfed.callbacks.RoundProgressBar)
    for (name, a), (_, b) in zip(module.state_dict().items(), same.state_dict().items()):
        assert torch.equal(a, b), name  # the same seed, the same rounds, the same parameters
    other = json.loads((tmp_path / "pl" / "run" / "version_0" / "summary.json").read_text())
    assert other["epsilon"] == summary["epsilon"]
    assert other["final_test_accuracy"] == summary["final_test_accuracy"]
    # a pytorch_lightning run's checkpoint loads and evaluates under lightning.pytorch
    (ckpt,) = (tmp_path / "pl" / "run" / "version_0" / "checkpoints").glob("*.ckpt")
    loaded = pll.FederatedModule.load_from_checkpoint(
        ckpt, model=module.model, algorithm=module.algorithm
    )
    tester = L.Trainer(logger=False, enable_progress_bar=False, default_root_dir=tmp_path / "test")
    (metrics,) = tester.test(loaded, pll.DigitsDataModule(num_clients=4, batch_size=16, seed=0))
    assert metrics["test/acc"] == pytest.approx(summary["final_test_accuracy"], abs=1e-6)


def test_only_what_uses_lightning_is_built_twice():
    """Algorithms, noise, the engine, models and partitioners are one object under both
    namespaces (they mix freely); the module, datamodules, callbacks and the log folder's checks
    exist once per namespace. The command is not served."""
    import pl_privfed.lightning.algorithms
    import pl_privfed.lightning.engine

    assert pl_privfed.lightning.algorithms is pl_privfed.algorithms
    assert pl_privfed.algorithms.__spec__.name == "pl_privfed.algorithms"  # its own spec kept
    assert pl_privfed.lightning.engine.run_round is pl_privfed.engine.run_round
    assert pll.FederatedModule is not pl_privfed.FederatedModule
    assert issubclass(pll.RoundCheckpoint, L.callbacks.ModelCheckpoint)
    assert issubclass(pll.MNISTDataModule, L.LightningDataModule)
    assert pll.DirichletPartitioner is pl_privfed.datamodules.DirichletPartitioner
    bound = scan(pl_privfed.mirror.PACKAGE_DIR, "pl_privfed").bound
    for shared in ("engine", "algorithms", "privacy", "grads", "models", "operators", "sweep"):
        assert not any(m.startswith(f"pl_privfed.{shared}") for m in bound), shared
    with pytest.raises(ModuleNotFoundError, match="runs on pytorch_lightning only"):
        import pl_privfed.lightning.cli
    with pytest.raises(
        ModuleNotFoundError, match=r"No module named 'pl_privfed\.lightning\.nothing'"
    ):
        import pl_privfed.lightning.nothing


def test_the_strategy_checks_read_the_strategys_own_namespace():
    from pl_privfed.engine.distributed import adopt_strategy

    ddp = SimpleNamespace(strategy=L.strategies.DDPStrategy())
    adopt_strategy(ddp)  # kept, without the DistributedDataParallel wrapper
    assert (
        isinstance(ddp.strategy, L.strategies.DDPStrategy) and ddp.strategy.configure_ddp() is None
    )
    adopt_strategy(SimpleNamespace(strategy=L.strategies.SingleDeviceStrategy("cpu")))
    with pytest.raises(ValueError, match="FSDPStrategy is not supported"):
        adopt_strategy(SimpleNamespace(strategy=L.strategies.FSDPStrategy()))
    with pytest.raises(ValueError, match="object is not supported"):
        adopt_strategy(SimpleNamespace(strategy=object()))


SOURCE = """
from __future__ import annotations
import pytorch_lightning as pl
import lightning_fabric
import pytorch_lightning.callbacks
from pytorch_lightning.utilities import rank_zero_warn
from . import shared, bound
from .shared import helper
from pkg.bound import thing
import pkg.shared as s


def later():
    from lightning_fabric.utilities import cloud_io
    import pkg.bound


if TYPE_CHECKING:
    from .lazy import hidden
"""


def test_the_rewriter_names_the_other_namespace_in_every_import_form(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "shared.py").write_text("helper = 1\n")
    (package / "bound.py").write_text("import pytorch_lightning\nthing = 2\n")
    (package / "lazy.py").write_text("def hidden():\n    import lightning_fabric\n")
    (package / "user.py").write_text(SOURCE)
    packages = scan(package, "pkg")  # bound: by an import in a function too, and their importers
    assert packages.bound == {"pkg", "pkg.bound", "pkg.lazy", "pkg.user"}
    tree = ImportRewriter(packages, "pkg.user", mirror="pkg.lightning").visit(ast.parse(SOURCE))
    assert (
        ast.unparse(tree).strip()
        == textwrap.dedent("""
        from __future__ import annotations
        import lightning.pytorch as pl
        import lightning.fabric as lightning_fabric
        import lightning.pytorch.callbacks as pytorch_lightning
        import lightning.pytorch as pytorch_lightning
        from lightning.pytorch.utilities import rank_zero_warn
        from pkg import shared
        from pkg.lightning import bound
        from pkg.shared import helper
        from pkg.lightning.bound import thing
        import pkg.shared as s

        def later():
            from lightning.fabric.utilities import cloud_io
            import pkg.lightning.bound as pkg
            import pkg.lightning as pkg
        if TYPE_CHECKING:
            from pkg.lightning.lazy import hidden""").strip()
    )
    lines = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)}
    assert lines == {2, 3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 19}  # each the line of the one it replaces


def test_a_grid_runs_under_lightning_pytorch(tmp_path):
    from pl_privfed.lightning.grid import GridModule

    L.seed_everything(0)
    module = GridModule(
        nn.Sequential(nn.Flatten(), nn.Linear(64, 10)),
        AlphaNormEC(alpha=0.01, step_size=0.1, beta=1.0),
        grid={"step_size": [0.1, 0.5]},
        grid_dir=str(tmp_path / "out"),
    )
    trainer = L.Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=pll.DigitsDataModule(num_clients=4, batch_size=16, seed=0))
    rows = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",finished" in r for r in rows[1:])
