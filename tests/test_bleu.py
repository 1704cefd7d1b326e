"""The paper's tokenized BLEU (tensor2tensor's get_ende_bleu.sh) by hand, and `aiayn score`."""

import json
import math

import pytest
import sacrebleu

from aiayn.cli import main
from aiayn.lightning_modules.run.bleu import bleu, paper_tokenize, split_compounds, tokenized_bleu

HYP = "Das Kaffee-Haus ist alt."
REF = "Das Kaffee-Haus ist sehr alt."


def test_moses_tokenizes_first_then_compounds_are_split():
    assert paper_tokenize(HYP) == "Das Kaffee ##AT##-##AT## Haus ist alt ."
    assert (
        paper_tokenize('Er sagt: "Rich-Text & mehr".') == "Er sagt : &quot; Rich ##AT##-##AT## Text &amp; mehr &quot; ."
    )


def test_tokenized_bleu_by_hand_where_raw_splitting_differs():
    # Tokenize, then split: hyp `Das Kaffee ##AT##-##AT## Haus ist alt .` (7 tokens), ref the same with `sehr`
    # before `alt` (8). Matches: 1-grams 7/7, 2-grams 5/6, 3-grams 3/5, 4-grams 2/4 (every n-gram across
    # `ist alt` misses); brevity penalty exp(1 - 8/7).
    want = 100 * math.exp(1 - 8 / 7) * (7 / 7 * 5 / 6 * 3 / 5 * 2 / 4) ** 0.25
    assert want == pytest.approx(61.2975, abs=1e-4)
    assert tokenized_bleu([HYP], [REF]) == pytest.approx(want, abs=1e-9)
    # The old way, splitting raw text and letting 13a tokenize: 13a cuts each ##AT##-##AT## into 11 tokens
    # (`# # AT # # - # # AT # #`) that match trivially: hyp 17 tokens, ref 18; 1-grams 17/17, 2-grams 15/16,
    # 3-grams 13/15, 4-grams 12/14.
    raw = sacrebleu.corpus_bleu([split_compounds(HYP)], [[split_compounds(REF)]]).score
    assert raw == pytest.approx(100 * math.exp(1 - 18 / 17) * (15 / 16 * 13 / 15 * 12 / 14) ** 0.25, abs=1e-9)
    assert raw - want > 24  # 86.13 against 61.30


def test_tokenized_bleu_is_zero_when_a_precision_is_zero_as_multi_bleu():
    # 4-gram precision 0/2 (`und` against `oder`): multi-bleu.perl gives 0; sacreBLEU's default smoothing would not
    assert tokenized_bleu(["ein Hund und eine Katze"], ["ein Hund oder eine Katze"]) == 0.0
    assert sacrebleu.corpus_bleu(["ein Hund und eine Katze"], [["ein Hund oder eine Katze"]]).score > 10


def test_bleu_names_both_numbers():
    result = bleu([HYP], [REF])
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert "Moses tokenizer -l de" in result["tok_bleu_label"] and "##AT##-##AT##" in result["tok_bleu_label"]


def test_score_command_prints_json(tmp_path, capsys):
    (tmp_path / "hyp").write_text(f"{HYP}\nEin Hund läuft über die Wiese.\n", encoding="utf-8")
    (tmp_path / "ref").write_text(f"{REF}\nEin Hund läuft über die grüne Wiese.\n", encoding="utf-8")
    assert main(["score", "--hyp", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    hyps = [HYP, "Ein Hund läuft über die Wiese."]
    refs = [REF, "Ein Hund läuft über die grüne Wiese."]
    assert out == {**bleu(hyps, refs), "n_sentences": 2}
    assert {"bleu", "bleu_signature", "tok_bleu", "tok_bleu_label"} <= set(out)
    assert main(["score", "--hyp", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref")]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith(f"BLEU {out['bleu']:.2f} (nrefs:1") and text[1].startswith(
        f"tokenized BLEU {out['tok_bleu']:.2f} (tokenized BLEU as tensor2tensor"
    )


@pytest.mark.parametrize(
    "case, message",
    [
        ("lengths", "has 1 lines and --ref"),
        ("missing", "cannot read --ref"),
        ("utf8", "line 1 is not valid UTF-8"),
    ],
)
def test_score_errors_are_one_line_exit_2(case, message, tmp_path, capsys):
    hyp, ref = tmp_path / "hyp", tmp_path / "ref"
    hyp.write_text("a b c d\n")
    ref.write_text("a b c d\na b\n")
    if case == "missing":
        ref.unlink()
    if case == "utf8":
        hyp.write_bytes(b"\xff\xfe\n")
    assert main(["score", "--hyp", str(hyp), "--ref", str(ref)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn: error: ") and message in err and err.count("\n") == 1
