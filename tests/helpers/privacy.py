"""An algorithm's privacy accounting as the package derives it (pl_privfed.privacy.plan of its
declaration), for tests that check one algorithm's mechanisms without a run's ledger."""

from pl_privfed.privacy import plan


def mechanisms(alg, round_index=None):
    """The defensible releases of round ``round_index`` (default: the round last run)."""
    if alg.noise is None:
        return []
    if round_index is None:
        round_index = max(0, int(alg.rounds_done) - 1)
    return plan.round_mechanisms(alg.release(), alg.noise, alg.noise_std, round_index)


def paper_mechanisms(alg):
    """The releases of one round under the papers' convention."""
    return [] if alg.noise is None else plan.paper_mechanisms(alg.release(), alg.noise_std)


def relation(alg):
    """The neighbouring relation of the algorithm's reported ε."""
    return plan.relation(alg.release(), alg.noise)


def sensitivity(alg, neighbouring=None):
    """The sensitivity under ``neighbouring`` (default: the reported ε's relation)."""
    return plan.sensitivity(alg.release(), neighbouring or relation(alg))
