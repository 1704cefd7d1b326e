"""Self-contained runs: a run directory (or one checkpoint) copied elsewhere translates and evaluates
with no corpus and no cache (`aiayn translate`, `aiayn eval`, `Translator`), and the bad input of
translation is one line, exit 2, nothing written."""

import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from aiayn.cli import main
from aiayn.common.files import sha256_file
from aiayn.lightning_modules.data.corpora import CorpusRef, read_parallel, resolve_corpus

FAST = "--max-steps 3 --ckpt-every 2 --val-bleu-sentences 4 --eval-subset 4 --no-progress --accelerator cpu".split()
SENTENCES = ["The dog sees the cat.", "", "Today the small boy sleeps in the garden."]


@pytest.fixture(scope="module")
def trained(cache, tmp_path_factory):
    """A tiny base run (3 steps, a checkpoint every 2: the final step is not one of them) and the first 4 dev
    sentences its final evaluation scored."""
    out = tmp_path_factory.mktemp("runs")
    assert main(["train", "--row", "base", "--preset", "tiny", "--out", str(out), *FAST]) == 0
    run = out / "tiny" / "synthetic" / "base" / "seed0"
    # the model the run ended with is checkpointed: as last.ckpt and as the newest periodic checkpoint
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3
    assert sorted(p.name for p in (run / "checkpoints").glob("step*.ckpt")) == ["step0000002.ckpt", "step0000003.ckpt"]
    src, ref = read_parallel(resolve_corpus(CorpusRef.parse("synthetic"), cache_dir=cache), "dev")
    files = tmp_path_factory.mktemp("dev")
    (files / "dev.en").write_text("\n".join(src[:4]) + "\n")
    (files / "dev.de").write_text("\n".join(ref[:4]) + "\n")
    return run, files


@pytest.fixture
def no_cache(cache, tmp_path, monkeypatch):
    """The corpus and the cache out of reach: AIAYN_CACHE points at an empty place and the module's
    cache (which holds the synthetic corpus and the tokenizer) is moved away for the test."""
    hidden = cache.with_name(cache.name + "-hidden")
    cache.rename(hidden)
    empty = tmp_path / "empty-cache"
    monkeypatch.setenv("AIAYN_CACHE", str(empty))
    yield empty
    hidden.rename(cache)


def stdin(monkeypatch, text: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text)))


def test_a_copied_run_translates_and_evaluates_without_corpus_or_cache(
    trained, tmp_path, no_cache, monkeypatch, capsys
):
    run, dev = trained
    copy = tmp_path / "elsewhere" / "my-model"
    shutil.copytree(run, copy)
    assert (copy / "tokenizer.model").is_file() and json.loads((copy / "config.json").read_text())["tokenizer"][
        "sha256"
    ] == sha256_file(copy / "tokenizer.model")

    stdin(monkeypatch, ("\n".join(SENTENCES) + "\n").encode())
    assert main(["translate", "--run", str(copy)]) == 0  # stdin to stdout
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[1] == "" and out[0] and out[2]  # a blank line stays a blank line

    src, hyp = tmp_path / "in.en", tmp_path / "out.de"
    src.write_text("\n".join(SENTENCES) + "\n")
    assert main(["translate", "--run", str(copy), "--input", str(src), "--output", str(hyp), "--device", "cpu"]) == 0
    assert hyp.read_text().splitlines() == out

    from aiayn import Translator  # the Python API: the same translations

    assert Translator.from_run(copy, device="cpu").translate(SENTENCES) == out

    assert main(["eval", "--run", str(copy), "--src", str(dev / "dev.en"), "--ref", str(dev / "dev.de")]) == 0
    result = json.loads(capsys.readouterr().out)
    metrics = json.loads((copy / "metrics.json").read_text())  # the run's own final evaluation, same 4 sentences
    assert result["n_sentences"] == 4 and round(result["bleu"], 2) == metrics["dev_bleu"]
    assert round(result["tok_bleu"], 2) == metrics["dev_tok_bleu"]
    assert result["ppl"] == pytest.approx(metrics["dev_ppl"], rel=1e-4)
    assert result["bleu_signature"] == metrics["dev_bleu_signature"] and "tokenized BLEU" in result["tok_bleu_label"]
    assert result["checkpoints"] == [str(copy / "checkpoints" / "last.ckpt")] and result["device"] == "cpu"
    assert not no_cache.exists()  # nothing was prepared: no corpus, no tokenizer training, no encoding


def test_an_averaged_checkpoint_alone_translates_and_eval_averages(trained, tmp_path, no_cache, capsys):
    run, dev = trained
    alone = tmp_path / "alone" / "avg.ckpt"
    assert main(["average", "--run", str(run), "--last", "2", "--out", str(alone)]) == 0
    capsys.readouterr()
    ckpt = torch.load(alone, weights_only=False)
    assert ckpt["aiayn"]["tokenizer_sha256"] == sha256_file(run / "tokenizer.model") and "optimizer_states" not in ckpt
    src = tmp_path / "in.en"
    src.write_text("\n".join(SENTENCES) + "\n")
    assert main(["translate", "--ckpt", str(alone), "--input", str(src), "--beam", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    argv = ["eval", "--run", str(run), "--average", "2", "--src", str(dev / "dev.en"), "--ref", str(dev / "dev.de")]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert [Path(p).name for p in result["checkpoints"]] == ["step0000002.ckpt", "step0000003.ckpt"]
    assert main(["eval", "--ckpt", str(alone), "--src", str(dev / "dev.en"), "--ref", str(dev / "dev.de")]) == 0
    assert json.loads(capsys.readouterr().out)["bleu"] == result["bleu"]  # the file and the in-memory mean agree


def test_batches_follow_the_token_budget_and_the_output_keeps_the_input_order(trained):
    from aiayn.lightning_modules.use.translate import Translator

    run, _ = trained
    sentences = [" ".join(["the dog"] * n) + " ." for n in (1, 9, 3, 12, 2, 5)] + ["", "The cat sleeps."]
    wide = Translator.from_run(run, device="cpu", beam=2, max_tokens=10_000)
    narrow = Translator.from_run(run, device="cpu", beam=2, max_tokens=30)
    lengths = [len(x) for x in narrow.encode(sentences)]
    batches = narrow._batches(lengths)
    assert sorted(i for b in batches for i in b) == [i for i, n in enumerate(lengths) if n]  # all but the blank
    assert all(len(b) * max(lengths[i] for i in b) <= 30 or len(b) == 1 for b in batches) and len(batches) > 2
    assert len(wide._batches(lengths)) == 1
    assert narrow.translate(sentences) == wide.translate(sentences)


def test_translating_and_evaluating_a_run_never_import_lightning(trained):
    """`aiayn translate` and `aiayn eval` decode with the model alone: Lightning's import (and through torchmetrics,
    transformers') was half of a one-sentence translation's 25 s on a busy CPU, spent to check `--precision auto`."""
    import subprocess

    run, dev = trained
    probe = (
        "import sys\nfrom aiayn.cli import main\n"
        f"assert main(['eval', '--run', {str(run)!r}, '--src', {str(dev / 'dev.en')!r}, "
        f"'--ref', {str(dev / 'dev.de')!r}, '--beam', '1']) == 0\n"
        f"assert main(['translate', '--run', {str(run)!r}, '--input', {str(dev / 'dev.en')!r}, "
        f"'--output', {str(dev / 'probe.de')!r}]) == 0\n"
        "print('lightning' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.stdout.split()[-1:] == ["False"], done.stdout + done.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_device_auto_is_the_cpu_here_and_cuda_is_refused_in_one_line(trained, tmp_path, capsys):
    run, dev = trained
    argv = ["eval", "--run", str(run), "--src", str(dev / "dev.en"), "--ref", str(dev / "dev.de"), "--beam", "1"]
    assert main(argv) == 0 and json.loads(capsys.readouterr().out)["device"] == "cpu"
    assert main(["translate", "--run", str(run), "--device", "cuda", "--input", str(dev / "dev.en")]) == 2
    assert (
        capsys.readouterr().err
        == "aiayn: error: --device cuda: no CUDA device is visible here; pass --device cpu or auto\n"
    )


def stripped_checkpoint(run: Path, where: Path) -> Path:
    """The run's last checkpoint with its run config but without its tokenizer: a checkpoint someone stripped."""
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    del ckpt["aiayn"]["tokenizer_model"]
    where.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, where / "old.ckpt")
    return where / "old.ckpt"


def bad_cases(run: Path, tmp: Path) -> dict:
    """argv, then the exact error line, for each bad input of translation."""
    from aiayn.lightning_modules.use.translate import Translator

    long = " ".join(["the small dog"] * 300)
    n_long = len(Translator.from_run(run, device="cpu").sp.encode(long))
    (tmp / "long.en").write_text(f"The dog.\n{long}\n")
    (tmp / "latin1.en").write_bytes("The dog.\nDer Hund läuft.\n".encode("latin-1"))
    old = stripped_checkpoint(run, tmp / "old")
    out = ["--output", f"{tmp}/out.de"]
    return {
        "a line longer than the model's maximum": (
            ["translate", "--run", str(run), "--input", f"{tmp}/long.en", *out],
            f"input line 2 has {n_long} tokens, more than the 511 of the model's 512 positions less the </s> it ends "
            "with; split it into shorter sentences",
        ),
        "non-UTF-8 input": (
            ["translate", "--run", str(run), "--input", f"{tmp}/latin1.en", *out],
            f"input {tmp}/latin1.en line 2 is not valid UTF-8 (invalid continuation byte); re-encode it as UTF-8 "
            "(e.g. iconv -t utf-8)",
        ),
        "a checkpoint without a tokenizer": (
            ["translate", "--ckpt", str(old), "--input", f"{tmp}/long.en", *out],
            f"checkpoint {old} carries no tokenizer; pass a checkpoint from a run directory's checkpoints/ (aiayn "
            "train puts the tokenizer in each)",
        ),
        "misaligned test set": (
            ["eval", "--run", str(run), "--src", f"{tmp}/long.en", "--ref", f"{tmp}/one.de"],
            "2 sources but 1 references; the files must be line-aligned (same number of lines)",
        ),
        "both --run and --ckpt": (
            ["translate", "--run", str(run), "--ckpt", str(old), "--input", f"{tmp}/long.en"],
            "pass exactly one of --run DIR (a run directory), --ckpt FILE (a checkpoint) and --ct2 DIR (a "
            "CTranslate2 export)",
        ),
        "--average with --ckpt": (
            ["eval", "--ckpt", str(old), "--average", "2", "--split", "dev"],
            "--average K takes the last K checkpoints of a run; pass --run DIR instead of --ckpt",
        ),
        "--average beyond the kept checkpoints": (
            ["eval", "--run", str(run), "--average", "9", "--split", "dev"],
            f"--average 9 asks for more checkpoints than the 2 kept in {run}; pass --average 2 or less",
        ),
    }


def test_bad_input_of_translation_is_one_line_exit_2_and_writes_nothing(trained, tmp_path, capsys, monkeypatch):
    run, _ = trained
    (tmp_path / "one.de").write_text("Der Hund.\n")
    cases = bad_cases(run, tmp_path)
    for name, (argv, message) in cases.items():
        before = sorted(p for p in tmp_path.rglob("*"))
        assert main(argv) == 2, name
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"aiayn: error: {message}\n"), name
        assert sorted(p for p in tmp_path.rglob("*")) == before, name  # no output file, nothing else
