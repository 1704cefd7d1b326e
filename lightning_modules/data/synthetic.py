"""A built-in offline English -> German-like corpus, generated from a small grammar and lexicon.

Why it exists: the Table 3 sweeps must run offline on a CPU in minutes, so the default corpus has to be
small enough that a tiny Transformer (d_model ~128, 2-3 layers, ~300k target tokens) clearly learns it,
yet structured enough that it does not saturate, so that architecture variations (heads, d_k, depth,
dropout, positional encodings) still rank differently. A word-for-word cipher would be learned by any
model; this grammar needs attention over structure-dependent distances instead.

What the grammar covers (all of it realised correctly on the German side):

* a bilingual lexicon (synthetic_lexicon.json: 65 nouns, 40 verbs, 28 adjectives, adverbs, prepositions,
  numbers) with real German forms, umlauts and ß in UTF-8;
* grammatical gender and case: articles (der/ein/dieser/mein/kein) and attributive adjectives take the
  weak, mixed or strong endings of nominative, accusative and dative, singular and plural (dative
  plural -n, weak masculine nouns such as "den Jungen", "dem Bären");
* case government: accusative and dative objects (helfen, folgen + dative; geben, zeigen with both),
  prepositions with dative (mit, von, zu, in, auf, hinter, vor) or accusative (für, ohne, durch, "into"
  = in + accusative), contractions (im, ins, zum, zur, vom);
* subject-verb agreement in person and number (ich sehe, du siehst, er sieht, wir/sie sehen),
  irregular stems, coordinated subjects taking plural verbs, pronouns that copy the antecedent's
  grammatical gender ("the table ... it" -> "der Tisch ... er"), essen vs fressen by animacy;
* clause structure: verb-second main clauses (a fronted adverb, prepositional phrase or subordinate
  clause puts the finite verb before the subject), verb-first yes/no questions, verb-final subordinate
  clauses (weil, dass, wenn, während, obwohl), perfect tense with haben/sein and a clause-final
  participle, the modal "can" with a clause-final infinitive, separable verbs (ruft ... an / anruft),
  negation with nicht or kein, and adverbial/prepositional order that differs from English.

Sentences are 5-10 whitespace-separated words on both sides (punctuation attached to the word before
it), mean about 7.7: the grammar generates up to 40 words (mean 14.5) from coordination, subordinate
clauses, PPs and adjectives, and `max_words` keeps the short ones. Why 10 by default: the whole tiny
Table 3 has to train in 15 minutes on 2 CPU cores, a few hundred steps per row; with sentences up to 40
words a tiny Transformer starts to align source and target only after ~800 steps of 1024 tokens, with
up to 10 words after ~200 (measured, docs/history/benchmarks.md). `write_corpus(..., max_words=40)` gives the long
corpus.
Verbs restrict their subjects and objects (only people read, only fliers fly), but meaning is not
otherwise checked, so "the bag is white because it is red" can occur; English pronouns are only used
where their antecedent is unambiguous, so every English sentence has exactly one German translation.
`generate` is deterministic from its seed alone (its own `random.Random`, lists rather than sets).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import random
import shutil
import tempfile

from aiayn.common.errors import UserError
from aiayn.common.files import read_json

__all__ = ["generate", "write_corpus"]

# Bump whenever the grammar changes, so that cached corpora on disk are regenerated (a changed lexicon file does
# this by itself: its sha256 is in the cached corpus's meta.json).
GRAMMAR_VERSION = 2  # 2: sentences up to MAX_WORDS = 10 words by default (was 40)

MIN_WORDS = 5
MAX_WORDS = 10  # the default; the grammar itself reaches GRAMMAR_MAX_WORDS
GRAMMAR_MAX_WORDS = 40
SPLIT_NAMES = ("train", "dev", "test")
_GENDER_INDEX = {"m": 0, "f": 1, "n": 2}


# --------------------------------------------------------------------------------------------- lexicon


class _Noun:
    __slots__ = ("en", "en_pl", "de", "de_pl", "gender", "tags", "weak", "en_pron")

    def __init__(self, en, en_pl, de, de_pl, gender, tags, weak=False, en_pron="it"):
        self.en, self.en_pl, self.de, self.de_pl = en, en_pl, de, de_pl
        self.gender = gender
        # Every noun is "any", so verbs that accept anything can say so with one tag.
        self.tags = frozenset(tags.split()) | {"any"}
        self.weak = weak
        self.en_pron = en_pron

    def de_form(self, number: str, case: str) -> str:
        if number == "sg":
            # Weak masculine nouns (der Junge, den Jungen) inflect outside the nominative.
            return self.de_pl if (self.weak and case != "nom") else self.de
        if case == "dat" and not self.de_pl.endswith(("n", "s")):
            return self.de_pl + "n"
        return self.de_pl


class _Verb:
    __slots__ = ("en", "en3", "enpp", "de", "inf", "pp", "aux", "prefix", "frame", "subj", "obj", "obj2", "animal")

    def __init__(self, en, en3, enpp, de, inf, pp, frame, subj, obj="", obj2="", aux="h", prefix="", animal=None):
        self.en, self.en3, self.enpp = en, en3, enpp
        self.de = de.split()  # 1sg, 2sg, 3sg, plural (1pl = 3pl)
        self.inf, self.pp, self.aux, self.prefix = inf, pp, aux, prefix
        self.frame = frame
        self.subj = subj.split()
        self.obj = obj.split()  # accusative object (tr, ditr) or the dative object (dat)
        self.obj2 = obj2.split()  # dative (indirect) object of ditransitives
        # German distinguishes eating people (essen) from eating animals (fressen).
        self.animal = animal


def _load_lexicon(path: pathlib.Path) -> dict:
    """The lexicon as data (synthetic_lexicon.json, beside this file): words, their forms and the tags that
    say which words combine. The grammar below (agreement, case, word order) is code."""
    lex = json.loads(path.read_text(encoding="utf-8"))
    for kind, entries in (("nouns", lex["nouns"]), ("verbs", lex["verbs"] + [lex["be"]])):
        for d in entries:  # the forms the grammar indexes by position: a short list fails far from the cause
            bad = (d["gender"] not in _GENDER_INDEX) if kind == "nouns" else len(d["de"].split()) != 4
            if bad:
                raise ValueError(
                    f"{path}: {kind} entry {d['en']!r}: gender must be m/f/n and a verb's 'de' "
                    "must hold 4 forms (1sg 2sg 3sg plural)"
                )
    return lex


LEXICON_PATH = pathlib.Path(__file__).with_name("synthetic_lexicon.json")
LEXICON_SHA256 = hashlib.sha256(LEXICON_PATH.read_bytes()).hexdigest()
_LEX = _load_lexicon(LEXICON_PATH)


def _verb(d: dict) -> _Verb:
    animal = d.get("animal")
    return _Verb(
        d["en"],
        d["en3"],
        d["enpp"],
        d["de"],
        d["inf"],
        d["pp"],
        d["frame"],
        d["subj"],
        d.get("obj", ""),
        d.get("obj2", ""),
        d.get("aux", "h"),
        d.get("prefix", ""),
        (animal["de"], animal["inf"], animal["pp"]) if animal else None,
    )


_NOUNS = [
    _Noun(
        d["en"], d["en_pl"], d["de"], d["de_pl"], d["gender"], d["tags"], d.get("weak", False), d.get("en_pron", "it")
    )
    for d in _LEX["nouns"]
]
# (English, German stem form, order rank, tags of nouns it may modify). English and German both put
# opinion/quality before size before age before colour, so sorting by rank gives natural order.
_ADJS = [(d["en"], d["de"], d["rank"], frozenset(d["tags"].split())) for d in _LEX["adjectives"]]
_VERBS = [_verb(d) for d in _LEX["verbs"]]
_BE = _verb(_LEX["be"])
_HAVE_DE = _LEX["have_de"].split()
_SEIN_DE = _BE.de
_CAN_DE = _LEX["can_de"].split()
_VERBS_BY_FRAME: dict[str, list[_Verb]] = {}
for _v in _VERBS:
    _VERBS_BY_FRAME.setdefault(_v.frame, []).append(_v)
_VERBS_BY_FRAME["cop"] = [_BE]
# Weights make transitive clauses the backbone while every frame is frequent enough to be learned.
_FRAMES = list(_LEX["frames"].items())
# (English, German, tenses it fits); "yesterday" only with the perfect, "now"/"tomorrow" not with it.
_TIME_ADVS = [(d["en"], d["de"], d["tenses"]) for d in _LEX["time_adverbs"]]
_FREQ_ADVS = [(d["en"], d["de"]) for d in _LEX["frequency_adverbs"]]
_NUMBERS = [(d["en"], d["de"]) for d in _LEX["numbers"]]
# (English, German, case, kind, noun tags). Kinds: "loc"/"dir" share German's last middle-field slot,
# "mod" (with/for/without) precedes them in German but follows them in English.
_PREPS = [(d["en"], d["de"], d["case"], d["kind"], d["tags"].split()) for d in _LEX["prepositions"]]
_PREPS_BY_KIND: dict[str, list] = {}
for _p in _PREPS:
    _PREPS_BY_KIND.setdefault(_p[3], []).append(_p)
_CONTRACTIONS = {(d["prep"], d["article"]): d["form"] for d in _LEX["contractions"]}
# (English, German, may precede the main clause)
_SUB_CONJS = [(d["en"], d["de"], d["may_front"]) for d in _LEX["subordinating_conjunctions"]]
# (English, German, person, number)
_PRONOUNS = [(d["en"], d["de"], d["person"], d["number"]) for d in _LEX["pronouns"]]
_DE_PRON = {"m": "er", "f": "sie", "n": "es"}
_PERSON_TAGS = frozenset(["person", "animate", "any"])

# ------------------------------------------------------------------------------------------ morphology

_DER = {"nom": ("der", "die", "das", "die"), "acc": ("den", "die", "das", "die"), "dat": ("dem", "der", "dem", "den")}
_DIES_ENDINGS = {"nom": ("er", "e", "es", "e"), "acc": ("en", "e", "es", "e"), "dat": ("em", "er", "em", "en")}


def _de_det(det: str, gender: str, number: str, case: str) -> str:
    """German determiner for an English determiner kind; '' for bare plurals and a numeral for numbers."""
    idx = 3 if number == "pl" else _GENDER_INDEX[gender]
    if det == "the":
        return _DER[case][idx]
    if det == "this":
        return "dies" + _DIES_ENDINGS[case][idx]
    if det in ("a", "my", "no"):
        stem = {"a": "ein", "my": "mein", "no": "kein"}[det]
        endings = {"nom": ("", "e", "", "e"), "acc": ("en", "e", "", "e"), "dat": ("em", "er", "em", "en")}
        return stem + endings[case][idx]
    if det == "bare":
        return ""
    return dict(_NUMBERS)[det]


def _adj_ending(det: str, gender: str, number: str, case: str) -> str:
    """Weak after der/dieser, mixed after ein/mein/kein, strong with no article (plural only here)."""
    if det in ("bare", "two", "three", "four", "five"):
        return "en" if case == "dat" else "e"
    if number == "pl" or case == "dat":
        return "en"
    if det in ("the", "this"):
        return "en" if (case == "acc" and gender == "m") else "e"
    # ein-type determiners carry no ending in m nom / n nom+acc, so the adjective shows gender instead
    if gender == "m":
        return "er" if case == "nom" else "en"
    if gender == "n":
        return "es"
    return "e"


def _inflect_adj(stem: str, ending: str) -> str:
    return (stem[:-1] if stem.endswith("e") else stem) + ending


def _en_article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


# ----------------------------------------------------------------------------------------- structures


class _NP:
    """A noun phrase: determiner kind, adjectives and a noun, or a personal pronoun (subjects only)."""

    __slots__ = ("noun", "number", "det", "adjs", "pron")

    def __init__(self, noun=None, number="sg", det="the", adjs=(), pron=None):
        self.noun, self.number, self.det, self.adjs, self.pron = noun, number, det, list(adjs), pron

    def en(self) -> str:
        if self.pron:
            return self.pron[0]
        words = [a[0] for a in self.adjs] + [self.noun.en if self.number == "sg" else self.noun.en_pl]
        det = self.det
        if det == "a":
            return " ".join([_en_article(words[0])] + words)
        if det == "bare":
            return " ".join(words)
        det_en = {"the": "the", "my": "my", "this": "this" if self.number == "sg" else "these"}.get(det, det)
        return " ".join([det_en] + words)

    def de(self, case: str, det: str | None = None) -> str:
        if self.pron:
            return self.pron[1]
        det = det or self.det
        g = self.noun.gender
        words = [_de_det(det, g, self.number, case)]
        ending = _adj_ending(det, g, self.number, case)
        words += [_inflect_adj(a[1], ending) for a in self.adjs]
        words.append(self.noun.de_form(self.number, case))
        return " ".join(w for w in words if w)


class _Subj:
    """Clause subject: one NP, a coordination of NPs, or a pronoun; knows its agreement features."""

    __slots__ = ("nps", "person", "number", "tag_sets", "en_pron", "de_pron")

    def __init__(self, nps, person=3, number=None):
        self.nps = nps
        self.person = person
        self.number = number or ("pl" if len(nps) > 1 else nps[0].number)
        self.tag_sets = [_PERSON_TAGS if np.pron else np.noun.tags for np in nps]
        if len(nps) > 1 or self.number == "pl":
            self.en_pron, self.de_pron = "they", "sie"
        elif nps[0].pron:
            self.en_pron, self.de_pron = nps[0].pron[0], nps[0].pron[1]
        else:
            self.en_pron, self.de_pron = nps[0].noun.en_pron, _DE_PRON[nps[0].noun.gender]

    def en(self) -> str:
        return " and ".join(np.en() for np in self.nps)

    def de(self) -> str:
        return " und ".join(np.de("nom") for np in self.nps)

    def accepts(self, tags) -> bool:
        return all(any(t in ts for t in tags) for ts in self.tag_sets)

    def all_persons(self) -> bool:
        return all("person" in ts for ts in self.tag_sets)

    def pronoun(self) -> _Subj:
        """The anaphoric pronoun for this subject; German copies grammatical gender, English does not."""
        np = _NP(pron=(self.en_pron, self.de_pron, self.person, self.number))
        sub = _Subj([np], person=self.person if self.nps[0].pron else 3, number=self.number)
        sub.tag_sets = self.tag_sets
        return sub


class _Clause:
    __slots__ = ("verb", "subj", "tense", "neg", "time", "freq", "dat", "acc", "pps", "adj", "comp", "front")

    def __init__(self, verb, subj):
        self.verb, self.subj = verb, subj
        self.tense = "pres"
        self.neg = False
        self.time = self.freq = self.dat = self.acc = self.adj = self.comp = self.front = None
        self.pps: list = []  # (prep, np); English order, German puts "mod" PPs first

    def nps(self):
        """Every NP in the clause except the subject: the competitors for an anaphoric pronoun."""
        out = [np for np in (self.dat, self.acc) if np is not None]
        return out + [np for _, np in self.pps]


# ------------------------------------------------------------------------------------------ generation


def _pick_adjs(rng: random.Random, noun: _Noun) -> list:
    r = rng.random()
    n = 0 if r < 0.62 else (1 if r < 0.92 else 2)
    if not n:
        return []
    fits = _ADJS_BY_NOUN.get(noun.en)
    if fits is None:
        fits = _ADJS_BY_NOUN[noun.en] = [a for a in _ADJS if a[3] & noun.tags]
    first = rng.choice(fits)
    if n == 1:
        return [first]
    # Two adjectives of the same rank ("hungry tired dog") read badly in both languages.
    rest = [a for a in fits if a[2] != first[2]]
    if not rest:
        return [first]
    return sorted([first, rng.choice(rest)], key=lambda a: a[2])


_NOUNS_BY_TAGS: dict[tuple, list[_Noun]] = {}
_FITTING: dict[tuple, list] = {}  # (frame or "adj", subject tag sets) -> verbs or adjectives that fit
_FRAME_NAMES = [f for f, _ in _FRAMES]
_FRAME_CUM = list(itertools.accumulate(w for _, w in _FRAMES))
_TIME_BY_TENSE = {t: [a for a in _TIME_ADVS if t in a[2].split()] for t in ("pres", "perf", "modal")}
_ADJS_BY_NOUN: dict[str, list] = {}


def _nouns_for(tags) -> list[_Noun]:
    key = tuple(tags)
    if key not in _NOUNS_BY_TAGS:
        _NOUNS_BY_TAGS[key] = [n for n in _NOUNS if any(t in n.tags for t in tags)]
    return _NOUNS_BY_TAGS[key]


def _make_np(rng: random.Random, tags, exclude=(), allow_numbers=True) -> _NP:
    nouns = _nouns_for(tags)
    noun = rng.choice(nouns)
    # Redraw rather than filter: cheap, and a clause rarely reuses one noun ("the dog sees the dog").
    for _ in range(5):
        if noun not in exclude:
            break
        noun = rng.choice(nouns)
    number = "pl" if rng.random() < 0.3 else "sg"
    r = rng.random()
    if number == "sg":
        det = "the" if r < 0.55 else ("a" if r < 0.8 else ("this" if r < 0.88 else "my"))
    else:
        det = "the" if r < 0.45 else ("bare" if r < 0.7 else ("this" if r < 0.78 else "my"))
        if allow_numbers and rng.random() < 0.15:
            det = rng.choice(_NUMBERS)[0]
    return _NP(noun, number, det, _pick_adjs(rng, noun))


def _make_subj(rng: random.Random, verb: _Verb) -> _Subj:
    r = rng.random()
    if r < 0.14 and any(t in _PERSON_TAGS for t in verb.subj):
        en, de, person, number = rng.choice(_PRONOUNS)
        return _Subj([_NP(pron=(en, de, person, number))], person=person, number=number)
    first = _make_np(rng, verb.subj)
    if r < 0.22:
        second = _make_np(rng, verb.subj, exclude=(first.noun,))
        return _Subj([first, second])
    return _Subj([first])


def _add_pp(rng: random.Random, clause: _Clause, kind: str, exclude) -> None:
    prep = rng.choice(_PREPS_BY_KIND[kind])
    np = _make_np(rng, prep[4], exclude=exclude, allow_numbers=not clause.neg)
    clause.pps.append((prep, np))


def _make_clause(rng: random.Random, subj: _Subj | None = None, frame: str | None = None, main: bool = True) -> _Clause:
    if frame is None:
        frame = rng.choices(_FRAME_NAMES, cum_weights=_FRAME_CUM)[0]
    verbs = _VERBS_BY_FRAME[frame]
    if subj is not None:
        key = (frame, tuple(subj.tag_sets))
        if key not in _FITTING:
            # Only the copula takes any subject (things included), so it is the fallback.
            _FITTING[key] = [v for v in verbs if subj.accepts(v.subj)] or _VERBS_BY_FRAME["cop"]
        verbs = _FITTING[key]
    verb = rng.choice(verbs)
    if subj is None:
        subj = _make_subj(rng, verb)
    c = _Clause(verb, subj)
    r = rng.random()
    c.tense = "pres" if r < 0.55 else ("perf" if r < 0.83 else "modal")
    if verb.frame == "that" and c.tense == "modal":
        c.tense = "pres"
    c.neg = rng.random() < 0.15
    used = [np.noun for np in subj.nps if np.noun]
    if rng.random() < 0.25:
        c.time = rng.choice(_TIME_BY_TENSE[c.tense])
    if not c.neg and c.tense != "modal" and rng.random() < 0.12:
        c.freq = rng.choice(_FREQ_ADVS)

    f = verb.frame
    if f == "cop":
        key = ("adj", tuple(subj.tag_sets))
        if key not in _FITTING:
            _FITTING[key] = [a for a in _ADJS if subj.accepts(a[3])]
        c.adj = rng.choice(_FITTING[key])
    elif f in ("tr", "dat", "ditr"):
        if f == "ditr":
            c.dat = _make_np(rng, verb.obj2, exclude=used, allow_numbers=not c.neg)
            used.append(c.dat.noun)
        obj = _make_np(rng, verb.obj, exclude=used, allow_numbers=not c.neg)
        used.append(obj.noun)
        if f == "dat":
            c.dat = obj
        else:
            c.acc = obj
    if f == "motion":
        if rng.random() < 0.85:
            _add_pp(rng, c, "dir", used)
        if rng.random() < 0.2:
            _add_pp(rng, c, "mod", used)
    elif f in ("tr", "intr", "dat", "ditr"):
        p_loc, p_mod = {"tr": (0.22, 0.15), "intr": (0.55, 0.25), "dat": (0.25, 0.1), "ditr": (0.2, 0.05)}[f]
        if rng.random() < p_loc:
            _add_pp(rng, c, "loc", used)
        if rng.random() < p_mod:
            _add_pp(rng, c, "mod", used)
    if main:
        if c.time and (f == "that" or rng.random() < 0.45):
            c.front = "time"
        elif any(p[0][3] == "loc" for p in c.pps) and rng.random() < 0.3:
            c.front = "pp"
        elif c.freq and c.freq[0] in ("often", "sometimes") and rng.random() < 0.3:
            c.front = "freq"
    return c


# ------------------------------------------------------------------------------------------- rendering


def _en_verb(c: _Clause, question: bool = False) -> tuple[list[str], list[str]]:
    """English (pre-subject auxiliary for questions, verb group after the subject)."""
    v, s = c.verb, c.subj
    third_sg = s.person == 3 and s.number == "sg"
    freq = [c.freq[0]] if c.freq and c.front != "freq" else []
    neg = ["not"] if c.neg else []
    if c.tense == "perf":
        aux = "has" if third_sg else "have"
        return ([aux], freq + [v.enpp]) if question else ([], [aux] + neg + freq + [v.enpp])
    if c.tense == "modal":
        if question:
            return ["can"], [v.en]
        return [], (["cannot"] if c.neg else ["can"]) + [v.en]
    if v is _BE:
        form = "am" if (s.person == 1 and s.number == "sg") else ("is" if third_sg else "are")
        return ([form], freq) if question else ([], [form] + neg + freq)
    if question:
        return (["does" if third_sg else "do"], [v.en])
    if c.neg:
        return [], ["does" if third_sg else "do", "not", v.en]
    return [], freq + [v.en3 if third_sg else v.en]


def _en_pp(pp) -> str:
    return pp[0][0] + " " + pp[1].en()


def _en_clause(c: _Clause, main: bool = True, question: bool = False) -> str:
    words = []
    front = c.front if main and not question else None
    loc_pps = [p for p in c.pps if p[0][3] != "mod"]
    mod_pps = [p for p in c.pps if p[0][3] == "mod"]
    if front == "time":
        words.append(c.time[0])
    elif front == "pp":
        words.append(_en_pp(loc_pps[0]))
        loc_pps = loc_pps[1:]
    elif front == "freq":
        words.append(c.freq[0])
    pre, post = _en_verb(c, question)
    words += pre + [c.subj.en()] + post
    if c.adj:
        words.append(c.adj[0])
    for np in (c.dat, c.acc):
        if np is not None:
            words.append(np.en())
    words += [_en_pp(p) for p in loc_pps + mod_pps]
    if c.time and front != "time":
        words.append(c.time[0])
    if c.comp is not None:
        words += ["that", _en_clause(c.comp, main=False)]
    return " ".join(words)


def _de_pp(pp) -> str:
    prep, np = pp
    de_prep, case = prep[1], prep[2]
    det = _de_det(np.det, np.noun.gender, np.number, case) if np.det == "the" else ""
    short = _CONTRACTIONS.get((de_prep, det))
    if short:
        # The contraction absorbs the article; the adjectives keep their weak endings.
        return short + " " + np.de(case)[len(det) + 1 :]
    return de_prep + " " + np.de(case)


def _de_parts(c: _Clause) -> tuple[str, list[str], str]:
    """German (finite verb, middle field, right bracket) for a clause; the caller orders them."""
    v, s = c.verb, c.subj
    idx = (s.person - 1) if s.number == "sg" else 3
    de_forms, inf, pp = v.de, v.inf, v.pp
    if v.animal and not s.all_persons():
        de_forms, inf, pp = v.animal[0].split(), v.animal[1], v.animal[2]
    if c.tense == "perf":
        finite, right = (_SEIN_DE if v.aux == "s" else _HAVE_DE)[idx], pp
    elif c.tense == "modal":
        finite, right = _CAN_DE[idx], v.prefix + inf
    else:
        finite, right = de_forms[idx], v.prefix

    middle = []
    if c.time and c.front != "time":
        middle.append(c.time[1])
    if c.freq and c.front != "freq":
        middle.append(c.freq[1])
    # Negating an indefinite object turns its article into kein; otherwise nicht follows the objects.
    target = c.acc if c.acc is not None else c.dat
    use_kein = c.neg and target is not None and target.det in ("a", "bare")
    for np, case in ((c.dat, "dat"), (c.acc, "acc")):
        if np is not None:
            middle.append(np.de(case, det="no" if (use_kein and np is target) else None))
    if c.neg and not use_kein:
        middle.append("nicht")
    pps = [p for p in c.pps if p[0][3] == "mod"] + [p for p in c.pps if p[0][3] != "mod"]
    if c.front == "pp":
        pps.remove(next(p for p in c.pps if p[0][3] == "loc"))
    middle += [_de_pp(p) for p in pps]
    if c.adj:
        middle.append(c.adj[1])
    return finite, middle, right


def _de_main(c: _Clause, prefield: str | None = None, question: bool = False) -> str:
    finite, middle, right = _de_parts(c)
    if question:
        words = [finite, c.subj.de()]
    else:
        if prefield is None:
            if c.front == "time":
                prefield = c.time[1]
            elif c.front == "pp":
                prefield = _de_pp(next(p for p in c.pps if p[0][3] == "loc"))
            elif c.front == "freq":
                prefield = c.freq[1]
        # Verb second: whatever fills the first position pushes the subject behind the finite verb.
        words = [prefield, finite, c.subj.de()] if prefield else [c.subj.de(), finite]
    words += middle
    if right:
        words.append(right)
    out = " ".join(words)
    if c.comp is not None:
        out += ", dass " + _de_sub(c.comp)
    return out


def _de_sub(c: _Clause) -> str:
    finite, middle, right = _de_parts(c)
    if c.tense == "pres":
        # Verb final: a separable prefix rejoins its verb (anruft).
        tail = [right + finite]
    else:
        tail = [right, finite]
    return " ".join([c.subj.de()] + middle + tail)


# --------------------------------------------------------------------------------------------- sentences


def _pronoun_safe(antecedent: _Subj, clause: _Clause) -> bool:
    """True if an English pronoun for the subject could only mean the subject in this clause.

    Otherwise "the dog sees the cat because it ..." would leave the German er/sie a coin flip.
    """
    return all((np.noun.en_pron if np.number == "sg" else "they") != antecedent.en_pron for np in clause.nps())


def _maybe_pronoun(rng: random.Random, antecedent: _Clause, p: float) -> _Subj | None:
    s = antecedent.subj
    if s.nps[0].pron or not _pronoun_safe(s, antecedent) or rng.random() >= p:
        return None
    return s.pronoun()


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _sentence(rng: random.Random) -> tuple[str, str]:
    r = rng.random()
    if r < 0.28:  # simple main clause
        c = _make_clause(rng)
        en, de = _en_clause(c), _de_main(c)
    elif r < 0.35:  # yes/no question: verb first in German, do-support/inversion in English
        c = _make_clause(rng, main=False)
        c.neg, c.freq = False, None
        return _cap(_en_clause(c, question=True)) + "?", _cap(_de_main(c, question=True)) + "?"
    elif r < 0.50:  # coordination of main clauses; und keeps verb second, aber takes a comma
        a, b = _make_clause(rng), _make_clause(rng)
        if rng.random() < 0.6:
            en = _en_clause(a) + ", and " + _en_clause(b)
            de = _de_main(a) + " und " + _de_main(b)
        else:
            en = _en_clause(a) + ", but " + _en_clause(b)
            de = _de_main(a) + ", aber " + _de_main(b)
    elif r < 0.70 or r >= 0.92:  # main clause + verb-final subordinate clause (+ coordinated clause)
        a = _make_clause(rng)
        conj = rng.choice(_SUB_CONJS)
        b = _make_clause(rng, subj=_maybe_pronoun(rng, a, 0.4), main=False)
        en = _en_clause(a) + " " + conj[0] + " " + _en_clause(b, main=False)
        de = _de_main(a) + ", " + conj[1] + " " + _de_sub(b)
        if r >= 0.92:
            d = _make_clause(rng)
            en += ", and " + _en_clause(d)
            de += ", und " + _de_main(d)
    elif r < 0.80:  # fronted subordinate clause fills the German first position: verb comes next
        conj = rng.choice([cj for cj in _SUB_CONJS if cj[2]])
        b = _make_clause(rng, main=False)
        a = _make_clause(rng, subj=_maybe_pronoun(rng, b, 0.4), main=False)
        en = conj[0] + " " + _en_clause(b, main=False) + ", " + _en_clause(a, main=False)
        de = conj[1] + " " + _de_sub(b) + ", " + _de_main_after_clause(a)
    else:  # "that" complement clause, extraposed after the German right bracket
        a = _make_clause(rng, frame="that")
        a.comp = _make_clause(rng, subj=_maybe_pronoun(rng, a, 0.35), main=False)
        en, de = _en_clause(a), _de_main(a)
    return _cap(en) + ".", _cap(de) + "."


def _de_main_after_clause(c: _Clause) -> str:
    """Main clause whose first position is taken by a preceding subordinate clause: finite verb first."""
    return _de_main(c, question=True)


def _n_words(text: str) -> int:
    return len(text.split())


def generate(
    seed: int = 1234, n_train: int = 24000, n_dev: int = 1000, n_test: int = 1000, max_words: int = MAX_WORDS
) -> dict[str, list[tuple[str, str]]]:
    """Return {"train": [(en, de), ...], "dev": [...], "test": [...]}.

    Splits are disjoint by English sentence and free of duplicates, sizes are exactly as requested,
    and the output depends only on the arguments (a private random.Random(seed), no set iteration).
    """
    sizes = (n_train, n_dev, n_test)
    if any(n < 0 for n in sizes):
        raise ValueError(f"split sizes must be >= 0, got {sizes}")
    if not MIN_WORDS <= max_words <= GRAMMAR_MAX_WORDS:
        raise ValueError(f"max_words must be in [{MIN_WORDS}, {GRAMMAR_MAX_WORDS}], got {max_words}")
    rng = random.Random(seed)
    total = sum(sizes)
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    attempts = 0
    # The grammar yields far more than 10^7 distinct sentences (about 30% of them up to 10 words), so
    # this only trips on absurd sizes.
    max_attempts = 50 * total + 1000
    while len(pairs) < total:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"could not generate {total} distinct sentences; ask for fewer")
        en, de = _sentence(rng)
        if en in seen or not (MIN_WORDS <= _n_words(en) <= max_words and MIN_WORDS <= _n_words(de) <= max_words):
            continue
        seen.add(en)
        pairs.append((en, de))
    out, start = {}, 0
    for name, n in zip(SPLIT_NAMES, sizes, strict=True):
        out[name] = pairs[start : start + n]
        start += n
    return out


# ------------------------------------------------------------------------------------------------ files


def _meta(seed: int, n_train: int, n_dev: int, n_test: int, max_words: int) -> dict:
    return {
        "max_words": max_words,
        "generator": "aiayn.synthetic",
        "grammar_version": GRAMMAR_VERSION,
        "lexicon_sha256": LEXICON_SHA256,
        "seed": seed,
        "n_train": n_train,
        "n_dev": n_dev,
        "n_test": n_test,
    }


def _corpus_files() -> list[str]:
    return [f"{split}.{lang}" for split in SPLIT_NAMES for lang in ("en", "de")]


def _is_complete(out_dir: pathlib.Path, meta: dict) -> bool:
    try:
        stored = read_json(out_dir / "meta.json", 1 << 20)
    except (OSError, ValueError):
        return False
    return stored == meta and all((out_dir / name).is_file() for name in _corpus_files())


def write_corpus(
    out_dir: str | os.PathLike,
    seed: int = 1234,
    n_train: int = 24000,
    n_dev: int = 1000,
    n_test: int = 1000,
    max_words: int = MAX_WORDS,
) -> pathlib.Path:
    """Write {train,dev,test}.{en,de} and meta.json into out_dir, or reuse a matching corpus there.

    The corpus is built in a temporary sibling directory and renamed into place, so an interrupted run
    never leaves a half-written corpus that a later run would mistake for a complete one. meta.json is
    written last inside the temporary directory and records the parameters; a directory whose meta.json
    matches is returned untouched. A non-empty out_dir without meta.json is refused rather than replaced,
    since it is not ours to delete.
    """
    out_dir = pathlib.Path(out_dir)
    meta = _meta(seed, n_train, n_dev, n_test, max_words)
    if _is_complete(out_dir, meta):
        return out_dir
    if out_dir.exists():
        if not out_dir.is_dir():
            raise UserError(f"corpus path {out_dir} exists and is not a directory; pass another path")
        if any(out_dir.iterdir()) and not (out_dir / "meta.json").exists():
            raise UserError(
                f"{out_dir} is not empty and holds no synthetic corpus (no meta.json); pass an empty or new directory"
            )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    corpus = generate(seed, n_train, n_dev, n_test, max_words)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    old = None
    try:
        for split, pairs in corpus.items():
            for lang, col in (("en", 0), ("de", 1)):
                text = "".join(p[col] + "\n" for p in pairs)
                (tmp / f"{split}.{lang}").write_text(text, encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if out_dir.exists():
            # A directory cannot be renamed over a non-empty one: move the stale corpus aside first.
            old = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "corpus")
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out_dir
