"""Name personas: first and last names whose race/ethnicity and gender signal was measured.

A name persona tells the system under test who the user is the way users do, by a name ("My
name is Lakisha Washington."), instead of an explicit statement ("I am a woman. I am Black.").
The catalogue ships with the package (``names.csv``, ``names_full.csv``, ``names_sources.csv``;
docs/concepts/names.md tells its sources and limits; ``data/names/build_names_catalogue.py``
rebuilds it from the source files). Every figure in it was computed from a published data file:

- ethnicity, **perception** (``crabtree2023``): Crabtree, Kim, Gaddis, Holbein, Guage and Marx
  (2023), US survey respondents' perceived race of 600 full names. A part's share pools every
  rating of the full names that contain it within its group's set.
- ethnicity, **composition** (``tzioumis2018``): the share of a first name's bearers (US mortgage
  applicants) of each race/Hispanic origin. Who bears a name, not what a reader infers.
- gender, **composition** (``ssa_national``): the share of US births registered female or male
  with the first name, 1880-2023. No source here measured perceived gender.

Selection (the same rule in the build script):

- ethnicity by perception: share >= ``PERCEPTION_MIN`` (0.6: a clear majority of ratings name the
  group; the source's best-recognised names reach 0.76 (Black), 0.81 (Hispanic), 0.86 (white)
  because raters spread over six answers, so 0.8 would leave out every Black name it rated);
- ethnicity by composition: share >= ``COMPOSITION_MIN`` (0.8) among at least 30 bearers;
- gender: share >= ``GENDER_MIN`` (0.9) of the SSA births of one sex (Guadalupe, 0.73 female, is
  left out);
- a perception measure, where one exists for the name in its group, decides: composition never
  brings back a name that raters did not read as the group (Roosevelt: 0.92 of the bearers in
  Tzioumis's data are Black, 0.34 of the ratings say Black);
- composition names only complete a (gender, ethnicity) cell that has fewer than 4 perception-
  measured first names, up to 8, the names with the most bearers first;
- a full name that Crabtree et al. rated below ``PERCEPTION_MIN`` is never drawn
  (``names_full.csv``), even when both its parts pass;
- a cell is offered when it has at least ``MIN_PER_CELL`` (4) first names and its ethnicity at
  least 4 last names. Offered: woman and man for white and Hispanic, woman for Black. Not offered:
  Black men (one name, Jermaine, passes: Darnell 0.58, Roosevelt 0.34), and every East Asian,
  South Asian, Middle Eastern and Indigenous cell (no source read here measures them: the
  perceived Asian names split between Chinese, Korean, Vietnamese, ... and the composition data
  lump all Asian origins together and count Middle Eastern bearers as white).

Languages: only ``en`` (the perceptions were measured among US respondents); ``check_language``
says so for any other.
"""

from __future__ import annotations

import csv
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files

NAME_LANGUAGES = ("en",)
NAME_AXES = ("gender", "ethnicity")

PERCEPTION_MIN = 0.6
COMPOSITION_MIN = 0.8
COMPOSITION_N_MIN = 30
GENDER_MIN = 0.9
MIN_PER_CELL = 4

_GENDERS = ("woman", "man")
# the attribute catalogue's ethnicity order (attributes.py)
_ETHNICITIES = ("Black", "white", "East Asian", "South Asian", "Hispanic", "Middle Eastern", "Indigenous")


def check_language(language: str) -> None:
    """Raise ``ValueError`` unless names are catalogued for ``language``."""
    if language not in NAME_LANGUAGES:
        raise ValueError(
            f"no names catalogue for language {language!r}: names are catalogued for "
            f"{', '.join(NAME_LANGUAGES)} only (their perception was measured among US raters); "
            "use persona_form: explicit"
        )


@dataclass(frozen=True)
class Name:
    first: str
    last: str
    gender: str
    ethnicity: str
    first_sources: tuple[str, ...] = ()  # source keys of the first name's gender and ethnicity
    last_sources: tuple[str, ...] = ()  # source key of the last name's ethnicity
    perceived_share: float | None = None  # the full name's own perceived share, when it was rated

    @property
    def full(self) -> str:
        return f"{self.first} {self.last}"

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source key behind this name, in order of first use."""
        return tuple(dict.fromkeys(self.first_sources + self.last_sources))


def _read(name: str) -> list[dict[str, str]]:
    text = files("aip_assets.catalog").joinpath(name).read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


def _passes(row: dict[str, str]) -> bool:
    share, measure = float(row["ethnicity_share"]), row["ethnicity_measure"]
    if measure == "perception":
        ok = share >= PERCEPTION_MIN
    elif measure == "composition":
        ok = share >= COMPOSITION_MIN and int(row["ethnicity_n"] or 0) >= COMPOSITION_N_MIN
    else:
        ok = False
    if row["part"] == "first":
        ok = ok and row["gender"] in _GENDERS and float(row["gender_share"] or 0) >= GENDER_MIN
    return ok


@dataclass(frozen=True)
class _Catalogue:
    rows: tuple[dict[str, str], ...]
    sources: dict[str, dict[str, str]]
    firsts: dict[tuple[str, str], tuple[dict[str, str], ...]]  # (gender, ethnicity) -> rows
    lasts: dict[str, tuple[dict[str, str], ...]]  # ethnicity -> rows
    rated: dict[tuple[str, str, str], float]  # (first, last, ethnicity) -> perceived share
    by_full: dict[str, Name]  # every drawable catalogue full name
    pattern: re.Pattern[str] | None


@lru_cache(maxsize=1)
def _catalogue() -> _Catalogue:
    rows = tuple(r for r in _read("names.csv") if _passes(r))
    sources = {r["key"]: r for r in _read("names_sources.csv")}
    rated = {(r["first"], r["last"], r["ethnicity"]): float(r["ethnicity_share"]) for r in _read("names_full.csv")}
    firsts: dict[tuple[str, str], list[dict[str, str]]] = {}
    lasts: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        if r["part"] == "first":
            firsts.setdefault((r["gender"], r["ethnicity"]), []).append(r)
        elif r["part"] == "last":
            lasts.setdefault(r["ethnicity"], []).append(r)
    by_full: dict[str, Name] = {}
    for (gender, ethnicity), fs in firsts.items():
        for f in fs:
            for la in lasts.get(ethnicity, []):
                share = rated.get((f["name"], la["name"], ethnicity))
                if share is not None and share < PERCEPTION_MIN:
                    continue  # rated as a full name, and read as the group too weakly
                name = Name(
                    f["name"],
                    la["name"],
                    gender,
                    ethnicity,
                    first_sources=tuple(dict.fromkeys((f["gender_source"], f["ethnicity_source"]))),
                    last_sources=(la["ethnicity_source"],),
                    perceived_share=share,
                )
                by_full[name.full] = name
    pattern = None
    if by_full:
        alternatives = "|".join(re.escape(n) for n in sorted(by_full, key=len, reverse=True))
        spaced = alternatives.replace(r"\ ", r"[ \t\u00a0]+")
        pattern = re.compile(rf"(?<![\w])(?:{spaced})(?![\w])")
    return _Catalogue(
        rows,
        sources,
        {k: tuple(v) for k, v in firsts.items()},
        {k: tuple(v) for k, v in lasts.items()},
        rated,
        by_full,
        pattern,
    )


def sources() -> dict[str, dict[str, str]]:
    """The sources table (``names_sources.csv``): key -> citation, measure, what was measured, where read."""
    return dict(_catalogue().sources)


def catalogue_rows(language: str = "en") -> list[dict]:
    """The catalogue's first and last names (the rows of ``names.csv`` that meet the thresholds)."""
    check_language(language)
    return [dict(r) for r in _catalogue().rows]


def _drawable(gender: str, ethnicity: str) -> list[Name]:
    return [n for n in _catalogue().by_full.values() if n.gender == gender and n.ethnicity == ethnicity]


def cells(language: str = "en") -> list[tuple[str, str]]:
    """The (gender, ethnicity) combinations names can signal: at least ``MIN_PER_CELL`` first
    names of the cell and last names of the ethnicity, each first name with a drawable full name."""
    check_language(language)
    cat = _catalogue()
    out = []
    for gender in _GENDERS:
        for ethnicity in _ETHNICITIES:
            drawable_firsts = {n.first for n in _drawable(gender, ethnicity)}
            if len(drawable_firsts) >= MIN_PER_CELL and len(cat.lasts.get(ethnicity, ())) >= MIN_PER_CELL:
                out.append((gender, ethnicity))
    return out


def name_values(axis: str, language: str = "en") -> list[str]:
    """The values of ``axis`` (gender or ethnicity) that some offered cell signals."""
    if axis not in NAME_AXES:
        raise KeyError(f"names signal no axis {axis!r}; they signal {', '.join(NAME_AXES)}")
    i = NAME_AXES.index(axis)
    return list(dict.fromkeys(cell[i] for cell in cells(language)))


def names_for(gender: str, ethnicity: str, k: int, seed: int | str, language: str = "en") -> list[Name]:
    """``k`` distinct full names of the cell (distinct first names; k capped by how many there
    are), a seeded choice: the same arguments give the same names. Last names are dealt from a
    shuffled deck so they vary too. ``KeyError`` for a cell not offered."""
    check_language(language)
    offered = cells(language)
    if (gender, ethnicity) not in offered:
        listed = ", ".join(f"{g}/{e}" for g, e in offered)
        raise KeyError(
            f"no catalogue names for gender {gender!r} and ethnicity {ethnicity!r}: names are offered "
            f"for {listed} only (docs/concepts/names.md says why)"
        )
    rng = random.Random(f"names:{seed}:{gender}:{ethnicity}")
    by_first: dict[str, list[Name]] = {}
    for n in sorted(_drawable(gender, ethnicity), key=lambda n: n.full):
        by_first.setdefault(n.first, []).append(n)
    firsts = sorted(by_first)
    rng.shuffle(firsts)
    deck: list[str] = []
    out: list[Name] = []
    for first in firsts[: max(0, k)]:
        options = {n.last: n for n in by_first[first]}
        if not any(last in options for last in deck):
            deck = sorted({n.last for ns in by_first.values() for n in ns})
            rng.shuffle(deck)
        last = next(la for la in deck if la in options)
        deck.remove(last)
        out.append(options[last])
    return out


def attributes_in(text: str) -> dict[str, str]:
    """``{"gender": ..., "ethnicity": ...}`` of the first catalogue full name ("First Last", whole
    words, case as catalogued) in ``text``; ``{}`` when there is none."""
    cat = _catalogue()
    m = cat.pattern.search(text) if cat.pattern else None
    if not m:
        return {}
    name = cat.by_full[" ".join(m.group(0).split())]
    return {"gender": name.gender, "ethnicity": name.ethnicity}


def strip_name(text: str, placeholder: str = "<name>") -> str:
    """``text`` with every catalogue full name replaced by ``placeholder``."""
    cat = _catalogue()
    return cat.pattern.sub(lambda _m: placeholder, text) if cat.pattern else text
