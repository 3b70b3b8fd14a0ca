"""pl-privfed for ``lightning.pytorch``: ``from pl_privfed.lightning import FederatedModule``.

``pl_privfed`` is built on ``pytorch_lightning``; Lightning's own documentation and most new
projects use ``import lightning as L``, whose ``lightning.pytorch`` holds distinct copies of the
same classes (a ``lightning.pytorch.Trainer`` refuses a ``pytorch_lightning.LightningModule``).
This module is ``pl_privfed`` again on ``lightning.pytorch``, built from the same source
(:mod:`pl_privfed.mirror` says how, and why that way):

* the package root's names (``FederatedModule``, ``FederatedDataModule``, ``default_callbacks``,
  ...) and, gathered here too, every name of ``pl_privfed.callbacks`` and
  ``pl_privfed.datamodules``: ``from pl_privfed.lightning import FederatedModule,
  MNISTDataModule, RoundProgressBar``;
* every module as ``pl_privfed.lightning.X`` (``pl_privfed.lightning.callbacks``,
  ``pl_privfed.lightning.grid``, ...). A module that uses Lightning is its source compiled once
  more on ``lightning.pytorch`` and ``lightning.fabric``; any other module is the very module
  ``pl_privfed.X``, so algorithms, noises, partitioners and models are the same classes under
  both namespaces and mix freely. The ``pl-privfed`` command stays on ``pytorch_lightning``.

Both namespaces work side by side in one process; take the module, its datamodule and its
callbacks from the namespace of the trainer. Needs the ``lightning`` package
(``pip install 'pl-privfed[lightning]'``).
"""

import importlib

try:
    import lightning.pytorch  # noqa: F401  (the namespace this module serves)
except ImportError as error:  # pragma: no cover - the extra not installed
    raise ImportError(
        "pl_privfed.lightning runs on the lightning package, which is not installed: "
        "pip install 'pl-privfed[lightning]'"
    ) from error

from pl_privfed.mirror import install

_DOC = __doc__
__path__: list[str] = []  # a package: the mirror serves its submodules, from pl_privfed's files
exec(install().code("pl_privfed"), globals())  # the root's names, on lightning.pytorch
__doc__ = _DOC

for _package in ("callbacks", "datamodules"):
    _module = importlib.import_module(f"{__name__}.{_package}")
    globals().update({name: getattr(_module, name) for name in _module.__all__})
    __all__ = [*__all__, *(n for n in _module.__all__ if n not in __all__)]  # noqa: F821
