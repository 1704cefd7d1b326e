"""Out of the island: checkpoints load without running code, and a trained model exported to Hugging Face
(`MarianMTModel` + `MarianTokenizer`) and CTranslate2 computes what aiayn computes."""

import json
import os
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import checkpoint_of

from aiayn.cli import main
from aiayn.lightning_modules.transformer.model import BOS, EOS, PAD, UNK, Transformer, TransformerConfig, sinusoid_table
from aiayn.lightning_modules.use.checkpoints import run_config


class Planted:
    """What a shared checkpoint could hold: unpickling it calls Path.touch (any callable would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_holding_a_pickled_object_is_refused_in_one_line_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    ckpt = checkpoint_of(state_dict={}, planted=Planted(marker))
    torch.save(ckpt, tmp_path / "shared.ckpt")
    torch.load(tmp_path / "shared.ckpt", weights_only=False)  # the file does what it says: loading it runs code
    assert marker.is_file()
    marker.unlink()

    (tmp_path / "in.en").write_text("The dog sees the cat.\n")
    argv = [
        "translate",
        "--ckpt",
        str(tmp_path / "shared.ckpt"),
        "--input",
        str(tmp_path / "in.en"),
        "--output",
        str(tmp_path / "out.de"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"aiayn: error: checkpoint {tmp_path}/shared.ckpt holds a pickled Python object (getattr), which "
        "could run code when loaded; aiayn loads tensors and plain data only: use a checkpoint that aiayn "
        "wrote\n"
    )
    assert not marker.exists() and sorted(os.listdir(tmp_path)) == ["in.en", "shared.ckpt"]


def test_a_run_does_not_resume_from_a_planted_checkpoint(tmp_path):
    from aiayn.common.errors import UserError
    from aiayn.lightning_modules.run.rundir import RunDir

    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    marker = tmp_path / "code-ran"
    torch.save({"global_step": 7, "planted": Planted(marker)}, run.checkpoints / "last.ckpt")
    with pytest.raises(UserError, match=r"^cannot resume from checkpoint .*last\.ckpt holds a pickled Python object"):
        run.resume_checkpoint()
    assert not marker.exists()
    torch.save({"global_step": 7}, run.checkpoints / "last.ckpt")  # plain data resumes as before
    assert run.resume_checkpoint() == run.checkpoints / "last.ckpt"


# ---- a trained run, exported


@pytest.fixture(scope="module")
def trained(cache, tmp_path_factory):
    """A small base run (N=2, d_model 32, 150 steps: some translations end, some run to the length limit) and
    dev sentences. One thread: on a busy 2-core machine two threads per process cost 5x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("runs")
    argv = [
        *"train --row base --preset tiny --out".split(),
        str(out),
        *"--max-steps 150 --ckpt-every 75 --val-bleu-sentences 0 --val-every 1000 --eval-subset 4".split(),
        *"--no-progress --accelerator cpu --set".split(),
        "N=2 d_model=32 h=4 d_ff=64",
    ]
    assert main(argv) == 0
    from aiayn.lightning_modules.data.corpora import CorpusRef, read_parallel, resolve_corpus

    src, ref = read_parallel(resolve_corpus(CorpusRef.parse("synthetic"), cache_dir=cache), "dev")
    yield out / "tiny" / "synthetic" / "base" / "seed0", src[:SENTENCES], ref[:SENTENCES]
    torch.set_num_threads(threads)


SENTENCES = 60
LOGIT_ATOL = 1e-4  # fp32; measured: about 5e-6 on logits of magnitude 10


@pytest.fixture(scope="module")
def hf_dir(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "hf"
    assert main(["export", "--run", str(trained[0]), "--format", "hf", "--out", str(out)]) == 0
    return out


def hf_translate(model, tokenizer, sentences: list[str], **generate) -> tuple[list[list[int]], list[str]]:
    """Transformers' generate over sentences batched by source length (its length limit is one per batch, aiayn's
    each sentence's length + 50), sources encoded by the export's tokenizer's defaults (with </s>, as aiayn trains):
    token ids (without <s>, </s>, <pad>) and texts, per sentence."""
    groups = defaultdict(list)
    for i, s in enumerate(sentences):
        groups[len(tokenizer(s).input_ids)].append(i)
    ids, texts = [[] for _ in sentences], [""] * len(sentences)
    for n, rows in groups.items():
        batch = tokenizer([sentences[i] for i in rows], padding=True, return_tensors="pt")  # its defaults
        out = model.generate(**batch, max_length=n + 52, **generate)  # + 50, + the final </s>, + the start <s>
        for i, row, text in zip(rows, out.tolist(), tokenizer.batch_decode(out, skip_special_tokens=True)):
            ids[i], texts[i] = [t for t in row if t not in (PAD, BOS, EOS)], text
    return ids, texts


def test_the_hf_export_loads_with_transformers_and_computes_aiayns_logits(trained, hf_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianMTModel

    from aiayn import Translator

    run, src, ref = trained
    ours = Translator.from_run(run, device="cpu")
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval(), AutoTokenizer.from_pretrained(hf_dir)
    assert isinstance(model, MarianMTModel)
    assert sorted(p.name for p in hf_dir.iterdir()) == [
        "README.md",
        "aiayn.json",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "source.spm",
        "target.spm",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
    c = model.config
    assert (
        c.d_model,
        c.encoder_layers,
        c.decoder_layers,
        c.encoder_attention_heads,
        c.decoder_attention_heads,
        c.encoder_ffn_dim,
        c.decoder_ffn_dim,
        c.vocab_size,
        c.max_position_embeddings,
    ) == (32, 2, 2, 4, 4, 64, 64, 1000, 512)
    assert (
        c.pad_token_id,
        c.eos_token_id,
        c.decoder_start_token_id,
        c.activation_function,
        c.scale_embedding,
        c.share_encoder_decoder_embeddings,
        c.tie_word_embeddings,
    ) == (PAD, EOS, BOS, "relu", True, True, True)
    g = model.generation_config
    assert (g.num_beams, g.length_penalty, g.early_stopping, g.forced_eos_token_id, sorted(g.suppress_tokens)) == (
        4,
        0.6,
        True,
        EOS,
        [PAD, UNK, BOS],
    )
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()  # one matrix, as ours

    # our token ids with the tokenizer's defaults: </s> appended, as aiayn trains (and as
    # MarianTokenizer does), on sources and references alike; decoded as SentencePiece decodes
    assert tokenizer(src).input_ids == ours.encode(src) and tokenizer(ref).input_ids == ours.encode(ref)
    assert all(x[-1] == EOS for x in ours.encode(src))
    assert [tokenizer.decode(x, skip_special_tokens=True) for x in ours.encode(ref)] == [
        ours.sp.decode(x) for x in ours.encode(ref)
    ]

    batch = tokenizer(src, padding=True, return_tensors="pt")
    target = tokenizer(text_target=ref, padding=True, return_tensors="pt").input_ids
    tgt_in = torch.cat([torch.full((len(ref), 1), BOS), target], dim=1)  # teacher forcing, as in training
    with torch.no_grad():
        expected = ours.model(batch.input_ids, tgt_in)
        got = model(**batch, decoder_input_ids=tgt_in).logits
    real = tgt_in != PAD
    torch.testing.assert_close(got[real], expected[real], atol=LOGIT_ATOL, rtol=0)


def test_the_hf_export_translates_as_aiayn(trained, hf_dir):
    """The same search: greedy gives aiayn's translations, and so does beam search ranking by log-probability
    alone (α = 0) for every sentence that ends before the length limit. Where they differ, by design: at the
    limit Transformers' forced </s> is free and aiayn's costs its log-probability (fairseq's rule), which ranks
    the finished hypotheses otherwise; with the paper's α = 0.6 Transformers divides by |Y|^α and aiayn by GNMT's
    ((5 + |Y|) / 6)^α, which ranks hypotheses of different lengths otherwise. Greedy may differ only where two
    tokens tie within float rounding (the logits agree to LOGIT_ATOL, not bit for bit)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from aiayn import Translator

    run, src, _ = trained
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval(), AutoTokenizer.from_pretrained(hf_dir)
    ours = Translator.from_run(run, device="cpu")
    limits = [len(x) + 50 for x in ours.encode(src)]

    expected = ours.translate_ids(src, beam=1)
    got, texts = hf_translate(model, tokenizer, src, num_beams=1)
    assert texts == [ours.sp.decode(x) for x in got]  # the same detokenization
    for i in (i for i in range(len(src)) if got[i] != expected[i]):
        a, b = got[i] + [EOS], expected[i] + [EOS]
        at = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
        src_ids = torch.tensor([ours.encode([src[i]])[0]])
        with torch.no_grad():
            logits = ours.model(src_ids, torch.tensor([[BOS, *b[:at]]]))[0, -1]
        assert abs(float(logits[a[at]] - logits[b[at]])) < LOGIT_ATOL, f"sentence {i} differs at token {at}"
    ended = [i for i in range(len(src)) if len(expected[i]) < limits[i]]
    assert 0.3 * len(src) < len(ended) < len(src)  # some end by themselves, some run to the length limit

    expected = ours.translate_ids(src, alpha=0.0)
    got, _ = hf_translate(model, tokenizer, src, length_penalty=0.0)
    ended = [i for i in range(len(src)) if max(len(expected[i]), len(got[i])) < limits[i]]
    assert [got[i] for i in ended] == [expected[i] for i in ended] and len(ended) > 0.3 * len(src)

    expected = ours.translate_ids(src)  # the paper's α = 0.6: the exported generation_config's defaults
    got, _ = hf_translate(model, tokenizer, src)
    same = [i for i in range(len(src)) if got[i] == expected[i]]
    assert len(same) >= 0.8 * len(src), f"{len(same)} of {len(src)} identical"


def test_marian_tokenizer_loads_the_export_as_it_loads_helsinki_nlps(trained, hf_dir):
    """The export is a Marian model, so MarianTokenizer must load it (it raised TypeError: no source.spm).
    Aiayn trains sources ending with </s>, as Marian does, so MarianTokenizer's default call encodes
    exactly aiayn's source ids and gives aiayn's greedy translations; the README says so."""
    from transformers import AutoModelForSeq2SeqLM, MarianTokenizer

    from aiayn import Translator

    run, src, ref = trained
    ours = Translator.from_run(run, device="cpu")
    marian = MarianTokenizer.from_pretrained(hf_dir)
    assert ours.source_eos and all(x[-1] == EOS for x in ours.encode(src))
    assert marian(src).input_ids == ours.encode(src)  # its default call: aiayn's ids, </s> and all
    assert marian.batch_decode(ours.encode(ref), skip_special_tokens=True) == [
        ours.sp.decode(x) for x in ours.encode(ref)
    ]
    model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    few = src[:12]
    expected = ours.translate_ids(few, beam=1)
    got = []
    for sentence in few:
        batch = marian([sentence], return_tensors="pt")
        out = model.generate(**batch, num_beams=1, max_length=batch.input_ids.shape[1] + 52)
        got.append([t for t in out[0].tolist() if t not in (PAD, BOS, EOS)])
    assert sum(g == e for g, e in zip(got, expected)) >= 11, "MarianTokenizer's ids give aiayn's greedy translations"
    card = (hf_dir / "README.md").read_text()
    assert "MarianTokenizer.from_pretrained` loads this directory too" in card and "add_special_tokens" not in card


def test_the_model_card_carries_hub_metadata_the_row_and_the_bleu_signature(trained, hf_dir):
    import yaml

    text = (hf_dir / "README.md").read_text(encoding="utf-8")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["language"] == ["en", "de"] and front["license"] == "mit" and front["pipeline_tag"] == "translation"
    assert front["library_name"] == "transformers" and "translation" in front["tags"] and front["metrics"] == ["bleu"]
    metrics = json.loads((trained[0] / "metrics.json").read_text())
    (result,) = front["model-index"][0]["results"]
    (bleu,) = result["metrics"]
    assert (bleu["type"], bleu["value"], bleu["config"]) == ("bleu", metrics["dev_bleu"], metrics["dev_bleu_signature"])
    assert "**Table 3 row base** at aiayn's preset `tiny`" in text and "overridden: N=2 d_model=32" in text
    assert 'pipeline("translation")' in text
    # neither the pipeline's tokenizer (tokenizer.json) nor MarianTokenizer needs a flag for a model trained with </s>
    flat = " ".join(text.split())
    assert "its default call gives aiayn's translations as well" in flat and "add_special_tokens" not in text


def test_push_to_hub_uploads_the_export_through_huggingface_hub(trained, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    calls = []

    class FakeApi:  # the Hub cannot be reached here: the test stops at the upload call
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))

        def upload_folder(self, **kw):
            calls.append(("upload_folder", kw["repo_id"], sorted(os.listdir(kw["folder_path"]))))
            return type("Info", (), {"commit_url": "https://huggingface.co/me/m/commit/1"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    out = tmp_path / "hf"
    argv = [
        "export",
        "--run",
        str(trained[0]),
        *"--format hf --out".split(),
        str(out),
        *"--push-to-hub me/m --private".split(),
    ]
    assert main(argv) == 0
    assert calls[0] == ("create_repo", "me/m", {"repo_type": "model", "private": True, "exist_ok": True})
    assert calls[1] == ("upload_folder", "me/m", sorted(os.listdir(out))) and "tokenizer.json" in calls[1][2]

    class Refused(FakeApi):
        def create_repo(self, repo_id, **kw):
            raise OSError("401 Client Error: Unauthorized for url https://huggingface.co/api/repos/create")

    monkeypatch.setattr(huggingface_hub, "HfApi", Refused)
    capsys.readouterr()
    assert main([*argv[:-4], str(tmp_path / "hf2"), "--push-to-hub", "me/m"]) == 2
    lines = capsys.readouterr().err.splitlines()  # transformers' progress of the export, done before the push, then
    errors = [line for line in lines if "aiayn: error" in line]  # the one line of the failed push
    assert errors == lines[-1:] and errors[0].startswith("aiayn: error: could not push") and "401 Client" in errors[0]
    assert (tmp_path / "hf2" / "model.safetensors").is_file()  # the export itself is there to push again


def test_every_parameter_lands_in_its_place_in_marian():
    """Every weight, bias and LayerNorm parameter random: a model trained for a moment keeps its LayerNorms near
    1 and its biases near 0, which would hide one mapped to the wrong place or left unpermuted."""
    from aiayn.lightning_modules.use.export import to_marian

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(N=2, d_model=16, d_ff=24, h=4, vocab_size=40, max_len=32)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    hf = to_marian(model)
    src, tgt = torch.randint(4, 40, (3, 9)), torch.randint(4, 40, (3, 7))
    src[0, 6:], tgt[:, 0], tgt[1, 5:] = PAD, BOS, PAD
    with torch.no_grad():
        expected = model(src, tgt)
        got = hf(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, expected, atol=LOGIT_ATOL, rtol=0)


def test_the_permutation_is_read_off_the_two_position_tables():
    from transformers import MarianMTModel

    from aiayn.lightning_modules.use.export import marian_config, sinusoid_permutation

    cfg = TransformerConfig(N=1, d_model=16, d_ff=8, h=2, vocab_size=10, max_len=64)
    theirs = MarianMTModel(marian_config(cfg)).model.encoder.embed_positions.weight.detach()
    ours = sinusoid_table(64, 16)
    # Marian puts the sines of frequencies 0..7 first, then their cosines; §3.5 interleaves them
    assert sinusoid_permutation(ours, theirs).tolist() == [*range(0, 16, 2), *range(1, 16, 2)]
    assert sinusoid_permutation(ours, ours).tolist() == list(range(16))
    twice = theirs.clone()
    twice[:, 1] = twice[:, 0]
    with pytest.raises(ValueError, match="is not a permutation of the paper's"):
        sinusoid_permutation(ours, twice)
    off = theirs.clone()
    off[10, 3] += 1e-3
    with pytest.raises(ValueError, match="differs from the paper's permuted by up to 0.001"):
        sinusoid_permutation(ours, off)


def test_ctranslate2_round_trip(trained, tmp_path, capsys):
    """`aiayn export --format ctranslate2`, then `aiayn translate --ct2` and `aiayn eval --ct2`: CTranslate2 runs
    the same search as Transformers does over the same weights (see the test above for what differs from aiayn's
    and why), with each sentence's own length limit; its perplexity of the references is ours."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install 'aiayn[ctranslate2]'")
    run, src, ref = trained
    f32, int8 = tmp_path / "ct2", tmp_path / "ct2-int8"
    assert main(["export", "--run", str(run), "--format", "ctranslate2", "--out", str(f32)]) == 0
    assert (
        main(["export", "--run", str(run), "--format", "ctranslate2", "--quantization", "int8", "--out", str(int8)])
        == 0
    )
    assert sorted(p.name for p in f32.iterdir()) == [
        "README.md",
        "aiayn.json",
        "config.json",
        "model.bin",
        "shared_vocabulary.json",
        "tokenizer.model",
    ]
    assert json.loads((int8 / "aiayn.json").read_text())["quantization"] == "int8"
    (tmp_path / "src.en").write_text("\n".join([src[0], "", *src[1:]]) + "\n")  # a blank line stays blank
    (tmp_path / "ref.de").write_text("\n".join([ref[0], "", *ref[1:]]) + "\n")
    capsys.readouterr()

    def translate(*argv) -> list[str]:
        assert main(["translate", *argv, "--input", str(tmp_path / "src.en"), "--device", "cpu"]) == 0
        return capsys.readouterr().out.splitlines()

    for settings in (["--beam", "1"], ["--alpha", "0"]):
        ours, theirs = translate("--run", str(run), *settings), translate("--ct2", str(f32), *settings)
        assert theirs[1] == "" and len(theirs) == len(src) + 1
        same = sum(a == b for a, b in zip(ours, theirs))
        assert same >= (1.0 if settings[0] == "--beam" else 0.8) * len(theirs), f"{settings}: {same} of {len(theirs)}"
    fast = translate("--ct2", str(f32), "--ct2-batching", "sorted")  # a batch's limit is its longest source's
    assert fast[1] == "" and len(fast) == len(src) + 1
    paper = sum(a == b for a, b in zip(translate("--run", str(run)), translate("--ct2", str(f32))))
    assert paper >= 0.8 * (len(src) + 1)
    assert len(translate("--ct2", str(int8))) == len(src) + 1

    def evaluate(*argv) -> dict:
        assert main(["eval", *argv, "--src", str(tmp_path / "src.en"), "--ref", str(tmp_path / "ref.de")]) == 0
        return json.loads(capsys.readouterr().out)

    ours, theirs, quantized = evaluate("--run", str(run)), evaluate("--ct2", str(f32)), evaluate("--ct2", str(int8))
    assert theirs["ppl"] == pytest.approx(ours["ppl"], rel=1e-4) and theirs["params"] == ours["params"]
    assert (theirs["engine"], theirs["quantization"], quantized["quantization"]) == ("ctranslate2", "float32", "int8")
    assert quantized["ppl"] == pytest.approx(ours["ppl"], rel=0.05)  # int8 weights: close, not equal


def variant_checkpoint(run: Path, where: Path, **change) -> Path:
    """The run's last checkpoint with its model config changed (and weights of that shape): a row Marian
    cannot express, as `aiayn train --set` would have made it."""
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    config = run_config(ckpt, "last.ckpt")
    config = replace(config, spec=config.spec.with_overrides(change))
    ckpt["aiayn"] = {**ckpt["aiayn"], "config": config.to_dict()}
    ckpt["state_dict"] = {f"model.{k}": v for k, v in Transformer(config.spec.model).state_dict().items()}
    path = where / f"{'-'.join(f'{k}={v}' for k, v in change.items())}.ckpt"
    torch.save(ckpt, path)
    return path


def bad_export_cases(run: Path, tmp: Path) -> dict:
    """argv, then the exact error line, for each bad input of `aiayn export`."""
    (tmp / "untrained" / "checkpoints").mkdir(parents=True)
    (tmp / "full").mkdir()
    (tmp / "full" / "keep.txt").write_text("mine\n")
    (tmp / "a-file").write_text("not a directory\n")
    fix = "export a row with the paper's sinusoids, post-LN and d_k = d_v = d_model / h"
    cases = {
        "a run directory that never finished a checkpoint": (
            ["--run", f"{tmp}/untrained", "--out", f"{tmp}/out"],
            f"run directory {tmp}/untrained has no checkpoints/last.ckpt; train it first or pass --ckpt",
        ),
        "a non-empty --out": (
            ["--run", str(run), "--out", f"{tmp}/full"],
            f"--out {tmp}/full is not empty; pass a new or empty directory (nothing is overwritten)",
        ),
        "--out is a file": (
            ["--run", str(run), "--out", f"{tmp}/a-file"],
            f"--out {tmp}/a-file exists and is not a directory; pass a new directory",
        ),
        "--quantization without ctranslate2": (
            ["--run", str(run), "--quantization", "int8", "--out", f"{tmp}/out"],
            "--quantization is CTranslate2's; the hf export is float32: drop it or pass --format ctranslate2",
        ),
        "no --out": (["--run", str(run)], "pass --out DIR, the directory to write"),
    }
    rows = {
        "learned positions (row E)": (
            {"pe": "learned"},
            "pe=learned (a learned embedding per position (Table 3 row E)), where Marian has pe=sinusoid only",
        ),
        "rotary positions": (
            {"pe": "rope"},
            "pe=rope (rotary position embedding in self-attention (Su et al., "
            "2021)), where Marian has pe=sinusoid only",
        ),
        "no positions": (
            {"pe": "none"},
            "pe=none (no positional information at all), where Marian has pe=sinusoid only",
        ),
        "pre-LN": (
            {"norm_first": True},
            "norm_first=pre (pre-LN residuals (a deviation; paper: post-LN)), where "
            "Marian has the paper's norm_first=post only",
        ),
        "d_k != d_model / h (row B)": (
            {"d_k": 4},
            "d_k=4 d_v=8 with h=4 and d_model=32, where Marian's heads are d_model / h = 8 wide",
        ),
    }
    for name, (change, reason) in rows.items():
        path = variant_checkpoint(run, tmp, **change)
        for fmt in ("hf", "ctranslate2"):
            cases[f"{name}, {fmt}"] = (
                ["--ckpt", str(path), "--format", fmt, "--out", f"{tmp}/out"],
                f"the model of {path} cannot be exported to {fmt}: {reason}; {fix}",
            )
    return cases


def test_bad_export_input_is_one_line_exit_2_and_writes_nothing(trained, tmp_path, capsys):
    run = trained[0]
    for name, (argv, message) in bad_export_cases(run, tmp_path).items():
        before = sorted(tmp_path.rglob("*"))
        assert main(["export", *argv]) == 2, name
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"aiayn: error: {message}\n"), name
        assert sorted(tmp_path.rglob("*")) == before, name  # nothing written, no temporary directory left
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine\n"


def test_a_missing_package_names_the_extra_to_install(trained, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    argv = ["export", "--run", str(trained[0]), "--format", "ctranslate2", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "aiayn: error: aiayn export --format ctranslate2 needs the Python package ctranslate2, which is not "
        "installed; install it with pip install 'aiayn[ctranslate2]'\n"
    )
    assert main(["translate", "--ct2", str(tmp_path), "--input", str(tmp_path / "none.en")]) == 2
    assert capsys.readouterr().err.startswith("aiayn: error: cannot read input")  # read before the model loads
    assert not (tmp_path / "out").exists()


def test_an_export_that_fails_half_way_leaves_nothing(trained, tmp_path, monkeypatch):
    from aiayn.lightning_modules.use import export

    def broken(model, proto, where, **kw):
        (where / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "write_hf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        main(["export", "--run", str(trained[0]), "--out", str(tmp_path / "out")])
    assert os.listdir(tmp_path) == []  # neither OUT nor the temporary directory beside it


def test_an_averaged_export_and_todays_checkpoints_load_weights_only(trained, tmp_path):
    """`--average K` exports the mean of the last K checkpoints (the averaged logits); every checkpoint a run
    writes, and an averaged one, is tensors and plain data: torch loads it with weights_only=True."""
    from transformers import MarianMTModel

    from aiayn import Translator

    run, src, _ = trained
    assert main(["export", "--run", str(run), "--average", "2", "--out", str(tmp_path / "hf")]) == 0
    record = json.loads((tmp_path / "hf" / "aiayn.json").read_text())
    assert [Path(p).name for p in record["checkpoints"]] == ["step0000075.ckpt", "step0000150.ckpt"]
    averaged = Translator.from_run(run, average=2, device="cpu")
    src_ids = torch.tensor([averaged.encode(src[:1])[0]])
    tgt = torch.tensor([[BOS, *averaged.encode(src[1:2])[0]]])
    with torch.no_grad():
        got = MarianMTModel.from_pretrained(tmp_path / "hf")(input_ids=src_ids, decoder_input_ids=tgt).logits
        torch.testing.assert_close(got, averaged.model(src_ids, tgt), atol=LOGIT_ATOL, rtol=0)
    assert main(["average", "--run", str(run), "--last", "2", "--out", str(tmp_path / "avg.ckpt")]) == 0
    for path in [*sorted((run / "checkpoints").glob("*.ckpt")), tmp_path / "avg.ckpt"]:
        assert torch.load(path, weights_only=True)["state_dict"], path


def test_bad_ct2_input_is_one_line_exit_2(trained, hf_dir, tmp_path, capsys):
    run = trained[0]
    (tmp_path / "in.en").write_text("The dog sees the cat.\n")
    cases = {
        "an hf export": (
            ["--ct2", str(hf_dir)],
            f"{hf_dir} is an export of format hf, not ctranslate2; pass one "
            "that `aiayn export --format ctranslate2` wrote",
        ),
        "not an export": (
            ["--ct2", str(run)],
            f"{run} has no readable aiayn.json: it is not an aiayn export; write "
            "one with `aiayn export --format ctranslate2`",
        ),
        "no such directory": (
            ["--ct2", f"{tmp_path}/none"],
            f"{tmp_path}/none is not a directory; pass the directory that `aiayn export --format ctranslate2` wrote",
        ),
        "two models": (
            ["--ct2", str(hf_dir), "--run", str(run)],
            "pass exactly one of --run DIR (a run directory), "
            "--ckpt FILE (a checkpoint) and --ct2 DIR (a CTranslate2 export)",
        ),
        "--average with --ct2": (
            ["--ct2", str(hf_dir), "--average", "2"],
            "--average K takes the last K checkpoints of a run; pass --run DIR instead of --ct2",
        ),
    }
    for name, (argv, message) in cases.items():
        assert main(["translate", *argv, "--input", str(tmp_path / "in.en")]) == 2, name
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"aiayn: error: {message}\n"), name


def test_a_model_trained_without_a_source_eos_exports_a_tokenizer_without_one(trained, tmp_path):
    """Older runs (the committed evidence tables among them) trained sources without </s> and record none
    (`data.source_eos` absent): aiayn encodes their sources without it, the fast tokenizer appends none, and the card
    tells MarianTokenizer's users the flag that drops its </s>."""
    from transformers import AutoTokenizer, MarianTokenizer

    from aiayn import Translator

    run, src, _ = trained
    old = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert old["aiayn"]["config"]["data"].pop("source_eos") is True  # as an earlier aiayn's checkpoint: none
    ckpt = tmp_path / "old.ckpt"
    torch.save(old, ckpt)
    ours = Translator.from_checkpoint(ckpt, device="cpu")
    texts = src[:5]
    assert not ours.source_eos and all(x[-1] != EOS for x in ours.encode(texts))
    out = tmp_path / "hf"
    assert main(["export", "--ckpt", str(ckpt), "--format", "hf", "--out", str(out)]) == 0
    assert AutoTokenizer.from_pretrained(out)(texts).input_ids == ours.encode(texts)
    marian = MarianTokenizer.from_pretrained(out)
    assert marian(texts, add_special_tokens=False).input_ids == ours.encode(texts)
    assert marian(texts).input_ids == [x + [EOS] for x in ours.encode(texts)]
    assert "add_special_tokens=False" in (out / "README.md").read_text()
