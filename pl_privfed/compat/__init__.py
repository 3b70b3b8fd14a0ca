"""The package's only reaches into other libraries' private attributes, one module per library.

Each module holds every access to its library's private names (attributes, methods, modules
whose names start with ``_``, an override of a private method) behind a small function or mixin
with a public name, and states in ``TESTED`` the versions of the library it was checked against
(``pyproject.toml`` pins the library to that range; ``tests/test_compat.py`` checks the installed
version, exercises each function and lists any private access left outside this package):

* :mod:`pl_privfed.compat.lightning`: Lightning (``pytorch_lightning`` and ``lightning.pytorch``:
  it imports neither, so both namespaces share it);
* :mod:`pl_privfed.compat.jsonargparse`: jsonargparse and the :mod:`argparse` it builds on;
* :mod:`pl_privfed.compat.torch`: torch's convolution and batch-norm internals;
* :mod:`pl_privfed.compat.dp_accounting`: dp-accounting's PLD internals.

This package is the lowest layer: it imports nothing of ``pl_privfed`` (and this file imports
none of its modules, so that importing one does not import the others' libraries).
"""

__all__: list[str] = []
