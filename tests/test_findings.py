"""What a report says first, and the labels it says it with: the real table's committed runs judged again, a later
stage decided on its own seeds (an equivalence arm a decided miss), each miss with its power and trend, a verdict
drawn beside its own metric only, and rows evaluated on other dev sentences left without a Δ."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from aiayn.ablations.predictions import Prediction
from aiayn.reports import findings, plots, stats, verdicts
from aiayn.reports.build import _judged
from aiayn.reports.runs import Scan, scan
from aiayn.reports.table import build_table, dev_mismatch

REAL = Path(__file__).resolve().parents[1] / "reports" / "reference" / "real" / "runs"


@pytest.fixture(scope="module")
def real():
    runs = [r for r in scan(REAL).runs if r.preset == "real"]
    return runs, _judged(runs, Scan(runs=runs), "real", "multi30k", [])


def test_not_stable_is_only_a_test_that_passed_at_the_end():
    """Every sequence of point verdicts: `not stable` only where the 100% point passed; a sign that changes between
    points is `inconclusive`, not `not stable`."""
    labels = (stats.SIGNIFICANT_AGREE, stats.AGREE, stats.DISAGREE, stats.INCONCLUSIVE, stats.EQUIVALENT)
    for seq in itertools.product(labels, repeat=3):
        got = verdicts.stable_verdict(list(seq))
        if got == stats.NOT_STABLE:
            assert seq[-1] in stats.PASSING, seq
        if seq[-1] == stats.AGREE and got != stats.AGREE:
            assert got == stats.INCONCLUSIVE, seq


def test_the_real_tables_d3_reads_inconclusive_and_its_bleu_rows_sit_on_the_bleu_forest(real, monkeypatch, tmp_path):
    """D3 agreed in sign only at the end (75% and 87.5% the other sign), never significant: `inconclusive` (it read
    `not stable`, a label its key defines as passed at the end). D1 and D3 are scored on BLEU: the PPL forest, whose
    intervals are PPL's, draws neither; the BLEU forest draws both, D3 as stage 2 decided it (A1 too on the PPL
    forest), and the families panel its equivalence band in BLEU points; the curves say where runs decoded
    different dev sentences. A row that dwarfs the others (as the main job's C4 at +224%) puts the forest on a
    symmetric log axis; the real table's rows keep it linear."""
    from aiayn.reports.build import _bleu_sets, _decided_rows, _family_panels

    runs, (t3, _, _, _, family, _, staged, first) = real
    verdict = dict(zip(t3.rows["row"], t3.rows["verdict"]))
    assert verdict["D3"] == stats.INCONCLUSIVE and verdict["A1"] == stats.NOT_STABLE
    assert not set(plots.forest_rows(t3.rows, "ppl")["row"]) & {"D1", "D3"}
    assert set(plots.forest_rows(t3.rows, "bleu")["row"]) == {"D1", "D3"}
    # the forests draw each row as the first screen's verdict was decided: A1 and D3 from stage 2, its band in BLEU
    decided = _decided_rows(t3, staged)
    assert dict(zip(decided["row"], decided["verdict"]))["A1, stage 2"] == stats.SIGNIFICANT_AGREE
    assert set(plots.forest_rows(decided, "bleu")["row"]) == {"D1", "D3, stage 2"} and "A1" not in set(decided["row"])
    panels = _family_panels(t3, staged, family, first)
    assert [line.band for _, _, lines in panels for line in lines if line.row == "D3"] == [None, 0.5]
    # the curves' dev BLEU panel says that its lines mix stage 1's 500-sentence readings with stage 2's whole dev set
    assert _bleu_sets(runs) == "runs differ: the first 500 or all dev sentences"
    assert _bleu_sets([r for r in runs if r.seed < 200]) == ""
    monkeypatch.setattr(plots, "save_png", lambda fig, path: fig)  # the figure drawn, not its file
    dwarfed = t3.rows.assign(delta_ppl_pct=t3.rows["delta_ppl_pct"].where(t3.rows["row"] != "C1", 300.0))
    scales = [plots.forest(table, tmp_path / "f.png", "title").axes[0].get_xscale() for table in (t3.rows, dwarfed)]
    assert scales == ["linear", "symlog"]


def test_each_miss_says_its_power_its_trend_and_the_regime(real):
    """The figures a reader needs to read a miss, recomputed from the committed runs. Stage 1 alone: A1's 75% test had
    about even odds at the effect it measured (3 seeds, Holm's level); D3's dev PPL lead over base shrank over the last
    quarter (p 0.006); base still fell about 10% over its last quarter, at about 9 epochs. Both stages: stage 2
    decides A1 (no longer a miss) and leaves D3 a miss, its power at the paper's -0.5 BLEU and its trend beside it."""
    runs, (t3, _, _, _, family, baselines, staged, first) = real
    from aiayn.reports.build import _by_row, _evidence

    def build(later, decided):
        ev, stage_of = _evidence(t3, later, runs)
        return findings.build(t3.rows, decided, first, stage_of, ev, baselines, ["real"], _by_row(t3, runs))

    alone, both = build([], first), build(staged, family)
    a1, d3 = alone.misses["A1"], alone.misses["D3"]
    assert 0.45 < a1["power_observed"][0] < 0.8 and a1["power_observed"][-1] > 0.95
    assert d3["trend_p"] < 0.01 and d3["trend_pct_per_1000_steps"] > 0
    assert d3["seeds_for_observed"] > 500  # -0.06 BLEU against a spread of 0.4
    assert "about 9 epochs" in alone.predictors and "still falling 10." in alone.predictors
    (heads,) = [line for line in alone.families if line.startswith("**Heads**")]
    assert "**not stable** (3 v 8 seeds): passed at 87.5% and 100%, not at 75% (agree, Holm p 0.054); power" in heads
    assert "power at the paper's difference" in heads
    (smoothing,) = [line for line in alone.families if line.startswith("**Label smoothing**")]
    assert "**inconclusive** (8 v 8 seeds): +0.19/+0.27/-0.06 BLEU at 75/87.5/100%; power" in smoothing
    assert sorted(both.misses) == ["D3", "E1"] and 0.7 < both.misses["D3"]["power_registered"][-1] < 0.8
    (heads,) = [line for line in both.families if line.startswith("**Heads**")]
    assert "**significant agree** (stage 2, 5 v 20 seeds; stage 1: `not stable`)" in heads
    (smoothing,) = [line for line in both.families if line.startswith("**Label smoothing**")]
    assert "**inconclusive** (stage 2, 20 v 20 seeds; stage 1: `inconclusive`)" in smoothing


def _cell(values: dict, tests: dict | None = None, alpha: float = 0.05) -> verdicts.Cell:
    points = {f: values for f in verdicts.STABILITY[:-1]}
    return verdicts.Cell("real", values, points, alpha=alpha, tests=tests)


def test_a_two_sided_stage_decides_either_way_and_its_equivalence_is_a_miss():
    """A stage's D3 (BLEU worse, with an equivalence arm of 0.5): 20 seeds a side 0.02 BLEU apart with a spread of
    0.2 are equivalent within 0.5 at every point (a decided miss: not a pass); 0.8 BLEU apart, significant agree."""
    tests = {"D3": Prediction("D3", "bleu", "worse", "", margin=0.5)}
    base = [35.0 + 0.2 * math.sin(i) for i in range(20)]
    same = {"base": {"bleu": base}, "D3": {"bleu": [b - 0.02 for b in base[::-1]]}}
    (v,) = verdicts.judge_cells([_cell(same, tests, alpha=0.0253)]).values()
    assert v.verdict == stats.EQUIVALENT and not v.passed and v.alpha == 0.0253
    worse = {"base": {"bleu": base}, "D3": {"bleu": [b - 0.8 for b in base[::-1]]}}
    (v,) = verdicts.judge_cells([_cell(worse, tests, alpha=0.0253)]).values()
    assert v.verdict == stats.SIGNIFICANT_AGREE and v.passed


def test_a_stage_is_judged_at_its_tables_level():
    """Šidák's level for two stages (0.0253): a difference significant at 0.05 (p 0.03) but not there is not a pass."""
    tests = {"A1": Prediction("A1", "ppl", "worse", "")}
    base = [7.6, 7.7, 7.65, 7.72, 7.58]
    values = {"base": {"ppl": base}, "A1": {"ppl": [7.735, 7.825, 7.715, 7.815, 7.675]}}
    p = stats.welch_p([math.log(x) for x in values["A1"]["ppl"]], [math.log(x) for x in base])
    assert 0.0253 < p < 0.05
    (at05,) = verdicts.judge_cells([_cell(values, tests)]).values()
    (at0253,) = verdicts.judge_cells([_cell(values, tests, alpha=0.0253)]).values()
    assert at05.verdict == stats.SIGNIFICANT_AGREE and at0253.verdict == stats.AGREE


def test_rows_evaluated_on_other_dev_sentences_get_no_delta(real):
    """A row whose runs scored another number of dev sentences than base's (a sweep resumed with another
    --eval-subset) is named, its Δ blank, and not tested."""
    runs, _ = real
    import dataclasses

    moved = [
        dataclasses.replace(r, metrics=dataclasses.replace(r.metrics, dev_sentences=50)) if r.row == "B1" else r
        for r in runs
    ]
    assert dev_mismatch(moved) == {"B1": "evaluated on 50 dev sentences against base's 1014"}
    t3 = build_table(moved, "real", "line")
    b1 = t3.rows[t3.rows["row"] == "B1"].iloc[0]
    assert math.isnan(b1["delta_ppl_pct"]) and math.isnan(b1["delta_bleu"]) and "B1" in t3.mismatched


def test_an_equivalences_interval_is_named_at_its_tables_level_wherever_it_is_printed(real):
    """At the real table's α (0.0253: Šidák over two stages) TOST's interval is a 94.9% one, which the key and the
    notes called 90%, its level at α 0.05: a label that contradicted the numbers beside it."""
    from aiayn.reports import notes, render

    _, (t3, _, _, _, family, *_) = real
    (e1,) = [v for v in family.values() if v.row == "E1"]
    texts = [render.key(t3.rows, e1.alpha), findings._delta(e1), notes._margin_text(e1), notes._tested_delta(e1)]
    assert all("94.9% interval" in text and "90%" not in text for text in texts), texts
