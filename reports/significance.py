"""Paired bootstrap resampling of one row's dev hypotheses against base's (sacreBLEU's PairedTest)."""

from __future__ import annotations

import logging
import os

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

log = logging.getLogger(__name__)

N_SAMPLES = 1000  # Koehn (2004) and sacreBLEU's default for the paired bootstrap
ALPHA = 0.05
MARK = "*"


def bootstrap_seed() -> str:
    """The RNG seed sacreBLEU's PairedTest uses (SACREBLEU_SEED, default 12345), as its signature writes it."""
    return os.environ.get("SACREBLEU_SEED", "12345").lower()


def paired_bootstrap(base_hyps: list[str], row_hyps: list[str], refs: list[str], n_samples: int = N_SAMPLES) -> float:
    """p-value of the BLEU difference between `row_hyps` and `base_hyps` on the same references."""
    return paired_bootstrap_many(base_hyps, {"row": row_hyps}, refs, n_samples)["row"]


def paired_bootstrap_many(
    base_hyps: list[str], systems: dict[str, list[str]], refs: list[str], n_samples: int = N_SAMPLES
) -> dict[str, float]:
    """p-value of each system against base, in one PairedTest (base's statistics computed once).

    Each system is resampled with the same seeded indices, so its p equals that of a test of it alone.
    """
    for name, hyps in {"base": base_hyps, **systems}.items():
        if len(hyps) != len(refs) or not refs:
            raise ValueError(f"{name}: {len(hyps)} hypotheses for {len(refs)} references")
    test = PairedTest(
        [("base", base_hyps), *systems.items()],
        {"BLEU": BLEU()},
        references=[refs],
        test_type="bs",
        n_samples=n_samples,
    )
    _, scores = test()
    return {name: float(result.p_value) for name, result in zip(scores["System"][1:], scores["BLEU"][1:])}


def mark(p: float | None) -> str:
    return MARK if p is not None and p < ALPHA else ""
