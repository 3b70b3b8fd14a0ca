"""The symbol each paper gives a hyperparameter, for the axes and tables of a report, without
importing the algorithms.

:data:`SYMBOLS` maps an algorithm's class name to its init arguments' symbols, as the class's
``hyperparameter_symbols`` declare them (tests/test_report.py checks that the two agree: a new
algorithm with its own symbols adds one line here). :data:`GENERIC_SYMBOLS` names parameters
that belong to no algorithm (operators, privacy).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DEFAULT_SYMBOLS", "GENERIC_SYMBOLS", "SYMBOLS", "symbol"]

#: ``FederatedAlgorithm``'s symbols: those of an algorithm this registry does not know
DEFAULT_SYMBOLS = {"step_size": "γ"}
_LOCAL_UPDATE = {"step_size": "η", "local_step_size": "γ"}  # paper 004 §3
_DECENTRALIZED = {"step_size": "η", "consensus_step_size": "γ", "clip_threshold": "τ"}
_ERROR_FEEDBACK = {"step_size": "γ", "beta": "β", "alpha": "α", "clip_threshold": "τ"}

#: algorithm class name -> {init argument: symbol in its paper}
SYMBOLS: dict[str, dict[str, str]] = {
    "FederatedAlgorithm": DEFAULT_SYMBOLS,
    "DistributedDPSGD": {"step_size": "γ", "scale": "β"},  # paper 002 eq. (2)
    "ErrorFeedback": _ERROR_FEEDBACK,
    "AlphaNormEC": _ERROR_FEEDBACK,
    "Clip21": _ERROR_FEEDBACK,
    "EF21": _ERROR_FEEDBACK,
    "DecentralizedAlgorithm": _DECENTRALIZED,
    "PORTER": _DECENTRALIZED,
    "BEER": _DECENTRALIZED,
    "SoteriaFL": {"step_size": "η", "shift_step_size": "γ", "clip_threshold": "G"},
    "LocalUpdateAlgorithm": _LOCAL_UPDATE,
    "DPFedAvg": {**_LOCAL_UPDATE, "scale": "β"},
    "FedAvgPerSampleClipping": {"step_size": "η", "clip_threshold": "c"},  # paper 003 Alg. 1
    "FedAvgPerUpdateClipping": {
        "step_size": "η_g",
        "local_step_size": "η_l",
        "clip_threshold": "c",
    },
    "FedAlphaNormEC": {
        "step_size": "η",
        "local_step_size": "γ",
        "beta": "β",
        "alpha": "α",
        "participation_prob": "p",
    },
}

#: symbols of parameters that belong to no algorithm (operators, privacy)
GENERIC_SYMBOLS = {
    "beta": "β",
    "alpha": "α",
    "threshold": "τ",
    "epsilon": "ε",
    "delta": "δ",
    "server_normalization": "server norm.",
}


def symbol(column: str | None, algorithm_names: Iterable[str] = ()) -> str:
    """The symbol of a hyperparameter in the papers of ``algorithm_names`` (several joined by
    ``/``), else a generic one, else the column; ``""`` for no column.

    Names this registry does not know are left out; with none known, the symbols are
    ``FederatedAlgorithm``'s.

    >>> symbol("step_size", ["PORTER", "AlphaNormEC"]), symbol("beta", ["PORTER"])
    ('γ/η', 'β')
    """
    if column is None:
        return ""
    tables = [SYMBOLS[n] for n in set(algorithm_names) if n in SYMBOLS] or [DEFAULT_SYMBOLS]
    found = sorted({t[column] for t in tables if column in t})
    return "/".join(found) if found else GENERIC_SYMBOLS.get(column, column)
