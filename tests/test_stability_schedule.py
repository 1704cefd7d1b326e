"""The stability rule's validations are the run's to schedule: whatever --val-every says, a run validates
near 75% and 87.5% of its budget (and, where its preset reads a window, three times near each point), so that a
report never finds a point without its reading because of the schedule."""

import itertools

import pytest
import torch

from aiayn.ablations.stability import READINGS, point_value, read_points, regular, scheduled
from aiayn.cli import main
from aiayn.reports.runs import read_curve


def test_a_schedule_that_misses_the_points_gets_the_validations_nearest_them():
    assert scheduled(1000, 500, "nearest") == (750, 875)  # a run seen so: --max-steps 1000 --val-every 500
    assert scheduled(1000, 500, "median3") == (735, 750, 765, 860, 875, 890, 970, 985)
    assert scheduled(8, 8, "nearest") == (6, 7)


def test_a_schedule_that_covers_the_points_adds_nothing():
    """The registered presets' own schedules (v5: 4500 every 125; the wide call's val_every(B)) stay as they ran."""
    assert scheduled(4500, 125, "nearest") == scheduled(4500, 125, "median3") == ()
    assert scheduled(1600, 50, "median3") == scheduled(1000, 125, "nearest") == ()


@pytest.mark.parametrize("reading", READINGS)
def test_every_point_has_its_reading_after_the_schedule(reading):
    """From 32 steps up (below, three validations cannot all lie within a sixteenth of 100%: the rule's own limit)."""
    for budget, every in itertools.product(range(32, 2000, 37), (1, 3, 10, 64, 125, 500, 5000)):
        every = min(every, budget)
        steps = set(regular(budget, every)) | set(scheduled(budget, every, reading))
        logged = {step - 1: 1.0 for step in steps}  # a validation after k steps is logged at step k - 1
        for fraction in read_points(reading):
            assert point_value(logged, budget, fraction, reading) is not None, (budget, every, reading, fraction)
        assert not set(scheduled(budget, every, reading)) & set(regular(budget, every))


SMALL = [
    "--set",
    "N=1 d_model=32 d_ff=64 h=2",
    *"--preset tiny --val-bleu-sentences 2 --eval-subset 4 --no-progress --accelerator cpu --max-steps 8".split(),
]


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_a_run_validates_at_the_points_whatever_val_every_says_and_trains_the_same(cache, tmp_path):
    """8 steps validated every 100 (capped at 8): today's schedule validates once, after step 8; the run adds steps 6
    and 7 (75% and 87.5%). Validation leaves training as it was: the losses equal those of a run validating every
    step."""
    assert main(["train", "--out", str(tmp_path / "sparse"), *SMALL, "--val-every", "100"]) == 0
    assert main(["train", "--out", str(tmp_path / "dense"), *SMALL, "--val-every", "1"]) == 0
    run = lambda name: tmp_path / name / "tiny" / "synthetic" / "base" / "seed0"
    sparse, dense = read_curve(run("sparse"), "val/ppl"), read_curve(run("dense"), "val/ppl")
    assert sparse["step"].tolist() == [5, 6, 7]
    asked = ["--val-every", "100", "--no-stability-validations"]
    assert main(["train", "--out", str(tmp_path / "asked"), *SMALL, *asked]) == 0
    assert read_curve(run("asked"), "val/ppl")["step"].tolist() == [7]  # --val-every's schedule alone, on request
    assert dense["step"].tolist() == list(range(8))
    for fraction in read_points("nearest"):
        values = dict(zip(sparse["step"], sparse["val/ppl"], strict=True))
        assert point_value(values, 8, fraction) is not None
    weights = lambda name: torch.load(run(name) / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    sparse_w, dense_w = weights("sparse"), weights("dense")
    assert sparse_w.keys() == dense_w.keys() and all(torch.equal(sparse_w[k], dense_w[k]) for k in sparse_w)
