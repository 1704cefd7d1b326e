"""The `real` preset's pilot rule (scripts/real_pilot.py), on hand-made pilots: it reads base's noise alone, gives
noisier tests more seeds, and cuts whole slices from the end of the registered order when the budget runs out."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from aiayn.ablations.predictions import predictions

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("real_pilot", ROOT / "scripts" / "real_pilot.py")
real_pilot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_pilot)


def pilot(tmp_path: Path, ppl, bleu, wall_s: float) -> Path:
    for seed, p, b in zip(real_pilot.PILOT_SEEDS, ppl, bleu):
        run = tmp_path / "real" / "multi30k" / "base" / f"seed{seed}"
        run.mkdir(parents=True)
        metrics = {"status": "completed", "seed": seed, "dev_ppl": p, "dev_bleu": b, "wall_time_s": wall_s}
        (run / "metrics.json").write_text(json.dumps(metrics))
    return tmp_path


def test_the_rule_reads_base_noise_and_powers_each_registered_test(tmp_path):
    r = real_pilot.rule(pilot(tmp_path, [7.0, 7.05, 6.95, 7.02], [36.0, 36.6, 35.5, 36.2], 600))
    assert r["sd"]["ppl"] == pytest.approx(0.0060062, rel=1e-4)
    assert r["sd_upper80"]["ppl"] > r["sd"]["ppl"]
    assert set(r["tests"]) == {row for row, p in predictions("real").items() if p.scored}
    # C1's paper difference (+24% PPL) is powered at the fewest seeds; every seed count within the rule's range
    assert r["tests"]["C1"]["seeds"] == real_pilot.MIN_SEEDS
    assert all(real_pilot.MIN_SEEDS <= t["seeds"] <= real_pilot.MAX_SEEDS for t in r["tests"].values())
    assert all(t["underpowered"] or t["power"] >= real_pilot.POWER for t in r["tests"].values())
    assert r["slices"][0]["rows"] == ["base", "E1"] and not r["cut"]


def test_noisier_seeds_get_more_seeds_and_an_over_budget_slice_is_cut_whole(tmp_path):
    quiet = real_pilot.rule(pilot(tmp_path / "q", [7.0, 7.01, 6.99, 7.0], [36.0, 36.1, 35.9, 36.0], 600))
    noisy = real_pilot.rule(pilot(tmp_path / "n", [7.0, 7.3, 6.7, 7.1], [36.0, 37.5, 34.5, 36.5], 600))
    assert noisy["tests"]["B1"]["seeds"] > quiet["tests"]["B1"]["seeds"]
    slow = real_pilot.rule(pilot(tmp_path / "s", [7.0, 7.01, 6.99, 7.0], [36.0, 36.1, 35.9, 36.0], 3600))
    kept = [row for s in slow["slices"] for row in s["rows"]]
    cut = [row for s in slow["cut"] for row in s["rows"]]
    assert kept + cut == [row for s in real_pilot.SLICES for row in s] and cut and kept[:2] == ["base", "E1"]
    assert slow["projected_hours"] <= real_pilot.MAX_HOURS
    assert math.isclose(sum(s["hours"] for s in slow["slices"]), slow["projected_hours"])


def test_too_few_pilot_runs_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="the rule needs 3 or more"):
        real_pilot.rule(pilot(tmp_path, [7.0, 7.1], [36.0, 36.5], 600))
