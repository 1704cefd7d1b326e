"""The synthetic corpus: split hygiene, determinism, lengths, German grammar, and the on-disk cache."""

from __future__ import annotations

import hashlib
import json
import os
import statistics

import pytest

from aiayn.common.errors import UserError
from aiayn.lightning_modules.data import synthetic as syn
from aiayn.lightning_modules.data.synthetic import _NP, _Clause, _de_main, _de_pp, _de_sub, _en_clause, _Subj

NOUN = {n.en: n for n in syn._NOUNS}
VERB = {v.en: v for v in syn._VERBS}
ADJ = {a[0]: a for a in syn._ADJS}
PREP = {p[0]: p for p in syn._PREPS}
PRON = {p[0]: p for p in syn._PRONOUNS}

# Every finite German verb form the grammar can produce, separable ones also with the prefix rejoined.
FINITE = set(syn._HAVE_DE) | set(syn._SEIN_DE) | set(syn._CAN_DE)
for _v in syn._VERBS:
    for _forms in [_v.de] + ([_v.animal[0].split()] if _v.animal else []):
        FINITE |= {_v.prefix + f for f in _forms} | set(_forms)


def np_(noun: str, number: str = "sg", det: str = "the", *adjs: str) -> _NP:
    return _NP(NOUN[noun], number, det, [ADJ[a] for a in adjs])


def subj(*nps: _NP) -> _Subj:
    return _Subj(list(nps))


def pron(en: str) -> _Subj:
    p = PRON[en]
    return _Subj([_NP(pron=p)], person=p[2], number=p[3])


def clause(verb: str, s: _Subj, acc: _NP | None = None, dat: _NP | None = None, **kw) -> _Clause:
    c = _Clause(VERB[verb] if verb != "be" else syn._BE, s)
    c.acc, c.dat = acc, dat
    for k, v in kw.items():
        setattr(c, k, v)
    return c


@pytest.fixture(scope="module")
def corpus():
    """The whole grammar (up to 40 words): what the grammar tests below check."""
    return syn.generate(seed=99, n_train=4000, n_dev=300, n_test=300, max_words=syn.GRAMMAR_MAX_WORDS)


@pytest.fixture(scope="module")
def short():
    """The default corpus: the grammar's sentences of up to 10 words."""
    return syn.generate(seed=99, n_train=4000, n_dev=300, n_test=300)


# --------------------------------------------------------------------------------- splits and determinism


def test_golden_first_pairs_of_seed_1():
    c = syn.generate(seed=1, n_train=2, n_dev=1, n_test=1, max_words=syn.GRAMMAR_MAX_WORDS)
    assert c["train"] == [
        ("The horse helps the pig.", "Das Pferd hilft dem Schwein."),
        (
            "They help the black dog when a warm house has been new, and the daughters can show my fathers three bags.",
            "Sie helfen dem schwarzen Hund, wenn ein warmes Haus neu gewesen ist, und die Töchter können "
            "meinen Vätern drei Taschen zeigen.",
        ),
    ]
    assert c["dev"] == [("My lazy boy can visit a farmer.", "Mein fauler Junge kann einen Bauern besuchen.")]
    assert c["test"] == [
        (
            "The clever old mother has picked up the picture if she has carried two cups at night, and on my "
            "bridge the big boys have carried the small book.",
            "Die kluge alte Mutter hat das Bild aufgehoben, wenn sie in der Nacht zwei Tassen getragen hat, und "
            "auf meiner Brücke haben die großen Jungen das kleine Buch getragen.",
        ),
    ]


def test_same_seed_same_output_and_different_seed_differs():
    a = syn.generate(seed=5, n_train=300, n_dev=50, n_test=50)
    assert a == syn.generate(seed=5, n_train=300, n_dev=50, n_test=50)
    b = syn.generate(seed=6, n_train=300, n_dev=50, n_test=50)
    assert a["train"] != b["train"] and a["dev"] != b["dev"] and a["test"] != b["test"]


def test_global_rng_is_untouched():
    import random

    random.seed(0)
    before = random.random()
    random.seed(0)
    syn.generate(seed=3, n_train=50, n_dev=5, n_test=5)
    assert random.random() == before


def test_sizes_disjoint_and_no_duplicates(corpus):
    assert {k: len(v) for k, v in corpus.items()} == {"train": 4000, "dev": 300, "test": 300}
    en = {k: [p[0] for p in v] for k, v in corpus.items()}
    for name, sents in en.items():
        assert len(set(sents)) == len(sents), name
    assert not set(en["train"]) & set(en["dev"])
    assert not set(en["train"]) & set(en["test"])
    assert not set(en["dev"]) & set(en["test"])


def test_empty_splits_allowed_and_negative_rejected():
    assert syn.generate(seed=1, n_train=3, n_dev=0, n_test=0)["dev"] == []
    with pytest.raises(ValueError):
        syn.generate(seed=1, n_train=-1)


def test_length_distribution(corpus):
    pairs = [p for split in corpus.values() for p in split]
    for side in (0, 1):
        lengths = [len(p[side].split()) for p in pairs]
        assert min(lengths) >= 5 and max(lengths) <= 40
        assert 12 <= statistics.mean(lengths) <= 18, statistics.mean(lengths)
        # Long sentences must actually occur, or the model never has to attend far.
        assert sum(n >= 25 for n in lengths) >= 0.05 * len(lengths)


def test_default_corpus_is_the_grammars_short_sentences(short):
    pairs = [p for split in short.values() for p in split]
    for side in (0, 1):
        lengths = [len(p[side].split()) for p in pairs]
        assert min(lengths) >= 5 and max(lengths) <= syn.MAX_WORDS == 10
        assert 7 <= statistics.mean(lengths) <= 8.5, statistics.mean(lengths)
    with pytest.raises(ValueError, match="max_words must be in"):
        syn.generate(seed=1, n_train=3, max_words=4)


def test_surface_form(corpus):
    for en, de in corpus["train"][:500]:
        for s in (en, de):
            assert s[0].isupper() and s[-1] in ".?" and "  " not in s and " ," not in s
        assert (en[-1] == "?") == (de[-1] == "?")


@pytest.mark.parametrize("which", ["corpus", "short"])
def test_every_phenomenon_occurs(which, request):
    de = "\n".join(p[1] for p in request.getfixturevalue(which)["train"])
    for marker in [
        ", weil ",
        ", dass ",
        ", obwohl ",
        "Wenn ",
        " kein",
        " nicht ",
        " den ",
        " dem ",
        " im ",
        " zum ",
        " zur ",
        " ins ",
        " mit ",
        " für ",
        " durch ",
        " ist ",
        " hat ",
        " kann ",
        "?",
        " isst",
        " frisst",
        " ruft ",
        " anruft",
        "Heute ",
        "Gestern ",
    ]:
        assert marker in de, marker


# --------------------------------------------------------------------------------- German morphology


@pytest.mark.parametrize(
    ("det", "case", "expected"),
    [
        ("the", "nom", "der große Hund"),
        ("the", "acc", "den großen Hund"),
        ("the", "dat", "dem großen Hund"),
        ("a", "nom", "ein großer Hund"),
        ("a", "acc", "einen großen Hund"),
        ("a", "dat", "einem großen Hund"),
        ("this", "acc", "diesen großen Hund"),
        ("my", "dat", "meinem großen Hund"),
    ],
)
def test_masculine_articles_and_adjective_endings(det, case, expected):
    assert np_("dog", "sg", det, "big").de(case) == expected


def test_feminine_neuter_and_plural_endings():
    assert np_("cat", "sg", "the", "small").de("nom") == "die kleine Katze"
    assert np_("cat", "sg", "a", "small").de("dat") == "einer kleinen Katze"
    assert np_("house", "sg", "the", "old").de("acc") == "das alte Haus"
    assert np_("house", "sg", "a", "old").de("nom") == "ein altes Haus"
    assert np_("house", "sg", "my", "old").de("dat") == "meinem alten Haus"
    assert np_("dog", "pl", "the", "big").de("nom") == "die großen Hunde"
    assert np_("dog", "pl", "the", "big").de("dat") == "den großen Hunden"  # dative plural -n
    assert np_("dog", "pl", "bare", "big").de("acc") == "große Hunde"  # strong ending, no article
    assert np_("dog", "pl", "three", "big").de("dat") == "drei großen Hunden"
    assert np_("car", "pl", "the").de("dat") == "den Autos"  # no -n after -s
    assert np_("boy", "sg", "the").de("acc") == "den Jungen"  # weak masculine
    assert np_("bear", "sg", "a", "tired").de("nom") == "ein müder Bär"
    assert np_("apple", "sg", "a", "old").en() == "an old apple"
    assert np_("cat", "pl", "this").en() == "these cats"


def test_prepositions_govern_case_and_contract():
    assert _de_pp((PREP["with"], np_("dog"))) == "mit dem Hund"
    assert _de_pp((PREP["with"], np_("cat", "sg", "a"))) == "mit einer Katze"
    assert _de_pp((PREP["for"], np_("dog"))) == "für den Hund"
    assert _de_pp((PREP["without"], np_("boy", "sg", "a"))) == "ohne einen Jungen"
    assert _de_pp((PREP["to"], np_("school", "sg", "the", "big"))) == "zur großen Schule"
    assert _de_pp((PREP["to"], np_("house"))) == "zum Haus"
    assert _de_pp((PREP["in"], np_("garden"))) == "im Garten"  # location: dative
    assert _de_pp((PREP["into"], np_("garden"))) == "in den Garten"  # direction: accusative
    assert _de_pp((PREP["into"], np_("house"))) == "ins Haus"
    assert _de_pp((PREP["from"], np_("city", "pl", "the"))) == "von den Städten"


# --------------------------------------------------------------------------------- syntax


def test_accusative_and_dative_objects():
    c = clause("see", subj(np_("woman")), acc=np_("dog", "sg", "the", "big"))
    assert _de_main(c) == "die Frau sieht den großen Hund"
    assert _en_clause(c) == "the woman sees the big dog"
    c = clause("help", subj(np_("boy")), dat=np_("dog"))
    assert _de_main(c) == "der Junge hilft dem Hund"
    c = clause("give", subj(np_("man")), dat=np_("cat"), acc=np_("bone", "sg", "a"))
    assert _de_main(c) == "der Mann gibt der Katze einen Knochen"
    assert _en_clause(c) == "the man gives the cat a bone"


def test_subject_verb_agreement():
    bone = np_("bone")
    assert _de_main(clause("see", pron("he"), acc=bone)) == "er sieht den Knochen"
    assert _de_main(clause("see", pron("they"), acc=bone)) == "sie sehen den Knochen"
    assert _de_main(clause("see", pron("you"), acc=bone)) == "du siehst den Knochen"
    assert _de_main(clause("see", pron("I"), acc=bone)) == "ich sehe den Knochen"
    both = subj(np_("dog"), np_("cat"))
    assert _de_main(clause("see", both, acc=bone)) == "der Hund und die Katze sehen den Knochen"
    assert _en_clause(clause("see", both, acc=bone)) == "the dog and the cat see the bone"
    assert _en_clause(clause("be", pron("I"), adj=ADJ["hungry"])) == "I am hungry"


def test_eat_depends_on_animacy():
    assert _de_main(clause("eat", subj(np_("man")), acc=np_("apple"))) == "der Mann isst den Apfel"
    assert _de_main(clause("eat", subj(np_("dog")), acc=np_("apple"))) == "der Hund frisst den Apfel"


def test_verb_second_after_fronted_adverb_and_pp():
    c = clause("see", subj(np_("dog")), acc=np_("cat"), time=syn._TIME_ADVS[0], front="time")
    assert _en_clause(c) == "today the dog sees the cat"
    assert _de_main(c) == "heute sieht der Hund die Katze"
    c.front = None
    assert _de_main(c) == "der Hund sieht heute die Katze"
    c = clause("sleep", subj(np_("dog")), pps=[(PREP["in"], np_("garden"))], front="pp")
    assert _de_main(c) == "im Garten schläft der Hund"


def test_verb_final_in_subordinate_clause():
    c = clause("see", subj(np_("dog")), acc=np_("cat"))
    assert _de_sub(c) == "der Hund die Katze sieht"
    c.tense = "perf"
    assert _de_sub(c) == "der Hund die Katze gesehen hat"
    c.tense = "modal"
    assert _de_sub(c) == "der Hund die Katze sehen kann"


def test_perfect_modal_and_separable_brackets():
    c = clause("see", subj(np_("dog")), acc=np_("cat"), tense="perf")
    assert _de_main(c) == "der Hund hat die Katze gesehen"
    assert _en_clause(c) == "the dog has seen the cat"
    c = clause("go", subj(np_("dog")), pps=[(PREP["to"], np_("school"))], tense="perf")
    assert _de_main(c) == "der Hund ist zur Schule gegangen"  # sein-perfect for motion
    c = clause("call", subj(np_("man")), acc=np_("woman"))
    assert _de_main(c) == "der Mann ruft die Frau an"
    assert _de_sub(c) == "der Mann die Frau anruft"
    c.tense = "modal"
    assert _de_main(c) == "der Mann kann die Frau anrufen"
    c.tense = "perf"
    assert _de_main(c) == "der Mann hat die Frau angerufen"


def test_negation_nicht_and_kein():
    c = clause("see", subj(np_("dog")), acc=np_("cat"), neg=True)
    assert _en_clause(c) == "the dog does not see the cat"
    assert _de_main(c) == "der Hund sieht die Katze nicht"
    c.acc = np_("cat", "sg", "a")
    assert _de_main(c) == "der Hund sieht keine Katze"
    c = clause("be", subj(np_("dog")), adj=ADJ["hungry"], neg=True)
    assert _de_main(c) == "der Hund ist nicht hungrig"


def test_pronoun_copies_grammatical_gender():
    for noun, de in [("table", "er"), ("door", "sie"), ("house", "es"), ("dog", "er")]:
        p = subj(np_(noun)).pronoun()
        assert p.en() == "it" and p.de() == de


def test_mod_pp_precedes_location_in_german_only():
    c = clause("sleep", subj(np_("dog")), pps=[(PREP["in"], np_("garden")), (PREP["with"], np_("cat"))])
    assert _en_clause(c) == "the dog sleeps in the garden with the cat"
    assert _de_main(c) == "der Hund schläft mit der Katze im Garten"


def test_generated_v2_and_verb_final_hold_corpus_wide(corpus):
    fronted = subs = 0
    for _, de in corpus["train"]:
        words = de.split()
        if words[0] in ("Heute", "Gestern", "Jetzt", "Morgen", "Manchmal", "Oft"):
            fronted += 1
            assert words[1] in FINITE, de
        for conj in ("weil", "dass", "obwohl"):
            marker = f", {conj} "
            if marker in de:
                subs += 1
                clause_text = de.split(marker, 1)[1].split(",")[0].rstrip(".?")
                assert clause_text.split()[-1] in FINITE, de
    assert fronted > 100 and subs > 300


# --------------------------------------------------------------------------------- files


def test_write_corpus_writes_and_reuses(tmp_path):
    out = tmp_path / "corpus"
    got = syn.write_corpus(out, seed=2, n_train=40, n_dev=7, n_test=5)
    assert got == out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["dev.de", "dev.en", "meta.json", "test.de", "test.en", "train.de", "train.en"]
    expected = syn.generate(seed=2, n_train=40, n_dev=7, n_test=5)
    for split, n in (("train", 40), ("dev", 7), ("test", 5)):
        en = (out / f"{split}.en").read_text(encoding="utf-8").splitlines()
        de = (out / f"{split}.de").read_text(encoding="utf-8").splitlines()
        assert len(en) == len(de) == n
        assert list(zip(en, de, strict=True)) == expected[split]
    assert json.loads((out / "meta.json").read_text())["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no temp dir left behind

    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    os.utime(out / "train.en", ns=(1, 1))  # make any rewrite visible even on coarse clocks
    assert syn.write_corpus(str(out), seed=2, n_train=40, n_dev=7, n_test=5) == out
    assert (out / "train.en").stat().st_mtime_ns == 1
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "train.en"} == {
        k: v for k, v in stamps.items() if k != "train.en"
    }

    syn.write_corpus(out, seed=3, n_train=40, n_dev=7, n_test=5)  # new parameters: regenerated
    assert json.loads((out / "meta.json").read_text())["seed"] == 3
    assert (out / "train.en").stat().st_mtime_ns != 1
    assert len((out / "train.en").read_text(encoding="utf-8").splitlines()) == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_write_corpus_refuses_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError):
        syn.write_corpus(tmp_path, n_train=5, n_dev=1, n_test=1)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_write_corpus_into_existing_empty_dir(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    syn.write_corpus(out, n_train=5, n_dev=1, n_test=1)
    assert (out / "meta.json").is_file()


def test_the_lexicon_file_gives_the_corpus_the_lexicon_in_code_gave():
    """The lexicon moved from Python literals to synthetic_lexicon.json; the sha256 was taken from the
    code before the move (566b6cd) and matches the default corpus's first 3000 long-sentence pairs after it."""
    c = syn.generate(seed=7, n_train=3000, n_dev=100, n_test=100, max_words=40)
    digest = hashlib.sha256(json.dumps(c, ensure_ascii=False).encode()).hexdigest()
    assert digest == "c907d35001eb0b8221b0f09e4407b6ea2646a7368743101d6990e5e242960850"


def test_an_edited_lexicon_regenerates_the_cached_corpus(tmp_path, monkeypatch):
    out = syn.write_corpus(tmp_path / "c", seed=2, n_train=20, n_dev=3, n_test=3)
    assert json.loads((out / "meta.json").read_text())["lexicon_sha256"] == syn.LEXICON_SHA256
    os.utime(out / "train.en", ns=(1, 1))
    monkeypatch.setattr(syn, "LEXICON_SHA256", "0" * 64)
    syn.write_corpus(out, seed=2, n_train=20, n_dev=3, n_test=3)
    assert (out / "train.en").stat().st_mtime_ns != 1
    assert json.loads((out / "meta.json").read_text())["lexicon_sha256"] == "0" * 64


def test_a_malformed_lexicon_entry_is_named(tmp_path):
    lex = json.loads(syn.LEXICON_PATH.read_text(encoding="utf-8"))
    lex["verbs"][0]["de"] = "sehe sieht"
    path = tmp_path / "lexicon.json"
    path.write_text(json.dumps(lex, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ValueError, match="'see'.*4 forms"):
        syn._load_lexicon(path)
