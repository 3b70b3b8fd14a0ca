"""Start-up in proportion to the work (issue 49, item 3): ``pl-privfed --help``, ``report`` and
``compare`` do not import the training stack. ``--help`` took 21 s (9.7 s of CPU) on this
machine, more than ``import pytorch_lightning``, since it built the Trainer's parser; the times
against that import are measured by ``benchmarks/startup.py``. A subprocess: what a process
imported is the point, and the test session has torch loaded already."""

import ast
import json
import subprocess
import sys

from helpers.sweeps import REPO

#: the training stack: none of it may be loaded by a command that does not train
HEAVY = ("torch", "pytorch_lightning", "lightning_fabric", "lightning", "torchmetrics", "opacus")

_PROBE = """
import contextlib, io, json, sys
import pl_privfed
loaded = {"import pl_privfed": sorted(m for m in HEAVY if m in sys.modules)}
from pl_privfed.cli import COMMANDS, main
for args in (["--help"], ["report", "--help"], ["compare", "--help"], ["sweep", "--help"]):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main(args)
    except SystemExit as exit_:
        assert exit_.code == 0, (args, exit_.code)
    loaded[" ".join(args)] = sorted(m for m in HEAVY if m in sys.modules)
    loaded[" ".join(args) + " output"] = out.getvalue()
COMMANDS["report"].parser().parse_args(["r.csv", "--out", "o", "--x", "beta"])
COMMANDS["compare"].parser().parse_args(["a.csv", "b.csv", "--out", "o", "--frontier"])
loaded["report and compare arguments"] = sorted(m for m in HEAVY if m in sys.modules)
print(json.dumps(loaded))
"""


def test_help_report_and_compare_do_not_import_the_training_stack():
    code = f"HEAVY = {HEAVY!r}\n{_PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    for step in ("import pl_privfed", "--help", "report --help", "compare --help"):
        assert loaded[step] == [], (step, loaded[step])
    assert loaded["report and compare arguments"] == []
    help_text = loaded["--help output"]
    for name in ("fit", "validate", "test", "sweep", "report", "compare", "demo"):
        assert f"\n    {name} " in help_text, name
    assert "predict" not in help_text and "--debug" in help_text
    assert "--separate" in loaded["sweep --help output"]


#: libraries a module imports where it uses them (inside the function), not when it loads: each
#: costs 0.3-1 s of CPU in every process that imports the module (``benchmarks/startup.py``),
#: sklearn in every ``fit`` that ends before loading data (a one-line refusal,
#: ``--print_config``), seaborn and scipy.stats in every ``report``/``compare`` that draws
#: nothing (a refusal); by library, the package folder where none may load with its module
ON_USE = {"sklearn": "pl_privfed", "seaborn": "pl_privfed", "scipy.stats": "pl_privfed/report"}


def _module_level_imports(path):
    """The modules ``path`` imports when it loads (outside functions and classes, inside
    top-level ``if`` and ``try`` blocks too), ``from a import b`` as ``a.b``."""
    found, nodes = [], list(ast.parse(path.read_text()).body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.If | ast.Try):
            nodes += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            nodes += [n for h in getattr(node, "handlers", []) for n in h.body]
    return found


def test_costly_libraries_are_imported_where_they_are_used():
    loaded = []
    for library, folder in ON_USE.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            for name in _module_level_imports(path):
                if name == library or name.startswith(library + "."):
                    loaded.append(f"{path.relative_to(REPO)}: {name}")
    assert not loaded, loaded
