"""The stability rule's points as data: where a run's dev numbers are read (reports/verdicts.py judges them) and so
where a run must have validated (lightning_modules/run/train.py schedules those validations itself).

A point needs one validation within a sixteenth of the budget ("nearest") or three ("median3"). A run's regular
schedule (every `--val-every` optimizer steps) may miss a point: 1000 steps validated every 500 leave nothing near
750 or 875. `scheduled` names the validations a run adds so that no point is left without its reading, whatever
`--val-every` says; a schedule that already covers every point adds none (and a validation never changes training:
each training batch starts from the RNG state the previous one ended with).
"""

from __future__ import annotations

import statistics

# The stability rule's points, as fractions of the run's budget: the validations nearest 75% and 87.5% of its steps
# (from the dev perplexity logged during training) and the final evaluation (100%).
STABILITY = (0.75, 0.875, 1.0)

# How a run's number at each point is read from its curve (a preset's `stability`, fixed before its runs):
# - "nearest": the one validation nearest the point (100%: the final evaluation); the main job;
# - "median3": the median of the three validations nearest the point (100%: the last three, the final evaluation
#   among them), so that one bad validation of one seed cannot decide a point (an earlier table's C7 was `not
#   stable` on one validation 6.5% above its neighbours).
READINGS = ("nearest", "median3")
WINDOW = 3  # validations a "median3" point reads


def point_steps(steps, budget: int, fraction: float, reading: str = "nearest") -> list[int]:
    """The logged steps a point of the stability rule reads (`reading`: READINGS), in order: the one nearest
    `fraction` of `budget` ("nearest"; Lightning logs a validation after s + 1 optimizer steps at step s) or the
    WINDOW nearest ("median3"); ties go to the later."""
    if reading not in READINGS:
        raise ValueError(f"unknown stability reading {reading!r}; one of {', '.join(READINGS)}")
    target = fraction * budget
    by_distance = sorted(sorted({int(s) for s in steps}, reverse=True), key=lambda s: abs(s + 1 - target))
    return sorted(by_distance[: 1 if reading == "nearest" else WINDOW])


def point_value(values: dict, budget: int, fraction: float, reading: str = "nearest") -> float | None:
    """A run's number at one point of the stability rule from its curve (`values`: logged step -> dev number): the
    validation nearest the point, or the median of the WINDOW nearest (READINGS). None where the curve has too few
    validations there, or one of them more than a sixteenth of the budget from the point: a run that logged too
    few validations is not testable at that point."""
    chosen = point_steps(values, budget, fraction, reading)
    need = 1 if reading == "nearest" else WINDOW
    if len(chosen) < need or any(abs(s + 1 - fraction * budget) > 0.0625 * budget for s in chosen):
        return None
    return float(statistics.median(float(values[s]) for s in chosen))


def read_points(reading: str) -> tuple[float, ...]:
    """The stability rule's points a reading takes from the curve logged during training: the earlier ones, and 100%
    too where it reads a window there ("median3"; "nearest" takes 100% from the final evaluation)."""
    if reading not in READINGS:
        raise ValueError(f"unknown stability reading {reading!r}; one of {', '.join(READINGS)}")
    return STABILITY if reading == "median3" else STABILITY[:-1]


def regular(budget: int, every: int) -> list[int]:
    """The optimizer steps after which a run of `budget` steps validates every `every` steps."""
    return list(range(every, budget + 1, every)) if every > 0 else []


def scheduled(budget: int, every: int, reading: str = "nearest") -> tuple[int, ...]:
    """The optimizer steps after which a run of `budget` steps validating every `every` must validate as well, so that
    each of `read_points(reading)` has its reading: for a point without one, the step nearest it ("nearest"), or it
    and its neighbours a sixty-fourth of the budget apart ("median3"; at 100% the budget and the two before it)."""
    done = set(regular(budget, every))
    extra: set[int] = set()
    gap = max(1, budget // 64)
    for fraction in read_points(reading):
        have = {step - 1: 0.0 for step in done | extra}
        if point_value(have, budget, fraction, reading) is not None:
            continue
        target = min(budget, max(1, round(fraction * budget)))
        if reading == "nearest":
            window = {target}
        elif fraction < STABILITY[-1]:
            window = {target - gap, target, target + gap}
        else:
            window = {budget - 2 * gap, budget - gap, budget}
        extra |= {step for step in window if 1 <= step <= budget} - done
    return tuple(sorted(extra))
