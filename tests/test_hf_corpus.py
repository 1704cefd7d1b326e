"""`--data hf:NAME[:CONFIG]`: a Hugging Face dataset as a corpus, read where `datasets` keeps it (here: tiny datasets
saved on this machine; no network), its splits and languages mapped to ours, every mistake one line."""

import json
import random
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.common.errors import UserError
from aiayn.lightning_modules.data import corpora as C
from aiayn.lightning_modules.data import hf_corpus as H

datasets = pytest.importorskip("datasets")

pytestmark = pytest.mark.cold_cache  # tests/conftest.py: its cache holds only what these tests put there

WORDS = "the a man woman dog cat runs sits on in under red blue green small big house street park ball".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def translation(n: int, seed: int) -> dict:
    """A `translation` column as the Hub's WMT datasets have it; German: the English reversed, upper-cased."""
    return {"translation": [{"en": s, "de": " ".join(s.split()[::-1]).upper()} for s in sentences(n, seed)]}


def save(path: Path, sizes=(("train", 300), ("validation", 20), ("test", 10)), make=translation) -> Path:
    datasets.DatasetDict(
        {split: datasets.Dataset.from_dict(make(n, i)) for i, (split, n) in enumerate(sizes)}
    ).save_to_disk(path)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save(tmp_path_factory.mktemp("hf") / "tiny-ende")


FAST = [
    "--set",
    "N=1 d_model=32 d_ff=64 h=2",
    *"--vocab-size 100 --max-steps 2 --ckpt-every 1 --val-bleu-sentences 0 --eval-subset 4 --no-progress".split(),
    *"--accelerator cpu --logger csv".split(),
]


def test_a_saved_dataset_trains_evaluates_and_is_not_copied(saved, cache, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["train", "--data", f"hf:{saved}", "--out", str(out), *FAST]) == 0
    name = H.HFRef(str(saved)).dirname()
    assert name.startswith("hf-local-tiny-ende-")
    run = out / "tiny" / name / "base" / "seed0"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["data"] == f"hf:{saved}"
    assert json.loads((run / "config.json").read_text())["data"]["corpus"] == f"hf:{saved}"
    dev = datasets.load_from_disk(saved)["validation"]["translation"]
    assert (run / "dev.ref").read_text().splitlines() == [p["de"] for p in dev[:4]]  # validation is our dev
    # aiayn's cache: the tokenizer and the token ids; no text (no corpora/, no pointer: a local dataset is its own)
    assert sorted({p.relative_to(cache).parts[0] for p in cache.rglob("*") if p.is_file()}) == ["encoded", "spm"]
    german = datasets.load_from_disk(saved)["train"]["translation"][0]["de"].encode()
    assert b" " in german and not [p for p in cache.rglob("*") if p.is_file() and german in p.read_bytes()]
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--split", "test", "--beam", "1"]) == 0  # the checkpoint's corpus again
    result = json.loads(capsys.readouterr().out)
    assert (result["corpus"], result["n_sentences"]) == (f"hf:{saved}", 10)


def test_a_relative_path_is_recorded_as_an_absolute_one(saved, monkeypatch):
    monkeypatch.chdir(saved.parent)
    assert C.CorpusRef.parse("hf:./tiny-ende").name == f"hf:{saved}"
    assert C.CorpusRef.parse("hf:wmt/wmt16:de-en").name == "hf:wmt/wmt16:de-en"  # a Hub name as it is
    assert C.CorpusRef.parse("hf:wmt/wmt16:de-en").dirname == "hf-wmt--wmt16-de-en"
    assert C.CorpusRef.parse("hf:./tiny-ende") == C.CorpusRef.parse(f"hf:{saved}")


def test_the_corpus_is_parsed_once_and_its_splits_travel_with_it_to_the_data_and_the_records(saved, tmp_path):
    """The corpus is one typed value (name, folder name, source, splits): --data and --hf-splits parsed
    once, carried by the spec to the data module, recorded in config.json (its name and splits, as before) and read
    back to the same value; a sweep's key and a model card's dataset are read from it, not from its spelling."""
    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.rundir import RunConfig
    from aiayn.lightning_modules.run.spec import RunSpec
    from aiayn.lightning_modules.run.train import plan

    opts = TrainOptions(data=f"hf:{saved}", hf_splits="dev=test,test=validation", out=str(tmp_path), accelerator="cpu")
    p = plan(opts)
    corpus = C.CorpusRef(f"hf:{saved}", C.CorpusRef.parse(f"hf:{saved}").dirname, "hf", "dev=test,test=validation")
    assert p.spec.corpus == p.dm.data.corpus == p.config.data.corpus == corpus
    written = p.config.to_dict()
    assert (written["data"]["corpus"], written["data"]["splits"]) == (f"hf:{saved}", "dev=test,test=validation")
    assert RunConfig.from_dict(written).data == p.config.data
    assert RunSpec.from_dict(p.spec.to_dict()).corpus == corpus  # a sweep's resolved row keeps its splits
    assert p.run.path.parent.parent.name == corpus.dirname  # OUT/PRESET/CORPUS/ROW/seedS
    assert [C.CorpusRef.recorded(n).hub_dataset for n in ("wmt14", "hf:wmt/wmt16:de-en", f"hf:{saved}", "files")] == [
        "wmt/wmt14",
        "wmt/wmt16",
        None,
        None,
    ]


def test_splits_map_by_name_or_by_hf_splits(saved, tmp_path):
    text = C.resolve_corpus(C.CorpusRef.parse(f"hf:{saved}"), cache_dir=tmp_path)
    assert [text.splits[s][0] for s in ("train", "dev", "test")] == ["train", "validation", "test"]
    text = C.resolve_corpus(C.CorpusRef.parse(f"hf:{saved}", "dev=test,test=validation"), cache_dir=tmp_path)
    assert [text.splits[s][0] for s in ("train", "dev", "test")] == ["train", "test", "validation"]
    assert len(C.read_parallel(text, "dev")[0]) == 10
    corpus = C.CorpusRef.parse(f"hf:{saved}")
    reverse = C.resolve_corpus(corpus, cache_dir=tmp_path, src_lang="de", tgt_lang="en")  # either direction
    de, en = C.read_parallel(reverse, "test", "de", "en")
    assert [" ".join(s.split()[::-1]).upper() for s in en] == de


def test_columns_named_by_language_and_dev_named_dev(tmp_path):
    flat = lambda n, seed: {"en": sentences(n, seed), "de": [s.upper() for s in sentences(n, seed)]}
    path = save(tmp_path / "flat", (("train", 5), ("dev", 3), ("test", 2)), make=flat)
    src, tgt = C.read_parallel(C.resolve_corpus(C.CorpusRef.parse(f"hf:{path}"), cache_dir=tmp_path), "dev")
    assert tgt == [s.upper() for s in src] and len(src) == 3


def test_a_directory_of_data_files(tmp_path, monkeypatch):
    """Not saved with save_to_disk: load_dataset reads the files (into Hugging Face's cache, here in tmp_path)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    files = tmp_path / "files"
    files.mkdir()
    for split, n in (("train", 6), ("validation", 3), ("test", 2)):
        lines = [json.dumps({"translation": {"en": s, "de": s.upper()}}) for s in sentences(n, len(split))]
        (files / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    src, tgt = C.read_parallel(C.resolve_corpus(C.CorpusRef.parse(f"hf:{files}"), cache_dir=tmp_path / "aiayn"), "dev")
    assert src == sentences(3, len("validation")) and tgt == [s.upper() for s in src]


def test_arrow_text_reads_slices_and_rows_without_newlines(tmp_path, monkeypatch):
    monkeypatch.setattr(H, "SLICE", 4)
    rows = [{"en": f"line {i}\nbroken", "de": f"zeile {i}"} for i in range(10)]
    ds = datasets.Dataset.from_dict({"translation": rows})
    text = H.ArrowText(ds, "translation", "en", "x")
    assert len(text) == 10 and text[3] == "line 3 broken" and text[-1] == "line 9 broken"
    assert text[2:5] == ["line 2 broken", "line 3 broken", "line 4 broken"]
    assert list(text) == [f"line {i} broken" for i in range(10)]  # in slices of 4
    assert text.take([7, 1]) == ["line 7 broken", "line 1 broken"]


def test_the_tokenizer_sample_is_the_one_of_the_joined_text(monkeypatch):
    """Sampling source and target text without joining them picks what a sample of the joined list would."""
    import numpy as np

    from aiayn.lightning_modules.data import tokenizer as T

    src, tgt = sentences(50, 1), sentences(40, 2)
    keep = np.sort(np.random.default_rng(7).choice(90, size=30, replace=False))
    assert T._subsample(src, tgt, 30, seed=7) == [[*src, *tgt][i] for i in keep]
    ds = datasets.Dataset.from_dict({"en": src, "de": tgt + [""] * 10})
    arrow = H.ArrowText(ds, "en", None, "x"), H.ArrowText(ds.select(range(40)), "de", None, "x")
    assert T._subsample(*arrow, 30, seed=7) == T._subsample(src, tgt, 30, seed=7)


def test_a_missing_text_is_one_line(tmp_path):
    path = tmp_path / "holes"
    datasets.DatasetDict(
        {s: datasets.Dataset.from_dict({"en": ["a", None], "de": ["b", "c"]}) for s in ("train", "validation", "test")}
    ).save_to_disk(path)
    with pytest.raises(UserError, match=r"split 'train' row 1 has no 'en' text; fix the dataset"):
        C.read_parallel(C.resolve_corpus(C.CorpusRef.parse(f"hf:{path}"), cache_dir=tmp_path), "train")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--data", "hf:{saved}", "--hf-splits", "dev=newstest"],
            "Hugging Face dataset hf:{saved} has no split 'newstest' for our dev split (its splits: train, validation, "
            "test); pass --hf-splits dev=ONE_OF_THEM",
        ),
        (
            ["--data", "hf:{saved}", "--hf-splits", "valid:validation"],
            "--hf-splits 'valid:validation': expected OURS=THEIRS for OURS in train, dev, test, comma-separated; e.g. "
            "--hf-splits train=train,dev=validation,test=test",
        ),
        (
            ["--data", "hf:{saved}", "--src-lang", "fr"],
            "Hugging Face dataset hf:{saved} has no 'fr' text (its languages: en, de); pass --src-lang/--tgt-lang "
            "among them, or use a dataset with a translation column",
        ),
        (
            ["--data", "hf:{saved}", "--data-dir", "{tmp}"],
            "--data-dir is for corpora of files; --data hf:{saved} names its dataset (a local one as hf:/path/to/it): "
            "drop --data-dir",
        ),
        (
            ["--hf-splits", "dev=validation"],
            "--hf-splits is for --data hf:NAME, not corpus synthetic; drop --hf-splits",
        ),
        (
            ["--data", "hf:{tmp}/state"],
            "--data hf:{tmp}/state: {tmp}/state holds one split (a Dataset); save a DatasetDict of train, validation "
            "and test splits with save_to_disk",
        ),
        (
            ["--data", "hf:{saved}:de-en"],  # a config it cannot have: it was ignored before
            "--data hf:{saved}:de-en: {saved} is a dataset saved with save_to_disk, which has no configs; drop :de-en "
            "(pass --data hf:{saved})",
        ),
    ],
)
def test_a_bad_dataset_is_one_line_exit_2_and_nothing_written(argv, message, saved, tmp_path, capsys):
    datasets.Dataset.from_dict({"en": ["a"]}).save_to_disk(tmp_path / "state")
    capsys.readouterr()  # its progress bar
    cache, out = tmp_path / "cache", tmp_path / "runs"
    fill = lambda s: s.replace("{saved}", str(saved)).replace("{tmp}", str(tmp_path))
    argv = ["train", *map(fill, argv), "--out", str(out), "--cache-dir", str(cache), *FAST]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("INFO ")]
    assert err == [f"aiayn: error: {fill(message)}"]
    assert not out.exists() and not cache.exists()


def test_a_hub_dataset_that_is_not_here_offline_is_one_line(tmp_path, monkeypatch, capsys):
    """Offline (HF_HUB_OFFLINE=1, set when the libraries were imported: set here in their modules) and not in the
    Hugging Face cache (an empty one): the fix, not half a minute of retries and a traceback."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    out, cache = tmp_path / "runs", tmp_path / "cache"
    assert (
        main(
            [
                *"train --data hf:aiayn-test/no-such-corpus:de-en --out".split(),
                str(out),
                "--cache-dir",
                str(cache),
                *FAST,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "aiayn: error: Hugging Face dataset aiayn-test/no-such-corpus (config de-en) cannot be "
            "loaded (ConnectionError: "
        )
        and err.count("\n") == 1
    )
    assert err.endswith(
        "download it once where there is network (it stays in the Hugging Face cache; "
        "HF_HUB_OFFLINE=1 then skips the network), or pass --data hf:/path/to/a/copy saved with "
        "save_to_disk\n"
    )
    assert not out.exists() and not cache.exists()


def test_without_the_datasets_package_the_fix_is_named(saved, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(
        UserError,
        match=r"needs the Hugging Face datasets package, which is not installed; pip "
        r"install 'aiayn\[datasets\]'$",
    ):
        C.resolve_corpus(C.CorpusRef.parse(f"hf:{saved}"), cache_dir=tmp_path)


def test_a_slurm_task_gets_the_datasets_absolute_path(saved, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(saved.parent)
    out = tmp_path / "runs"
    argv = [
        *"slurm train --data hf:./tiny-ende --hf-splits dev=validation --accelerator cpu --partition p".split(),
        *"--time 1:00:00 --out".split(),
        str(out),
        "--dry-run",
    ]
    assert main(argv) == 0
    text = next((out / "slurm").glob("*.sbatch")).read_text()
    assert f"--data hf:{saved}" in text and "--hf-splits dev=validation" in text
