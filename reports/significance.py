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
    if not (len(base_hyps) == len(row_hyps) == len(refs)) or not refs:
        raise ValueError(
            f"hypotheses and references differ in length ({len(base_hyps)}, {len(row_hyps)}, {len(refs)} lines)"
        )
    test = PairedTest(
        [("base", base_hyps), ("row", row_hyps)],
        {"BLEU": BLEU()},
        references=[refs],
        test_type="bs",
        n_samples=n_samples,
    )
    _, scores = test()
    return float(scores["BLEU"][1].p_value)


def mark(p: float | None) -> str:
    return MARK if p is not None and p < ALPHA else ""
