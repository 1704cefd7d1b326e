"""Table 3 as data, the presets' scaling rule and `aiayn rows`."""

import csv
import json
from pathlib import Path

import pytest
import torch

from aiayn.ablations.knobs import MODEL_KEYS
from aiayn.ablations.presets import PRESETS
from aiayn.ablations.table import load_rows, select_rows
from aiayn.cli import main
from aiayn.common.errors import UserError
from aiayn.lightning_modules.run.spec import resolve
from aiayn.lightning_modules.transformer.model import Transformer

PAPER_ROWS = [
    "base",
    "A1",
    "A2",
    "A3",
    "A4",
    "B1",
    "B2",
    "C1",
    "C2",
    "C3",
    "C4",
    "C5",
    "C6",
    "C7",
    "D1",
    "D2",
    "D3",
    "D4",
    "E1",
    "big",
]


def config_of(row, preset, vocab):
    return resolve(row, preset, vocab_size=vocab).model


def resolved(row, preset):
    """The row's knobs at the preset's scale, as a dict."""
    s = resolve(row, preset)
    return {**s.model.to_dict(), "train_steps": s.train_steps}


def count_params(cfg):
    """The parameters of the model built from `cfg` (on the meta device: no weights allocated)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())


def test_table_holds_every_paper_row_with_its_reported_results():
    rows = load_rows()
    assert select_rows(None) == PAPER_ROWS
    assert (rows["base"].paper_ppl, rows["base"].paper_bleu, rows["base"].paper_params_m) == (4.92, 25.8, 65)
    assert (rows["big"].paper_bleu, rows["big"].paper_params_m) == (26.4, 213)
    # a blank cell inherits from base: B1 changes d_k alone
    assert rows["B1"].knobs | {"d_k": 64} == rows["base"].knobs
    assert rows["big"].knobs["train_steps"] == 300_000 and rows["E1"].knobs["pe"] == "learned"


def test_table_matches_the_shared_reference_transcription():
    ref = Path(__file__).resolve().parents[2] / "shared" / "reference" / "table3.csv"
    if not ref.exists():
        pytest.skip(f"reference transcription not found at {ref}")
    ours = Path(__file__).resolve().parents[1] / "ablations" / "table3.csv"
    assert list(csv.reader(ours.open())) == list(csv.reader(ref.open()))


@pytest.mark.parametrize("row", [r for r in PAPER_ROWS if load_rows()[r].paper_params_m])
def test_paper_scale_params_within_5_percent_or_2_5m_of_the_paper(row):
    ours = count_params(config_of(row, "paper", 37000)) / 1e6
    paper = load_rows()[row].paper_params_m
    assert abs(ours - paper) <= max(0.05 * paper, 2.5), (ours, paper)


@pytest.mark.parametrize("row", ["B1", "B2", "C1", "C2", "C3", "C6", "C7"])
def test_param_difference_from_base_within_1m_of_the_papers(row):
    base = count_params(config_of("base", "paper", 37000)) / 1e6
    ours = count_params(config_of(row, "paper", 37000)) / 1e6
    paper = load_rows()[row].paper_params_m - load_rows()["base"].paper_params_m
    assert abs((ours - base) - paper) <= 1.0, (ours - base, paper)


def test_count_params_matches_a_built_model():
    cfg = config_of("B1", "tiny", 1000)
    assert count_params(cfg) == sum(p.numel() for p in Transformer(cfg).parameters())
    assert count_params(config_of("base", "paper", 37000)) == 63_082_496  # pinned: 37000 x 512 shared + 6 + 6 layers


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_counted_params_of_every_row_are_the_models(preset):
    """TransformerConfig.params() counts from the shapes, without building a model: every row, every preset."""
    for row in [*PAPER_ROWS, "no-pe", "rope", "pre-ln"]:
        cfg = config_of(row, preset, 1000)
        assert cfg.params() == count_params(cfg), (row, preset)


@pytest.mark.parametrize("row", PAPER_ROWS + ["no-pe", "rope", "pre-ln"])
def test_every_row_builds_and_runs_forward_at_tiny_scale(row):
    torch.manual_seed(0)
    model = Transformer(config_of(row, "tiny", 100))
    logits = model(torch.randint(4, 100, (2, 9)), torch.randint(4, 100, (2, 7)))
    assert logits.shape == (2, 7, 100) and torch.isfinite(logits).all()


def test_preset_rule_scales_widths_heads_and_depth():
    tiny, paper = PRESETS["tiny"], PRESETS["paper"]
    b, big = resolved("base", "tiny"), resolved("big", "tiny")
    assert (b["d_model"], b["d_ff"], b["h"], b["d_k"], b["d_v"], b["N"]) == (128, 512, 4, 32, 32, 2)
    assert big["train_steps"] == 3 * b["train_steps"] == 3 * tiny.train_steps == 3600
    # h x 1/2 and h·d_k x 1/4: group A keeps h·d_k = d_model with distinct head counts; B keeps d_k's ratio to base
    heads = {r: (resolved(r, "tiny")["h"], resolved(r, "tiny")["d_k"]) for r in ("A1", "A2", "A3", "A4", "B1", "B2")}
    assert heads == {"A1": (1, 128), "A2": (2, 64), "A3": (8, 16), "A4": (16, 8), "B1": (4, 8), "B2": (4, 16)}
    assert (resolved("B1", "tiny")["d_v"], resolved("big", "tiny")["h"], resolved("big", "tiny")["d_k"]) == (32, 8, 32)
    # depth x 1/3, rounded: the order is kept (never reversed), but N=2 and N=4 both become 1
    assert [resolved(r, "tiny")["N"] for r in ("C1", "C2", "base", "C3")] == [1, 1, 2, 3]
    assert [resolved(r, "small")["N"] for r in ("C1", "C2", "base", "C3")] == [1, 2, 3, 4]
    assert resolved("base", "paper")["train_steps"] == paper.train_steps == 100_000


@pytest.mark.parametrize("preset", list(PRESETS))
def test_distinct_paper_rows_resolve_to_distinct_configs_unless_the_preset_declares_them_one(preset):
    configs = {}
    for row in select_rows(None):
        r = resolved(row, preset)
        configs.setdefault(tuple(r[k] for k in (*MODEL_KEYS, "train_steps")), []).append(row)
    shared = sorted(sorted(rows) for rows in configs.values() if len(rows) > 1)
    assert shared == sorted(sorted(pair) for pair in PRESETS[preset].aliases), f"{preset}: undeclared aliases"


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_rule_keeps_head_widths_in_the_range_the_paper_ran(preset):
    """The paper's d_k run from 16 to 512 at d_model 512: at 1/4 width that is 4 to 128; a preset keeps d_k >= 8,
    but for `evidence` and the main job in its regime (`quick`), which make heads narrower than the sentences on
    purpose (attempt 4: a head's attention has rank at most d_k, so B1 and A4 bind), at least 2."""
    widths = {row: resolved(row, preset)["d_k"] for row in select_rows(None)}
    assert min(widths.values()) >= (2 if preset in ("evidence", "quick") else 8), widths


def test_select_rows_by_group_and_id():
    assert select_rows("base,A,C3") == ["base", "A1", "A2", "A3", "A4", "C3"]
    extended = [row for row, r in load_rows().items() if r.group == "extended"]  # the registry, not a copy of it
    assert extended and select_rows("extended") == extended
    with pytest.raises(UserError, match="unknown row or group 'Z9'"):
        select_rows("base,Z9")


def test_rows_json_at_paper_scale(capsys):
    assert main(["rows", "--preset", "paper", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["row"] for r in rows] == PAPER_ROWS
    keys = {
        "row",
        "group",
        "N",
        "d_model",
        "d_ff",
        "h",
        "d_k",
        "d_v",
        "p_drop",
        "eps_ls",
        "pe",
        "train_steps",
        "params",
        "paper_ppl",
        "paper_bleu",
        "paper_params_m",
    }
    assert keys <= set(rows[0])
    assert rows[0]["params"] == 63_082_496 and rows[-1]["train_steps"] == 300_000


@pytest.mark.parametrize(
    "argv, message",
    [
        (["rows", "--preset", "huge"], "unknown preset 'huge'; choose one of: paper, small, tiny"),
        (["rows", "--rows", "F1"], "unknown row or group 'F1' in --rows"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aiayn: error: {message}") and err.count("\n") == 1


def test_a_row_of_your_own_table_is_in_the_papers_units_and_the_run_says_how_it_was_scaled(
    tmp_path, caplog, monkeypatch
):
    """An own row's cells are the paper's units, which the preset scales (d_ff 256 became 64 at tiny
    without a word); the resolved run says so, once per row and preset, naming each scaled cell."""
    from aiayn.lightning_modules.run import spec as spec_module
    from aiayn.lightning_modules.run.spec import resolve

    monkeypatch.setattr(spec_module, "_SAID", set())  # once per process: another test's wide-ff was said already

    header = (Path(__file__).resolve().parents[1] / "ablations" / "extended.csv").read_text().splitlines()[0]
    cells = {"row": "wide-ff", "group": "mine", "d_ff": "4096"}
    table = tmp_path / "mine.csv"
    table.write_text(header + "\n" + ",".join(cells.get(c, "") for c in header.split(",")) + "\n")
    with caplog.at_level("INFO", logger="aiayn.lightning_modules.run.spec"):
        spec = resolve("wide-ff", "tiny", tables=(str(table),))
        resolve("wide-ff", "tiny", tables=(str(table),))
    assert spec.model.d_ff == 1024
    said = [r.getMessage() for r in caplog.records if "wide-ff" in r.getMessage()]
    assert len(said) == 1 and "paper's units" in said[0] and "d_ff 4096 -> 1024" in said[0]


def test_the_pe_knob_and_the_fidelity_page_name_the_positional_encodings_the_model_has():
    """The `pe` knob's help (ablations cannot import the model's registry, a layer above) and docs/fidelity.md's
    line on what goes beyond the paper list the encodings by name: each is read here against `PE_KINDS`, so an
    encoding added to the model and not to them (or removed) fails."""
    import re

    from aiayn.ablations.knobs import KNOBS
    from aiayn.lightning_modules.transformer.config import PE_KINDS

    named = KNOBS["pe"].help.split(":", 1)[1]
    assert [k.strip() for k in named.split(",")] == list(PE_KINDS)
    fidelity = (Path(__file__).resolve().parents[1] / "docs" / "fidelity.md").read_text()
    beyond = re.search(r"Beyond the paper, each one named flag: .*`pe` = (.*)\.", fidelity).group(1)
    assert set(re.findall(r"`(\w+)`", beyond)) == {name for name, kind in PE_KINDS.items() if not kind.paper}
