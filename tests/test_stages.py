"""A table's later stages (ablations/stages.csv): what each re-tests, on which fresh seeds, at which level; the
sweep trains exactly the registered pairs, and a line that changes a registered prediction is refused."""

import pytest

from aiayn.ablations import stages as S
from aiayn.ablations.presets import get_preset
from aiayn.ablations.selection import Selection
from aiayn.common.errors import UserError

HEADER = "preset,stage,first_seed,row,metric,predicted,margin,seeds,reason\n"


def test_the_real_tables_second_stage():
    (two,) = S.stages("real")
    assert (two.number, two.first_seed, two.seeds) == (2, 200, {"base": 20, "A1": 5, "D3": 20})
    assert {r: (t.metric, t.predicted, t.margin) for r, t in two.tests.items()} == {
        "A1": ("ppl", "worse", None),
        "D3": ("bleu", "worse", 0.5),
    }
    assert S.level("real") == pytest.approx(0.0253, abs=1e-4) and S.level("evidence") == 0.05
    assert [S.stage_of("real", s) for s in (0, 7, 199, 200, 219, 220)] == [1, 1, 1, 2, 2, 1]


def test_a_stage_sweep_trains_its_registered_pairs_seed_by_seed():
    pairs = Selection(stage=2).pairs(get_preset("real"))
    assert len(pairs) == 45 and pairs[:4] == [("base", 200), ("A1", 200), ("D3", 200), ("base", 201)]
    assert sorted(s for r, s in pairs if r == "A1") == list(range(200, 205))
    assert sorted(s for r, s in pairs if r == "D3") == list(range(200, 220))
    # every machine a stage runs on gets its rows in proportion: no prefix of the order holds one row alone
    assert all({"base", "D3"} <= {r for r, _ in pairs[: k + 3]} for k in range(0, 45, 3))


@pytest.mark.parametrize("flags", [{"rows": "A1"}, {"seeds": 3}, {"first_seed": 7}, {"base_seeds": 9}])
def test_a_stage_refuses_the_flags_it_sets(flags):
    with pytest.raises(UserError, match="--stage 2 names its rows and seeds"):
        Selection(stage=2, **flags).pairs(get_preset("real"))


@pytest.mark.parametrize(
    "lines, message",
    [
        ("real,2,200,A1,ppl,better,,5,x\nreal,2,200,base,,,,5,x\n", "A1 is registered worse on ppl"),
        ("real,2,200,A1,bleu,worse,,5,x\nreal,2,200,base,,,,5,x\n", "A1 is registered worse on ppl"),
        ("real,2,200,E1,ppl,equivalent,,5,x\nreal,2,200,base,,,,5,x\n", "E1 is not one"),
        ("real,2,200,A1,ppl,worse,,5,x\n", "trains no base of its own"),
        ("real,2,200,base,,,,5,x\nreal,2,300,A1,ppl,worse,,5,x\n", "has one first_seed"),
        ("real,1,200,base,,,,5,x\n", "a later stage is 2 or more"),
        ("real,2,200,base,,,,5,x\nreal,2,200,base,,,,5,x\n", "listed twice"),
    ],
)
def test_a_stage_line_that_changes_the_registration_is_refused(lines, message):
    with pytest.raises(UserError, match=message):
        S._read(HEADER + lines, "stages.csv")
