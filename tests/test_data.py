"""Tests for lightning_modules/data/datamodule.py: reading, corpora, SPM, caches, batching, collation, DataModule."""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import os
import random
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from aiayn.common.errors import UserError
from aiayn.lightning_modules.data import batching as B
from aiayn.lightning_modules.data import corpora as C
from aiayn.lightning_modules.data import datamodule as D
from aiayn.lightning_modules.data import tokenizer as T

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
WORDS = (
    "the a man woman dog cat runs sits on in under red blue green small big house street park ball "
    "water child plays with two three people young old near bench tree car bike looks at"
).split()


def _sentences(n: int, seed: int, lo: int = 3, hi: int = 20) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def _write(path: Path, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)


def _corpus(root: Path, src="en", tgt="de", sizes=(400, 40, 30), names=("train", "dev", "test"), gz=False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, n, seed in zip(names, sizes, (1, 2, 3), strict=True):
        src_lines = _sentences(n, seed)
        # A deterministic "translation": reversed word order, so lengths match the source.
        _write(root / f"{name}.{src}{'.gz' if gz else ''}", src_lines)
        _write(root / f"{name}.{tgt}{'.gz' if gz else ''}", [" ".join(s.split()[::-1]) for s in src_lines])
    return root


def datamodule(
    corpus: str, data_dir=None, vocab_size: int = 8000, max_len: int = 256, train_pairs=None, **loading
) -> D.TranslationDataModule:
    """A data module as `aiayn train` builds one: its identity, then how it loads (D.DataPlan's other fields)."""
    identity = D.DataIdentity(C.CorpusRef.parse(corpus), data_dir, vocab_size, max_len=max_len, train_pairs=train_pairs)
    return D.TranslationDataModule(D.DataPlan(identity, **loading))


def _one_line_error(excinfo, *needles: str) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg
    return msg


# ------------------------------------------------------------------------------------------------ reading


@pytest.mark.parametrize("gz", [False, True])
def test_read_parallel_plain_and_gz(tmp_path, gz):
    _corpus(tmp_path, gz=gz)
    src, tgt = C.read_parallel(tmp_path, "dev")
    assert len(src) == len(tgt) == 40
    assert src[0] == _sentences(40, 2)[0]  # trailing newline stripped, nothing else
    assert tgt[0].split() == src[0].split()[::-1]


def test_read_parallel_keeps_inner_whitespace(tmp_path):
    _write(tmp_path / "x.en", ["  a  b ", "c"])
    _write(tmp_path / "x.de", [" d", "e\t"])
    assert C.read_parallel(tmp_path, "x") == (["  a  b ", "c"], [" d", "e\t"])


def test_read_parallel_errors(tmp_path):
    with pytest.raises(UserError) as e:
        C.read_parallel(tmp_path / "nope", "train")
    _one_line_error(e, str(tmp_path / "nope"), "does not exist", "--data-dir")

    _write(tmp_path / "train.en", ["a"])
    with pytest.raises(UserError) as e:
        C.read_parallel(tmp_path, "train")
    _one_line_error(e, "no file train.de", "--data-dir")

    (tmp_path / "train.de").write_bytes(b"")
    with pytest.raises(UserError) as e:
        C.read_parallel(tmp_path, "train")
    _one_line_error(e, str(tmp_path / "train.de"), "empty")

    _write(tmp_path / "train.de", ["x", "y", "z"])
    with pytest.raises(UserError) as e:
        C.read_parallel(tmp_path, "train")
    _one_line_error(e, str(tmp_path / "train.en"), "1 lines", str(tmp_path / "train.de"), "has 3")

    (tmp_path / "train.de").write_bytes(b"ok\n")
    (tmp_path / "train.en").unlink()
    with gzip.open(tmp_path / "train.en.gz", "wb") as f:
        f.write(b"fine\nbad \xff byte\n")
    (tmp_path / "train.de").write_bytes(b"ok\nok\n")
    with pytest.raises(UserError) as e:
        C.read_parallel(tmp_path, "train")
    _one_line_error(e, str(tmp_path / "train.en.gz"), "line 2", "UTF-8")


# ------------------------------------------------------------------------------------------------ corpora


def test_files_corpus_custom_languages(tmp_path):
    root = _corpus(tmp_path / "c", src="fr", tgt="it", gz=True)
    assert C.resolve_corpus(C.CorpusRef.parse("files"), root, tmp_path / "cache", "fr", "it") == root
    src, tgt = C.read_parallel(root, "test", "fr", "it")
    assert len(src) == len(tgt) == 30
    with pytest.raises(UserError) as e:
        C.resolve_corpus(C.CorpusRef.parse("files"), root, tmp_path / "cache", "en", "de")
    _one_line_error(e, "no file train.en", "--data-dir")
    with pytest.raises(UserError) as e:
        C.resolve_corpus(C.CorpusRef.parse("files"), None, tmp_path / "cache")
    _one_line_error(e, "--data-dir")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"AIAYN_CACHE": "/a/cache", "XDG_CACHE_HOME": "/xdg"}, "/a/cache"),
        ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/aiayn"),
        ({"XDG_CACHE_HOME": "relative/xdg"}, "~/.cache/aiayn"),  # the XDG convention: a relative path is ignored
        ({}, "~/.cache/aiayn"),
    ],
)
def test_the_cache_honours_aiayn_cache_then_xdg_cache_home(env, expected, monkeypatch):
    for name in ("AIAYN_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert C.default_cache_dir() == Path(expected).expanduser()


def test_unknown_corpus_lists_names(tmp_path):
    with pytest.raises(UserError) as e:
        C.resolve_corpus(C.CorpusRef.parse("europarl"), None, tmp_path)
    _one_line_error(e, "europarl", "synthetic", "multi30k", "wmt14", "files")


def test_wmt14_without_datasets_is_user_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(UserError) as e:
        C.resolve_corpus(C.CorpusRef.parse("wmt14"), None, tmp_path)
    _one_line_error(e, "pip install 'aiayn[datasets]'", "--data-dir")


def test_wmt14_local_dir(tmp_path):
    root = _corpus(tmp_path / "w")
    assert C.resolve_corpus(C.CorpusRef.parse("wmt14"), root, tmp_path / "cache") == root


def test_multi30k_download_failure_says_data_dir(tmp_path, monkeypatch):
    def fail(url, timeout=None):
        raise OSError("network unreachable")

    monkeypatch.setattr(C.urllib.request, "urlopen", fail)
    with pytest.raises(UserError) as e:
        C.resolve_corpus(C.CorpusRef.parse("multi30k"), None, tmp_path)
    msg = _one_line_error(e, "raw.githubusercontent.com/multi30k/dataset", "--data-dir")
    assert "train.en.gz" in msg
    assert not list((tmp_path / "corpora" / "multi30k").glob("*"))  # no partial files left


def test_wmt14_is_the_hubs_wmt14_read_in_place(tmp_path, monkeypatch):
    """Without --data-dir, wmt14 is the Hub's wmt/wmt14 de-en (its validation split, newstest2013, is our dev), read
    from the Arrow files of the Hugging Face cache: nothing exported into aiayn's cache but a pointer to them, which
    later runs open without asking the Hub."""
    datasets = pytest.importorskip("datasets")
    pairs = lambda split, n: {
        "translation": [{"de": f"{split} satz {i}", "en": f"{split} sentence {i}"} for i in range(n)]
    }
    saved = tmp_path / "hf-cache"  # stands in for the Arrow files load_dataset makes in the Hugging Face cache
    datasets.DatasetDict(
        {s: datasets.Dataset.from_dict(pairs(s, n)) for s, n in (("train", 3), ("validation", 2), ("test", 1))}
    ).save_to_disk(saved)
    calls = []

    def load_dataset(*args):
        calls.append(args)
        return datasets.load_from_disk(saved)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cache = tmp_path / "cache"
    for _ in range(2):
        out = C.resolve_corpus(C.CorpusRef.parse("wmt14"), None, cache)
        for ours, theirs, n in (("train", "train", 3), ("dev", "validation", 2), ("test", "test", 1)):
            assert C.read_parallel(out, ours) == (
                [f"{theirs} sentence {i}" for i in range(n)],
                [f"{theirs} satz {i}" for i in range(n)],
            )
    assert calls == [("wmt/wmt14", "de-en")]  # the second time from the pointer, without the Hub
    assert [p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()] == ["hf/hf-wmt--wmt14-de-en.json"]


class _Multi30kServer:
    """A local HTTP server of Multi30k's remote files; `truncate` names files sent half-way with the whole
    Content-Length (the connection then closes)."""

    def __init__(self, files: dict[str, bytes]):
        import http.server
        import threading

        self.files, self.truncate, self.served = files, set(), []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.lstrip("/")
                server.served.append(name)
                if name not in server.files:
                    self.send_error(404)
                    return
                body = server.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if name in server.truncate else body)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{{name}}.{{lang}}.gz"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def multi30k_server(monkeypatch):
    files = {}
    for split, remote in C.MULTI30K_REMOTE.items():
        for lang, lines in (("en", _sentences(5, len(remote))), ("de", _sentences(5, len(remote) + 1))):
            files[f"{remote}.{lang}.gz"] = gzip.compress(("\n".join([split, *lines]) + "\n").encode())
    server = _Multi30kServer(files)
    monkeypatch.setattr(C, "MULTI30K_URL", server.url)
    yield server
    server.close()


def test_multi30k_download_from_a_server(tmp_path, multi30k_server):
    out = C.resolve_corpus(C.CorpusRef.parse("multi30k"), None, tmp_path)
    for split, remote in C.MULTI30K_REMOTE.items():
        for lang in ("en", "de"):
            assert (out / f"{split}.{lang}.gz").read_bytes() == multi30k_server.files[f"{remote}.{lang}.gz"]
        assert C.read_parallel(out, split)[0][0] == split  # val is our dev, test_2016_flickr our test
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files
    n = len(multi30k_server.served)
    C.resolve_corpus(C.CorpusRef.parse("multi30k"), None, tmp_path)
    assert len(multi30k_server.served) == n == 6  # downloaded once


def test_multi30k_partial_download_is_an_error_and_leaves_nothing(tmp_path, multi30k_server):
    multi30k_server.truncate.add("val.de.gz")
    with pytest.raises(UserError) as e:
        C.resolve_corpus(C.CorpusRef.parse("multi30k"), None, tmp_path)
    assert "incomplete" in _one_line_error(e, "val.de.gz", "--data-dir").lower()
    out = tmp_path / "corpora" / "multi30k"
    assert sorted(p.name for p in out.iterdir()) == ["dev.en.gz", "train.de.gz", "train.en.gz"]  # whole files only
    multi30k_server.truncate.clear()
    C.resolve_corpus(C.CorpusRef.parse("multi30k"), None, tmp_path)  # the next run fetches what is missing
    assert (out / "dev.de.gz").read_bytes() == multi30k_server.files["val.de.gz"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_multi30k_local_val_as_dev_without_test(tmp_path, caplog):
    root = _corpus(tmp_path / "m", names=("train", "val", "x"), gz=True)
    with caplog.at_level(logging.WARNING, logger=C.__name__):
        out = C.resolve_corpus(C.CorpusRef.parse("multi30k"), root, tmp_path / "cache")
    assert "no test split" in caplog.text
    assert C.read_parallel(out, "dev") == C.read_parallel(root, "val")
    assert C.read_parallel(out, "test") == C.read_parallel(root, "val")
    # A test split added later is picked up.
    _write(root / "test.en.gz", ["t"])
    _write(root / "test.de.gz", ["u"])
    out = C.resolve_corpus(C.CorpusRef.parse("multi30k"), root, tmp_path / "cache")
    assert C.read_parallel(out, "test") == (["t"], ["u"])


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"shared Multi30k copy not found at {MULTI30K}")
def test_multi30k_shared_copy(tmp_path):
    out = C.resolve_corpus(C.CorpusRef.parse("multi30k"), MULTI30K, tmp_path)
    src, tgt = C.read_parallel(out, "dev")
    assert len(src) == len(tgt) == 1014
    assert C.find_split_file(out, "train", "de") is not None


def test_synthetic_corpus(tmp_path, monkeypatch):
    if importlib.util.find_spec("aiayn.lightning_modules.data.synthetic") is None:
        pytest.skip("lightning_modules/data/synthetic.py (write_corpus) not available yet")
    import aiayn.lightning_modules.data.synthetic as synthetic

    calls = []
    real = synthetic.write_corpus

    def small(out_dir, seed=1234, **kwargs):
        calls.append((Path(out_dir), seed))
        return real(out_dir, seed=seed, n_train=200, n_dev=20, n_test=20)

    monkeypatch.setattr(synthetic, "write_corpus", small)
    out = C.resolve_corpus(C.CorpusRef.parse("synthetic"), None, tmp_path)
    assert calls == [(tmp_path / "corpora" / "synthetic-seed1234", 1234)]
    assert len(C.read_parallel(out, "train")[0]) == 200
    with pytest.raises(UserError) as e:
        C.resolve_corpus(C.CorpusRef.parse("synthetic"), None, tmp_path, "fr", "de")
    _one_line_error(e, "synthetic", "--src-lang")


# ------------------------------------------------------------------------------------------------ SPM


@pytest.fixture(scope="module")
def small_spm(tmp_path_factory):
    root = tmp_path_factory.mktemp("spm")
    src, tgt = _sentences(400, 11), _sentences(400, 12)
    return T.train_spm(src, tgt, 120, root / "m"), (src, tgt)


def test_spm_special_ids_and_round_trip(small_spm):
    model, _ = small_spm
    sp = T.load_spm(model)
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    assert sp.get_piece_size() == 120
    text = "the small dog plays near the green tree"
    ids = sp.encode(text)
    assert 0 not in ids and 2 not in ids and 3 not in ids
    assert sp.decode(ids) == text


def test_spm_cached_not_retrained(small_spm, monkeypatch):
    model, (src, tgt) = small_spm
    mtime = model.stat().st_mtime_ns
    import sentencepiece as spm

    def boom(**kwargs):
        raise AssertionError("retrained")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", boom)
    assert T.train_spm(src, tgt, 120, model.with_suffix("")) == model
    assert model.stat().st_mtime_ns == mtime


def test_spm_deterministic(tmp_path, small_spm):
    model, (src, tgt) = small_spm
    again = T.train_spm(src, tgt, 120, tmp_path / "m")
    # Compare pieces and scores (.vocab): the .model also records the temporary training prefix.
    assert again.with_suffix(".vocab").read_bytes() == model.with_suffix(".vocab").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp dir cleaned
    # the fingerprint runs record is how the model segments, not its file, whose bytes hold the temporary prefix
    assert again.read_bytes() != model.read_bytes()
    assert T.segmentation_sha256(again) == T.segmentation_sha256(model)
    other = T.train_spm(src, tgt, 121, tmp_path / "other")
    assert T.segmentation_sha256(other) != T.segmentation_sha256(model)


def test_spm_vocab_too_large_is_user_error(tmp_path):
    with pytest.raises(UserError) as e:
        T.train_spm(["a b c"], ["d e f"], 5000, tmp_path / "m")
    _one_line_error(e, "5000", "smaller --vocab-size")
    assert not (tmp_path / "m.model").exists()


def test_spm_cache_key_changes_with_train_files(tmp_path):
    root = _corpus(tmp_path / "c")
    a = T.spm_cache_prefix(tmp_path, C.CorpusRef.parse("files"), root, "en", "de", 300)
    assert a == T.spm_cache_prefix(tmp_path, C.CorpusRef.parse("files"), root, "en", "de", 300)
    assert a != T.spm_cache_prefix(tmp_path, C.CorpusRef.parse("files"), root, "en", "de", 400)
    _write(root / "train.de", _sentences(401, 5))
    assert a != T.spm_cache_prefix(tmp_path, C.CorpusRef.parse("files"), root, "en", "de", 300)


def test_encoded_cache_written_once(tmp_path, small_spm, monkeypatch):
    model, _ = small_spm
    sp = T.load_spm(model)
    root = _corpus(tmp_path / "c")
    out = T.encoded_cache_path(tmp_path, model, root, "dev", "en", "de")
    first = T.encode_split(sp, root, "dev", "en", "de", out)
    flat, off = first["src"]
    assert flat.dtype == torch.int32 and len(off) == 41
    src, _ = C.read_parallel(root, "dev")
    assert flat[off[3] : off[4]].tolist() == sp.encode(src[3])
    monkeypatch.setattr(T, "parallel_text", lambda *a: pytest.fail("re-encoded"))
    again = T.encode_split(sp, root, "dev", "en", "de", out)
    assert torch.equal(again["tgt"][0], first["tgt"][0])


@pytest.mark.parametrize("garbage", [b"not a pickle at all" * 10, b"PK\x03\x04 truncated zip", "other"])
def test_a_garbled_cached_encoding_is_encoded_again_with_a_warning(tmp_path, small_spm, caplog, garbage):
    """A cache entry that is not an encoded split (UnpicklingError before, with no hint): rebuilt, said in a line."""
    model, _ = small_spm
    sp = T.load_spm(model)
    root = _corpus(tmp_path / "c")
    out = T.encoded_cache_path(tmp_path, model, root, "dev", "en", "de")
    first = T.encode_split(sp, root, "dev", "en", "de", out)
    if garbage == "other":
        torch.save({"src": [1, 2]}, out)  # a readable file of the wrong shape
    else:
        out.write_bytes(garbage)
    with caplog.at_level("WARNING"):
        again = T.encode_split(sp, root, "dev", "en", "de", out)
    assert torch.equal(again["src"][0], first["src"][0]) and torch.equal(again["tgt"][1], first["tgt"][1])
    assert f"cached encoding {out} is unreadable" in caplog.text
    assert torch.equal(torch.load(out, weights_only=True)["tgt"][0], first["tgt"][0])  # the cache mended


# ------------------------------------------------------------------------------------------------ batching


def _lengths(n: int = 3000, seed: int = 0) -> tuple[list[int], list[int]]:
    # Multi30k-like: ~12-16 subword tokens on average, long right tail, correlated src/tgt lengths.
    rng = random.Random(seed)
    src = [max(1, int(rng.lognormvariate(2.5, 0.4))) for _ in range(n)]
    tgt = [max(1, int(s * rng.uniform(0.8, 1.3))) for s in src]
    return src, tgt


def test_batches_within_budget_and_cover_epoch():
    src, tgt = _lengths()
    s = B.TokenBucketSampler(src, tgt, max_tokens=500, seed=3)
    batches = list(s)
    assert len(batches) == len(s)
    for b in batches:
        assert sum(tgt[i] + 1 for i in b) <= 500
        assert B.batch_cost(len(b), max(src[i] for i in b), max(tgt[i] for i in b)) <= 2 * 500
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(src)))


def test_oversized_sentence_gets_batch_of_one():
    s = B.TokenBucketSampler([5, 50, 6], [5, 60, 6], max_tokens=20, shuffle=False)
    assert [1] in list(s)


def test_epochs_differ_and_are_reproducible():
    src, tgt = _lengths()
    s = B.TokenBucketSampler(src, tgt, max_tokens=500, seed=3)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1
    assert sorted(map(sorted, e0)) != sorted(map(sorted, e1))  # ties re-broken: batch contents change too
    other = B.TokenBucketSampler(src, tgt, max_tokens=500, seed=3)
    other.set_epoch(1)
    assert list(other) == e1
    other.set_epoch(0)
    assert list(other) == e0
    assert list(B.TokenBucketSampler(src, tgt, max_tokens=500, seed=4)) != e0


def test_ranks_disjoint_equal_and_cover_all_but_trimmed():
    src, tgt = _lengths(3004)
    full = B.TokenBucketSampler(src, tgt, max_tokens=500, seed=7)
    all_batches = full.all_batches(2)
    assert len(all_batches) % 2 == 1  # this fixture has an odd batch count, so one batch is trimmed
    ranks = [B.TokenBucketSampler(src, tgt, max_tokens=500, seed=7, num_replicas=2, rank=r) for r in (0, 1)]
    for r in ranks:
        r.set_epoch(2)
    got = [list(r) for r in ranks]
    assert len(got[0]) == len(got[1]) == len(ranks[0]) == len(all_batches) // 2
    seen = [{i for b in g for i in b} for g in got]
    assert not seen[0] & seen[1]
    # The union is every example except those of the last batch of the shuffled epoch order.
    assert seen[0] | seen[1] == set(range(len(src))) - set(all_batches[-1])


def test_dev_and_test_shares_hold_every_sentence_exactly_once():
    """Uneven shares, not padded: padding repeated the first batches on one rank, and the dev perplexity, gathered
    over the ranks, counted those sentences twice."""
    src, tgt = _lengths(3004)
    n = len(B.TokenBucketSampler(src, tgt, 500, shuffle=False).all_batches())
    ranks = [B.TokenBucketSampler(src, tgt, 500, False, 0, 2, r, drop_uneven=False) for r in (0, 1)]
    got = [list(r) for r in ranks]
    assert n % 2 == 1 and (len(got[0]), len(got[1])) == ((n + 1) // 2, n // 2)
    every = sorted(i for g in got for b in g for i in b)
    assert every == list(range(len(src)))  # each once: no sentence counted twice


def test_resume_mid_epoch_matches_uninterrupted():
    src, tgt = _lengths()
    ref = B.TokenBucketSampler(src, tgt, 500, seed=1, num_replicas=2, rank=1)
    ref.set_epoch(3)
    expected = list(ref)
    s = B.TokenBucketSampler(src, tgt, 500, seed=1, num_replicas=2, rank=1)
    s.set_epoch(3)
    it = iter(s)
    head = [next(it) for _ in range(5)]
    state = s.state_dict()
    assert state == {"epoch": 3, "yielded": 5}
    fresh = B.TokenBucketSampler(src, tgt, 500, seed=1, num_replicas=2, rank=1)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)  # what Lightning does at epoch start: same epoch keeps the position
    iter(fresh)  # an abandoned iterator (multi-worker DataLoaders create two) keeps the position
    assert head + list(fresh) == expected
    assert list(fresh) == expected  # a finished epoch clears the skip
    fresh.set_epoch(4)
    assert len(list(fresh)) == len(expected)  # next epoch starts from the beginning


def test_padding_fraction_small_on_multi30k_like_lengths():
    src, tgt = _lengths(29000)
    s = B.TokenBucketSampler(src, tgt, max_tokens=4096)
    frac = B.padding_stats(s.all_batches(), src, tgt)
    assert 0.0 <= frac < 0.15, frac
    assert B.padding_stats([[0, 1]], [2, 4], [1, 1]) == pytest.approx(1 - 10 / 12)


def test_derive_accumulation():
    assert B.derive_accumulation(25000, 4096, 1) == 7
    assert B.derive_accumulation(25000, 25000, 1) == 1
    assert B.derive_accumulation(50000, 4096, 8) == 2
    assert B.derive_accumulation(100, 4096, 1) == 1
    with pytest.raises(UserError):
        B.derive_accumulation(0, 4096, 1)


# ------------------------------------------------------------------------------------------------ collation


def test_collate_shapes_and_specials():
    ids = lambda *x: torch.tensor(x, dtype=torch.int32)
    items = [(7, ids(10, 11, 12), ids(20, 21)), (2, ids(13), ids(22, 23, 24, 25))]
    b = B.collate(items)
    assert b["src"].tolist() == [[10, 11, 12], [13, 0, 0]]
    assert b["tgt_in"].tolist() == [[2, 20, 21, 0, 0], [2, 22, 23, 24, 25]]
    assert b["tgt_out"].tolist() == [[20, 21, 3, 0, 0], [22, 23, 24, 25, 3]]
    assert all(b[k].dtype == torch.long for k in ("src", "tgt_in", "tgt_out", "idx"))
    assert b["tgt_in"].shape == b["tgt_out"].shape
    assert b["idx"].tolist() == [7, 2]
    assert (b["n_src_tokens"], b["n_tgt_tokens"]) == (4, 8)
    assert b["n_tgt_tokens"] == int((b["tgt_out"] != 0).sum())


# ------------------------------------------------------------------------------------------------ DataModule


@pytest.fixture()
def tiny_dm(tmp_path):
    root = _corpus(tmp_path / "corpus", src="en", tgt="de", sizes=(400, 40, 30))
    # One over-long train pair (dropped) and one over-long dev pair (truncated, kept).
    long = " ".join(["house"] * 80)
    for split in ("train", "dev"):
        for lang in ("en", "de"):
            lines = (root / f"{split}.{lang}").read_text().splitlines()
            _write(root / f"{split}.{lang}", lines + [long])
    dm = datamodule("files", str(root), 150, 48, cache_dir=str(tmp_path / "cache"), max_tokens=400)
    return dm, root


def test_datamodule_end_to_end(tiny_dm, caplog):
    dm, root = tiny_dm
    with caplog.at_level(logging.INFO, logger="aiayn.lightning_modules"):
        dm.prepare_data()
        dm.setup("fit")
    assert "dropped 1 of 401 train pairs" in caplog.text
    assert (dm.vocab_size, dm.pad_id, dm.bos_id, dm.eos_id) == (150, 0, 2, 3)
    train = next(iter(dm.train_dataloader()))
    assert train["src"].shape[0] == train["tgt_in"].shape[0] == train["idx"].shape[0]
    assert train["n_tgt_tokens"] <= 400  # real target tokens; padded positions stay under twice that
    assert B.batch_cost(len(train["idx"]), train["src"].shape[1], train["tgt_in"].shape[1] - 1) <= 2 * 400
    assert (train["tgt_in"][:, 0] == dm.bos_id).all()
    val_batches = list(dm.val_dataloader())
    val_idx = sorted(i for b in val_batches for i in b["idx"].tolist())
    assert val_idx == list(range(41))  # nothing dropped from dev; the long pair is truncated
    assert max(b["src"].shape[1] for b in val_batches) == 48 + 1  # truncated to max_len tokens, then its </s>
    assert all((b["src"].gather(1, (b["src"] != 0).sum(1, keepdim=True) - 1) == dm.eos_id).all() for b in val_batches)
    b = val_batches[0]
    row = 0
    refs = dm.references("dev")
    assert dm.decode(b["tgt_out"][row].tolist()) == refs[int(b["idx"][row])]
    assert dm.sources("dev")[int(b["idx"][row])] == C.read_parallel(root, "dev")[0][int(b["idx"][row])]
    assert dm.decode([2, *dm.encode(["the red ball"])[0], 3, 0, 0, 17]) == "the red ball"
    assert len(list(dm.test_dataloader())) >= 1
    assert 0.0 <= dm.padding_fraction() < 0.5


def test_datamodule_dev_subset_and_second_setup_uses_cache(tiny_dm, monkeypatch):
    dm, root = tiny_dm
    dm.setup("fit")
    dm2 = datamodule("files", str(root), 150, 48, cache_dir=dm.plan.cache_dir, max_tokens=400, dev_subset=10)
    monkeypatch.setattr(D, "train_spm", lambda *a, **k: pytest.fail("SPM retrained"))
    monkeypatch.setattr(T, "parallel_text", lambda *a, **k: pytest.fail("re-read for encoding"))
    dm2.setup("fit")
    idx = sorted(i for b in dm2.val_dataloader() for i in b["idx"].tolist())
    assert idx == list(range(10))
    monkeypatch.undo()
    assert len(dm2.references("dev")) == len(dm2.sources("dev")) == 10


def test_a_record_of_a_corpus_this_aiayn_does_not_know_still_reads(tmp_path):
    """A run's records name its corpus; a name this aiayn does not know (a corpus since removed, another aiayn's)
    stands for itself, so the run is still read, resumed by nobody and reported; only training on it is refused, in
    one line. A name that is not one path component is not read at all."""
    identity = D.DataIdentity.from_dict({"corpus": "europarl", "vocab_size": 100})
    assert (identity.corpus.name, identity.corpus.dirname, identity.corpus.source) == ("europarl", "europarl", "found")
    with pytest.raises(UserError) as e:
        C.resolve_corpus(identity.corpus, None, tmp_path)
    _one_line_error(e, "corpus europarl is not one this aiayn knows", "--data")
    with pytest.raises(ValueError, match="corpus"):
        D.DataIdentity.from_dict({"corpus": "../x"})


def test_the_data_module_is_built_from_one_plan_whose_identity_the_run_records(tmp_path):
    """One typed value builds the data module (DataPlan: the identity a run records, then how it loads);
    the run's config.json records that identity itself, and the final evaluation's module, built from the recorded
    identity, reads the same tokens."""
    import inspect

    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.rundir import RunConfig
    from aiayn.lightning_modules.run.train import plan

    assert list(inspect.signature(D.TranslationDataModule).parameters) == ["plan"]
    p = plan(TrainOptions(out=str(tmp_path), accelerator="cpu", train_pairs=50, src_lang="en", tgt_lang="de"))
    assert p.config.data is p.dm.data is p.dm.plan.identity and p.dm.data.train_pairs == 50
    again = D.DataPlan(RunConfig.from_dict(p.config.to_dict()).data, p.dm.plan.cache_dir, p.dm.plan.max_tokens)
    assert again.identity == p.dm.data


def test_datamodule_config_errors(tmp_path, monkeypatch):
    with pytest.raises(UserError) as e:
        datamodule("synthetic", max_tokens=100, max_len=256)
    _one_line_error(e, "--max-tokens", "max_len")
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "env-cache"))
    assert datamodule("synthetic").plan.cache_dir == tmp_path / "env-cache"


class _Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def training_step(self, batch, _):
        self.seen.append(batch["idx"].tolist())
        return (self.w * batch["src"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(dm, tmp_path, callbacks=(), ckpt=None):
    model = _Recorder()
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=list(callbacks),
        enable_checkpointing=bool(callbacks),
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return model.seen


@pytest.mark.parametrize(
    ("num_workers", "every_n_train_steps", "resume_step"),
    [(0, 3, 3), (2, 5, 5), (0, None, 13)],
    ids=["mid-epoch", "mid-epoch-2-workers", "epoch-end"],
)
def test_lightning_drives_epoch_and_resume(tiny_dm, tmp_path, num_workers, every_n_train_steps, resume_step):
    """Lightning calls set_epoch via ``batch_sampler.sampler`` and saves/loads the DataLoader's state."""
    dm, root = tiny_dm
    mk = lambda: datamodule(
        "files", str(root), 150, 48, cache_dir=dm.plan.cache_dir, max_tokens=400, num_workers=num_workers
    )
    full = _fit(mk(), tmp_path / "a")
    per_epoch = len(full) // 3
    assert per_epoch == 13  # the fixture's batch count (of 400 real target tokens); resume_step=13 ends epoch 0
    assert full[:per_epoch] != full[per_epoch : 2 * per_epoch]  # a new order each epoch
    kw = {"every_n_train_steps": every_n_train_steps} if every_n_train_steps else {"every_n_epochs": 1}
    cb = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1, **kw)
    _fit(mk(), tmp_path / "b", callbacks=[cb])
    ckpt = tmp_path / "ck" / f"epoch=0-step={resume_step}.ckpt"
    state = torch.load(ckpt, weights_only=True)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert state == [{"epoch": 0, "yielded": resume_step}]
    resumed = _fit(mk(), tmp_path / "c", ckpt=str(ckpt))
    assert full[:resume_step] + resumed == full


def test_a_data_limited_regime_trains_on_the_first_k_pairs_only(tiny_dm):
    """--train-pairs K (the tiny-2k preset's regime): the training set is the first K pairs, the dev and test sets
    and the tokenizer stay the whole corpus's."""
    dm, root = tiny_dm
    limited = datamodule("files", str(root), 150, 48, train_pairs=100, cache_dir=dm.plan.cache_dir, max_tokens=400)
    limited.setup("fit")
    dm.setup("fit")
    trained = sorted(i for batch in limited.train_dataloader() for i in batch["idx"].tolist())
    assert trained == list(range(100))
    assert len(limited._datasets["dev"]) == len(dm._datasets["dev"]) == 41
    assert limited.tokenizer_model == dm.tokenizer_model
    with pytest.raises(UserError, match="--train-pairs 1000 is more than the corpus's 401 training pairs"):
        datamodule("files", str(root), 150, 48, train_pairs=1000, cache_dir=dm.plan.cache_dir, max_tokens=400).setup(
            "fit"
        )


def _a_worker(init, ready, done):  # a loader worker as a spawned process starts it: the init function, then work
    init(0)
    ready.set()
    done.wait(30)


@pytest.mark.slow  # trains end to end (seconds to tens of seconds): the slow tier
def test_the_requeue_signal_and_the_groups_first_sigterm_or_sigint_never_kill_a_loader_worker():
    """SLURM's USR1 (sent without B: to every process of the step) reaches the loader's workers too; a
    spawned or forkserver worker has the default action, terminate, unless its init function ignores the signal.
    So do a SIGTERM or SIGINT sent to the process group; the worker outlives the first of each (its trainer
    stops on its own and shuts it down) and a second SIGTERM ends it. The data module's loaders pass that function."""
    import multiprocessing
    import signal

    from aiayn.lightning_modules.data.corpora import CorpusRef
    from aiayn.lightning_modules.data.datamodule import DataIdentity, DataPlan, TranslationDataModule, worker_signals

    dm = TranslationDataModule.__new__(TranslationDataModule)
    dm._samplers, dm._datasets = {"dev": [[0]]}, {"dev": [0]}
    dm.plan = DataPlan(DataIdentity(CorpusRef.parse("synthetic")))
    assert dm._loader("dev").worker_init_fn is worker_signals
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    worker = ctx.Process(target=_a_worker, args=(worker_signals, ready, done))
    worker.start()
    assert ready.wait(300)  # a spawned worker imports this module (torch with it): slow on a loaded machine
    alive = []
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        os.kill(worker.pid, signum)
        worker.join(1.0)
        alive.append(worker.is_alive())
    os.kill(worker.pid, signal.SIGTERM)  # a second one: multiprocessing's terminate at exit
    worker.join(30)  # (not done.set(): the worker died inside done.wait, holding the event's lock)
    assert alive == [True] * 4 and worker.exitcode == -signal.SIGTERM


def test_length_buckets_pad_to_a_multiple_and_change_no_number(both_paths):
    """--pad-to K: a batch's lengths rounded up to a multiple of K, the added positions padding like any
    other; the model's logits at the real positions and the loss are those of the unbucketed batch (dropout off)."""
    from aiayn.lightning_modules.data.batching import collate
    from aiayn.lightning_modules.transformer.loss import projected_label_smoothed_loss
    from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig

    items = [(0, [5, 6, 7], [8, 9]), (1, [5, 6, 7, 8, 9, 10, 11, 12, 13], [8, 9, 10, 11])]
    plain, bucketed = collate(items), collate(items, pad_to=8)
    assert plain["src"].shape == (2, 9) and bucketed["src"].shape == (2, 16)
    assert plain["tgt_in"].shape == (2, 5) and bucketed["tgt_in"].shape == (2, 8)
    assert (plain["n_src_tokens"], plain["n_tgt_tokens"]) == (bucketed["n_src_tokens"], bucketed["n_tgt_tokens"])
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=20, max_len=64, P_drop=0.0))

    def run(batch):
        memory, mask = model.encode(batch["src"])
        hidden = model.decode(batch["tgt_in"], memory, mask)
        loss, _, _ = projected_label_smoothed_loss(hidden, model.embed.weight, batch["tgt_out"], 0.1)
        return model.project(hidden)[:, :5], loss

    (logits_a, loss_a), (logits_b, loss_b) = run(plain), run(bucketed)
    real = plain["tgt_out"] != 0
    torch.testing.assert_close(logits_b[real], logits_a[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-6)


def test_padding_and_distinct_shapes_with_length_buckets_by_hand():
    from aiayn.lightning_modules.data.batching import batch_shapes, padding_stats

    src, tgt = [3, 5, 9, 10], [2, 4, 8, 9]  # tgt_in lengths are one more: 3, 5, 9, 10
    batches = [[0, 1], [2, 3]]
    # unbucketed: (2 x 5 + 2 x 5) + (2 x 10 + 2 x 10) = 60 positions for 3+5+3+5 + 9+10+9+10 = 54 real
    assert padding_stats(batches, src, tgt) == pytest.approx(1 - 54 / 60)
    assert batch_shapes(batches, src, tgt) == {(2, 5, 5), (2, 10, 10)}
    # to a multiple of 8: (2 x 8 + 2 x 8) + (2 x 16 + 2 x 16) = 96 positions
    assert padding_stats(batches, src, tgt, pad_to=8) == pytest.approx(1 - 54 / 96)
    assert batch_shapes(batches, src, tgt, pad_to=8) == {(2, 8, 8), (2, 16, 16)}


def test_static_shapes_give_a_few_fixed_batch_shapes_and_every_sentence_once():
    """--static-shapes: each sentence's longer side rounded up to a multiple of K is its bucket; a bucket's
    batches hold one count of sentences (the last fewer), and collate pads both sides to the bucket: at most
    two shapes per bucket, every sentence in one batch (a dev split's sampler drops nothing)."""
    from aiayn.lightning_modules.data.batching import TokenBucketSampler, batch_shapes, collate

    rng = random.Random(0)
    src = [rng.randint(1, 40) for _ in range(500)]
    tgt = [max(1, s + rng.randint(-3, 3)) for s in src]
    sampler = TokenBucketSampler(src, tgt, max_tokens=256, shuffle=False, drop_uneven=False, static_bucket=8)
    batches = sampler.all_batches()
    assert sorted(i for b in batches for i in b) == list(range(500))
    buckets = {-(-max(src[i], tgt[i] + 1) // 8) * 8 for i in range(500)}
    shapes = batch_shapes(batches, src, tgt, pad_to=8, square=True)
    assert len(shapes) <= 2 * len(buckets) and all(s == t and s in buckets for _, s, t in shapes)
    counts = {}
    for n, s, _ in shapes:
        counts.setdefault(s, set()).add(n)
    assert all(len(c) <= 2 for c in counts.values())  # a bucket's full count, and its last batch's
    b = batches[0]
    batch = collate([(i, list(range(4, 4 + src[i])), list(range(4, 4 + tgt[i]))) for i in b], pad_to=8, square=True)
    ((_, length, _),) = batch_shapes([b], src, tgt, 8, square=True)
    assert batch["src"].shape[1] == batch["tgt_in"].shape[1] == length


def test_static_batches_carry_the_budgets_real_tokens_as_the_dynamic_ones_do():
    """--static-shapes changes the shapes, not the experiment: its batches hold as many real target tokens a step
    as the token-bucket batches do (within 5% on average over an epoch, sentences of 1-40 tokens in buckets of 8,
    where a count of max_tokens // bucket carried 20% fewer), their padded positions within the same bound."""
    from aiayn.lightning_modules.data.batching import PADDED_LIMIT, TokenBucketSampler

    rng = random.Random(0)
    src = [rng.randint(1, 40) for _ in range(4000)]
    tgt = [max(1, s + rng.randint(-3, 3)) for s in src]

    def real_per_batch(**kw):
        batches = TokenBucketSampler(src, tgt, max_tokens=512, shuffle=True, seed=1, **kw).all_batches()
        return [sum(tgt[i] + 1 for i in b) for b in batches], batches

    dynamic, _ = real_per_batch()
    static, batches = real_per_batch(static_bucket=8)
    mean = lambda xs: sum(xs) / len(xs)
    assert mean(static) == pytest.approx(mean(dynamic), rel=0.05)
    padded = [len(b) * -(-max(max(src[i], tgt[i] + 1) for i in b) // 8) * 8 for b in batches]
    assert max(padded) <= PADDED_LIMIT * 512


def test_with_two_ranks_the_dev_split_is_shared_whole_and_training_is_cut_even(cache):
    """The DataModule's wiring under DDP (no test failed when it was reverted): with 2 ranks each gets its
    share of the dev batches, together every dev sentence once (nothing dropped or repeated: perplexity counts each
    once); the training shares are cut to equal counts. A fake trainer stands for Lightning's (world 2, rank r)."""

    class FakeTrainer:
        def __init__(self, rank):
            self.world_size, self.global_rank = 2, rank
            self._accelerator_connector = type("C", (), {"use_distributed_sampler": False})()

    dev, train = [], []
    for rank in (0, 1):
        # 120 dev sentences in batches of at most 300 tokens: 5 batches, an odd count, so cutting them even would
        # drop one
        dm = datamodule("synthetic", vocab_size=1000, cache_dir=cache, max_tokens=300, dev_subset=120)
        dm.trainer = FakeTrainer(rank)
        dm.setup("fit")
        assert len(dm._samplers["dev"].all_batches()) == 5
        dev.append([i for b in dm._samplers["dev"] for i in b])
        train.append(len(dm._samplers["train"]))
    assert sorted(dev[0] + dev[1]) == list(range(120))  # every dev sentence, once
    assert dev[0] and dev[1] and not set(dev[0]) & set(dev[1])
    assert train[0] == train[1]


def test_every_rank_gets_a_dev_batch_even_when_the_dev_set_has_fewer_batches_than_ranks():
    """A dev set of one batch on two ranks left rank 1 with none (DDP then crashed at the first
    validation). Rank 1 gets a filler batch: one row of padding, index -1, that counts no token."""
    import torch

    from aiayn.lightning_modules.data.batching import TokenBucketSampler, collate
    from aiayn.lightning_modules.run.evaluate import nll_sum
    from aiayn.lightning_modules.transformer.model import Transformer, TransformerConfig

    shares = [
        list(TokenBucketSampler([5], [6], 1024, shuffle=False, num_replicas=2, rank=r, drop_uneven=False))
        for r in (0, 1)
    ]
    assert shares == [[[0]], [[]]]
    filler = collate([], pad_to=8)
    assert filler["idx"].tolist() == [-1] and (filler["n_src_tokens"], filler["n_tgt_tokens"]) == (0, 0)
    model = Transformer(TransformerConfig(N=1, d_model=16, d_ff=32, h=2, vocab_size=20, max_len=64)).eval()
    with torch.no_grad():
        nll, n = nll_sum(model, filler)
    assert n == 0 and float(nll) == 0.0
    # training keeps dropping an uneven tail: a rank never gets a filler there
    train = TokenBucketSampler([5], [6], 1024, shuffle=True, num_replicas=2, rank=1, drop_uneven=True)
    assert list(train) == []


def test_a_source_ends_with_eos_as_in_tensor2tensor_fairseq_and_marian():
    """Every source ends with </s> (EOS), counted in its length, as the paper's toolkits and MarianTokenizer
    encode a source; without `source_eos` (earlier runs, `--source-eos no`) the source is its pieces alone."""
    from aiayn.lightning_modules.data.tokenizer import EncodedPairs
    from aiayn.lightning_modules.transformer.config import EOS

    data = {
        "src": (torch.tensor([5, 6, 7, 8, 9]), torch.tensor([0, 3, 5])),
        "tgt": (torch.tensor([10, 11, 12]), torch.tensor([0, 1, 3])),
    }
    with_eos = EncodedPairs(data, torch.arange(2), source_eos=True)
    assert with_eos[0][1].tolist() == [5, 6, 7, EOS] and with_eos[1][1].tolist() == [8, 9, EOS]
    assert with_eos.src_lens.tolist() == [4, 3] and with_eos.tgt_lens.tolist() == [1, 2]
    assert with_eos[0][2].tolist() == [10]  # the target is unchanged: collate adds its EOS to tgt_out
    without = EncodedPairs(data, torch.arange(2))
    assert without[0][1].tolist() == [5, 6, 7] and without.src_lens.tolist() == [3, 2]
    cut = EncodedPairs(data, torch.arange(2), max_len=2, source_eos=True)  # dev/test: cut, then </s>
    assert cut[0][1].tolist() == [5, 6, EOS] and cut.src_lens.tolist() == [3, 3]


def test_a_run_records_its_source_eos_and_a_resumed_run_keeps_its_own(tmp_path):
    from dataclasses import replace

    from aiayn.lightning_modules.run.options import TrainOptions
    from aiayn.lightning_modules.run.rundir import RunConfig
    from aiayn.lightning_modules.run.train import plan

    opts = TrainOptions(out=str(tmp_path), accelerator="cpu")
    p = plan(opts)
    assert p.dm.data.source_eos and p.config.data.source_eos  # the paper's convention by default
    # a run directory of an earlier aiayn: its config.json has no source_eos (read as without)
    old = p.config.to_dict()
    del old["data"]["source_eos"]
    p.run.path.mkdir(parents=True)
    p.run.config_file.write_text(json.dumps(old))
    assert RunConfig.from_dict(old).data.source_eos is False
    assert not plan(opts).dm.data.source_eos  # resumed as it started
    assert plan(replace(opts, source_eos="yes")).dm.data.source_eos  # asked for: then the run's config check refuses
    assert not plan(replace(opts, source_eos="no", out=str(tmp_path / "fresh"))).config.data.source_eos


def _record_masks(path: str, worker_id: int) -> None:
    """A worker_init_fn: the signal mask the worker started with, then the one after worker_signals, to `path`."""
    import signal

    from aiayn.lightning_modules.data.datamodule import worker_signals

    started = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    worker_signals(worker_id)
    after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    Path(path).write_text(json.dumps([sorted(map(int, started)), sorted(map(int, after))]))


@pytest.mark.parametrize("default_start", ["fork", "forkserver"])
def test_loader_workers_start_with_the_stop_signals_held_until_their_handlers_are_in(tmp_path, default_start):
    """A signal to the trainer's group that lands while a loader forks its workers must not meet torch's worker
    handler, which ends a worker on a signal its parent did not send (the trainer failed half-way through making its
    iterator, and a worker it never shut down kept it from exiting): the workers start with SIGTERM, SIGINT and
    SIGUSR1 held, worker_signals lets them through once its handlers are in, and the trainer's mask is as before.
    So too where the process's default start method is the forkserver (a sweep's trainer, Python 3.14): the workers
    are forked from the trainer all the same (not started by a fresh interpreter, which inherits no mask)."""
    import functools
    import multiprocessing
    import signal

    from aiayn.lightning_modules.data.batching import STOP_SIGNALS, ResumableDataLoader, TokenBucketSampler

    sampler = TokenBucketSampler([3] * 8, [3] * 8, max_tokens=16, shuffle=False)
    record = tmp_path / "masks"
    loader = ResumableDataLoader(
        list(range(8)),
        batch_sampler=sampler,
        num_workers=1,
        collate_fn=lambda batch: batch,
        worker_init_fn=functools.partial(_record_masks, str(record)),
    )
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    default = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(default_start, force=True)
    try:
        batches = list(loader)
    finally:
        multiprocessing.set_start_method(default, force=True)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert sorted(sum(batches, [])) == list(range(8))
    started, after = map(set, json.loads(record.read_text()))
    assert set(STOP_SIGNALS) <= started and not set(STOP_SIGNALS) & after
