"""The pre-registered scored sets (ablations/predictions.csv): what each preset tests, held to the rules its
module states, so that a line added later cannot quietly score a row the paper does not separate from noise."""

import pytest

from aiayn.ablations import predictions as P
from aiayn.ablations.presets import PRESETS
from aiayn.ablations.table import load_rows
from aiayn.common.errors import UserError


def test_candidates_are_the_rows_whose_paper_delta_is_beyond_its_noise():
    # by hand from the paper's Table 3 (base 25.8 BLEU, 4.92 PPL; 3% of 4.92 = 0.1476):
    # A1 -0.9/+0.37, B1 -0.7/+0.24, C1 -2.1/+1.19, C2 -0.5/+0.27, C4 -1.3/+0.83, C5 +0.2/-0.26, C6 -0.4/+0.20,
    # C7 +0.4/-0.17, D1 -1.2/+0.85, D3 -0.5/-0.25, D4 -0.1/+0.55; A2-A4, B2, C3, D2, E1 under both; big: reference
    assert P.candidates() == {
        "A1": ("bleu", "ppl"), "B1": ("bleu", "ppl"), "C1": ("bleu", "ppl"), "C2": ("bleu", "ppl"),
        "C4": ("bleu", "ppl"), "C5": ("ppl",), "C6": ("ppl",), "C7": ("ppl",), "D1": ("bleu", "ppl"),
        "D3": ("bleu", "ppl"), "D4": ("ppl",),
    }  # fmt: skip


def test_paper_direction_reads_bleu_up_and_ppl_down_as_better():
    assert (P.paper_direction("D3", "bleu"), P.paper_direction("D3", "ppl")) == ("worse", "better")
    assert (P.paper_direction("C5", "ppl"), P.paper_direction("A3", "bleu")) == ("better", None)


@pytest.mark.parametrize("preset", sorted({p for p in P._all()}))
def test_every_line_keeps_the_rules(preset):
    assert preset in PRESETS, f"{preset} is not a preset"
    rows, aliases = load_rows(), dict(PRESETS[preset].aliases)
    for row, pred in P.predictions(preset).items():
        assert row in rows and row != "base"
        assert pred.reason, f"{preset} {row}: every line says why"
        if pred.scored:
            assert pred.metric in P.candidates().get(row, ()), f"{preset} {row}: not beyond the paper's noise"
            assert row not in aliases, f"{preset} {row}: the same config as {aliases.get(row)}"
            # a prediction against the paper's sign would have to say so; none does today
            assert pred.predicted == P.paper_direction(row, pred.metric), f"{preset} {row}: not the paper's sign"


def test_the_scored_sets():
    assert P.scored_rows("tiny") == ["A1", "C1", "C4", "D3", "D4"]
    assert P.scored_rows("evidence") == ["C1", "D4"]  # v3: the rows its pilot admitted (BENCHMARKS.md)
    assert (P.scored_rows("tiny-2k"), P.scored_rows("laptop"), P.scored_rows("paper")) == (["D1"], ["D1", "D3"], [])


@pytest.mark.parametrize(
    "line, message",
    [
        ("tiny,A1,ppl,maybe,x", "predicted must be one of"),
        ("tiny,A1,,worse,x", "a scored row names its metric"),
        ("tiny,A1,ppl,not testable,x", "a scored row names its metric"),
        ("tiny,A1,wer,worse,x", "a scored row names its metric"),
    ],
)
def test_a_bad_line_is_one_line_naming_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "p.csv"
    path.write_text("preset,row,metric,predicted,reason\n" + line + "\n")
    with pytest.raises(UserError, match=message) as e:
        P._read(path)
    assert f"{path} line 2" in str(e.value) and "\n" not in str(e.value)
