"""What an accountant is told about one Gaussian release, and what an ε assumes.

A :class:`Mechanism` is one (possibly subsampled) Gaussian release as the accountant composes
it: its noise multiplier (noise std / sensitivity of the noised quantity under the neighbouring
relation) and how the privacy unit entered it. :class:`AccountingBasis` records, next to a
reported ε, the assumptions that ε rests on: the neighbouring relation, the sensitivity, the
amplification claimed and against whom, and whether any part of it is an approximation rather
than a certificate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

from pl_privfed.checks import check_choice

__all__ = ["AccountingBasis", "Mechanism", "ReleaseKey", "Sampling"]

#: How the privacy unit enters a release: ``"none"`` (always, no amplification), ``"poisson"``
#: (independently with probability ``sample_rate``: Opacus's subsampled Gaussian, add/remove),
#: ``"without_replacement"`` (a uniformly random fixed-size sample of ``sample_rate ·
#: population`` of the ``population`` units: dp-accounting's ``SampledWithoutReplacementDpEvent``,
#: replace-one).
Sampling = Literal["none", "poisson", "without_replacement"]


class ReleaseKey(NamedTuple):
    """What identifies a Gaussian release for composition (:meth:`Mechanism.key`): the one key
    the accountants count releases by, the PLDs and RDP curves are cached by, and a run's
    ``history`` records (``summary.json``) are written and read back with. An unamplified
    release is always ``(σ, 1.0, "none", None)``."""

    noise_multiplier: float
    sample_rate: float
    sampling: Sampling
    population: int | None

    def as_dict(self) -> dict[str, Any]:
        """The key as ``{field: value}`` (a ``history`` record's fields)."""
        return dict(zip(ReleaseKey.__annotations__, self, strict=True))


@dataclass(frozen=True)
class Mechanism:
    """One Gaussian release as the accountant sees it.

    Attributes:
        noise_multiplier: noise std divided by the sensitivity of the noised quantity.
        sample_rate: probability that the privacy unit takes part in the release (1: it always
            does; nothing is amplified).
        privacy_unit: what is protected (e.g. ``"client-level local DP"``).
        sampling: how the unit is sampled into the release (:data:`Sampling`); ``"poisson"``
            with ``sample_rate < 1`` is Poisson subsampling, with ``sample_rate = 1`` no sampling.
        population: ``m``, the units sampled from, for ``sampling="without_replacement"``
            (the sample size is ``sample_rate · m``, an integer).
    """

    noise_multiplier: float
    sample_rate: float = 1.0
    privacy_unit: str = ""
    sampling: Sampling = "poisson"
    population: int | None = None

    def __post_init__(self) -> None:
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(f"noise_multiplier must be positive, got {self.noise_multiplier!r}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        check_choice("sampling", self.sampling, ("none", "poisson", "without_replacement"))
        if self.sampling == "none" and self.sample_rate != 1:
            raise ValueError(f"sampling='none' needs sample_rate 1, got {self.sample_rate!r}")
        if self.sampling == "without_replacement":
            if not (isinstance(self.population, int) and self.population >= 1):
                raise ValueError(
                    "sampling without replacement needs population (the number of units "
                    f"sampled from) as a positive integer, got {self.population!r}"
                )
            size = self.sample_rate * self.population
            if abs(size - round(size)) > 1e-6 * self.population:
                raise ValueError(
                    f"sample_rate · population must be a whole sample size, got "
                    f"{self.sample_rate!r} · {self.population} = {size!r}"
                )

    @property
    def amplified(self) -> bool:
        """Whether the release is subsampled (some amplification is claimed)."""
        return self.sample_rate < 1

    @property
    def sample_size(self) -> int | None:
        """``b = sample_rate · population`` for sampling without replacement, else ``None``."""
        if self.sampling != "without_replacement":
            return None
        return round(self.sample_rate * self.population)

    def key(self) -> ReleaseKey:
        """What identifies the release for composition (the privacy unit is a label only)."""
        if not self.amplified:
            return ReleaseKey(float(self.noise_multiplier), 1.0, "none", None)
        return ReleaseKey(
            float(self.noise_multiplier),
            float(self.sample_rate),
            self.sampling,
            self.population,
        )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Mechanism:
        """The release of a ``history`` record (:meth:`~pl_privfed.privacy.PrivacyAccountant.
        history`: ``noise_multiplier``, ``sample_rate``, ``sampling`` (default ``"poisson"``)
        and ``population``), checked as any release."""
        population = record.get("population")
        return cls(
            float(record["noise_multiplier"]),
            float(record["sample_rate"]),
            sampling=str(record.get("sampling") or "poisson"),  # type: ignore[arg-type]
            population=None if population is None else int(population),
        )


@dataclass(frozen=True)
class AccountingBasis:
    """What a reported ε assumes.

    Attributes:
        neighbouring_relation: ``"add_remove"`` or ``"replace_one"`` (one privacy unit present or
            absent / one unit's data swapped for any other).
        sensitivity: how far one unit can move the noised quantity under that relation (the
            accountant's noise multiplier is noise std / sensitivity).
        amplification: the subsampling the ε claims amplification from, and against whom; or why
            none is claimed.
        approximation: ``None`` when the accounting is a certificate for the mechanism that
            runs; otherwise what is approximated.
        composition: over which releases ε composes.
    """

    neighbouring_relation: str
    sensitivity: float
    amplification: str
    approximation: str | None = None
    composition: str = "every round of the run"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
