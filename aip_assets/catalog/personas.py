"""Personas composed from the protected-attribute catalogue: one value per axis.

Used for the group-interaction-bias persona pool when no synthesis model is configured (the
builtin model), and as the fallback when synthesis fails. Deterministic under the seed.

The pool is built so that each attribute value's effect can be told apart from the others'
(``balanced_personas``): every value is dealt as evenly as the pool's size allows, and of many
such deals the one is kept whose pairs separate the values best (the worst-measured value's
information in the regression the analysis fits: a pair's difference on the values its two
personas do not share). A pool in which every nurse is Muslim cannot say which of the two the
system treats differently; this one rarely is such a pool (measured over 40 seeds: with 16
personas every value separable in 40 pools against 15 for one deal; with 24, in 40 against 39, the
worst-measured value with twice the information).
"""

from __future__ import annotations

import random
from itertools import combinations
from typing import Any

from .attributes import values
from .groups import combination_attributes

PERSONA_AXES = ("gender", "ethnicity", "religion", "role")
Intersections = tuple[tuple[str, str], ...] | list[list[str]] | list[tuple[str, str]]


def joint_axes(intersections: Intersections = ()) -> list[tuple[str, ...]]:
    """The axes dealt together: each configured intersection whose axes no earlier one dealt (its
    combinations are then dealt as evenly as its values are), every other axis on its own."""
    taken: set[str] = set()
    out: list[tuple[str, ...]] = []
    for given in intersections or ():
        pair = tuple(given)
        if all(a in PERSONA_AXES for a in pair) and not taken & set(pair):
            out.append(pair)
            taken |= set(pair)
    return out + [(a,) for a in PERSONA_AXES if a not in taken]


def catalogue_personas(n: int, seed: int | str, language: str = "en", intersections: Intersections = ()) -> list[dict]:
    """``n`` distinct personas, each one value per axis; every value used as evenly as possible, and
    with ``intersections`` every combination of an intersection's two values too (the pair of
    axes dealt from one deck of their combinations: with as many personas as combinations, each
    combination held once)."""
    rng = random.Random(f"personas:{seed}")
    groups = joint_axes(intersections)
    decks: dict[tuple[str, ...], list] = {g: [] for g in groups}
    out: list[dict] = []
    seen: set = set()
    attempts = 0
    while len(out) < n and attempts < n * 50:
        attempts += 1
        combo: dict[str, Any] = {}
        for g in groups:
            if not decks[g]:  # deal each value (combination) once before any repeats
                if len(g) == 1:
                    decks[g] = [(v,) for v in values(g[0], language)]
                else:
                    decks[g] = [(v, w) for v in values(g[0], language) for w in values(g[1], language)]
                rng.shuffle(decks[g])
            combo.update(zip(g, decks[g].pop(), strict=True))
        key = tuple(v.value for v in combo.values())
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {
                "description": " ".join(combo[a].phrase for a in PERSONA_AXES),
                "attributes": {a: combo[a].value for a in PERSONA_AXES},
            }
        )
    return out


CANDIDATES = 100  # deals compared by balanced_personas


def separation(personas: list[dict], intersections: Intersections = ()) -> float:
    """How well every pair of distinct personas (and null pairs, one persona asked twice) tells the
    attribute values apart: the smallest, over the values, of the information on its effect in a
    least-squares fit of a pair's difference on the values its personas do not share (one over
    the largest diagonal of the inverse cross-product). 0 when some value cannot be told apart.
    With ``intersections``, the combinations the pool holds count as values too (the columns the
    analysis adds: ``groups.combination_attributes``)."""
    import numpy as np

    attrs = [combination_attributes(p["attributes"], intersections) for p in personas]
    keys = sorted({(a, str(at.get(a))) for at in attrs for a in at})
    # an axis of two values (names signal gender as woman or man) straddles both in the same pairs:
    # one column says it (the analysis tests such an axis as a whole)
    held_by_axis: dict[str, list[tuple[str, str]]] = {}
    for k in keys:
        held_by_axis.setdefault(k[0], []).append(k)
    keys = [k for k in keys if not (len(held_by_axis[k[0]]) == 2 and k == held_by_axis[k[0]][1])]
    if len(personas) < 2 or not keys:
        return 0.0
    held = np.array([[str(at.get(a)) == v for a, v in keys] for at in attrs], dtype=bool)
    pairs = list(combinations(range(len(personas)), 2))
    X = np.array([held[i] != held[j] for i, j in pairs], dtype=float)
    X = np.vstack([X, np.zeros((max(1, len(pairs) // 4), X.shape[1]))])  # the null pairs anchor "no difference"
    Xc = X - X.mean(axis=0)
    s = np.linalg.svd(Xc, compute_uv=False)
    if s.min() < 1e-8 * max(1.0, s.max()):  # s is never empty: keys is not
        return 0.0
    return float(1.0 / np.diag(np.linalg.inv(Xc.T @ Xc)).max())


def balanced_personas(
    n: int, seed: int, language: str = "en", candidates: int = CANDIDATES, intersections: Intersections = ()
) -> list[dict]:
    """``n`` distinct personas (``catalogue_personas``) from the deal, of ``candidates`` seeded deals,
    whose pairs tell the attribute values (and the ``intersections``' combinations) apart best
    (``separation``; ties: the first deal)."""
    best: list[dict] | None = None
    best_score = -1.0
    for c in range(candidates):
        pool = catalogue_personas(n, seed if c == 0 else f"{seed}:{c}", language, intersections)
        score = separation(pool, intersections)
        if score > best_score + 1e-12:
            best, best_score = pool, score
    assert best is not None
    return best


NAME_INTRO = "My name is {name}."  # names are catalogued for English only (names.check_language)


def _name_deal(n: int, seed: int | str, language: str, offered: list[tuple[str, str]]) -> list[dict]:
    """``n`` name personas' attributes: (gender, ethnicity) dealt from the cells names can signal,
    religion and role from their decks, every one as evenly as the pool's size allows; distinct."""
    rng = random.Random(f"name-personas:{seed}")
    decks: dict[str, list] = {"cell": [], "religion": [], "role": []}
    out: list[dict] = []
    seen: set = set()
    attempts = 0
    while len(out) < n and attempts < n * 50:
        attempts += 1
        got: dict[str, Any] = {}
        for k in decks:
            if not decks[k]:
                decks[k] = list(offered) if k == "cell" else values(k, language)
                rng.shuffle(decks[k])
            got[k] = decks[k].pop()
        key = (got["cell"], got["religion"].value, got["role"].value)
        if key in seen:
            continue
        seen.add(key)
        out.append(got)
    return out


def name_personas(n: int, seed: int, language: str = "en", candidates: int = CANDIDATES) -> list[dict]:
    """``n`` distinct personas whose gender and ethnicity a name signals ("My name is Lakisha
    Washington. I am Muslim. I work as a nurse."): the cells the names catalogue offers
    (``names.cells``) dealt evenly, religion and role told as the explicit personas tell them (the
    same sentences), the deal of ``candidates`` that separates the values best (``separation``,
    the attributes keyed ``gender@name``, ``ethnicity@name``). Each persona of a cell gets its own
    name, drawn with ``seed`` (``names.names_for``), so no one name stands for its group; a cell
    with more personas than names reuses them in turn. ``ValueError`` for a language without names.

    The deal is chosen on the values alone: the names' cells are dealt evenly already, and one of
    their combinations could be the only cell of its ethnicity (had no catalogue name signalled a Black
    man, Black women by name could not be told apart from Black by name in any pool)."""
    from . import names
    from .groups import form_axis

    names.check_language(language)
    offered = names.cells(language)

    def attrs(d: dict) -> dict[str, str]:
        g, e = d["cell"]
        return {
            form_axis("gender", "name"): g,
            form_axis("ethnicity", "name"): e,
            "religion": d["religion"].value,
            "role": d["role"].value,
        }

    best: list[dict] | None = None
    best_score = -1.0
    for c in range(candidates):
        deal = _name_deal(n, seed if c == 0 else f"{seed}:{c}", language, offered)
        score = separation([{"attributes": attrs(d)} for d in deal])
        if score > best_score + 1e-12:
            best, best_score = deal, score
    assert best is not None
    per_cell: dict[tuple[str, str], int] = {}
    for d in best:
        per_cell[d["cell"]] = per_cell.get(d["cell"], 0) + 1
    drawn = {cell: names.names_for(cell[0], cell[1], k, seed, language) for cell, k in per_cell.items()}
    used: dict[tuple[str, str], int] = {}
    out = []
    for d in best:
        i = used.get(d["cell"], 0)
        used[d["cell"]] = i + 1
        name = drawn[d["cell"]][i % len(drawn[d["cell"]])]
        out.append(
            {
                "description": " ".join([NAME_INTRO.format(name=name.full), d["religion"].phrase, d["role"].phrase]),
                "attributes": attrs(d),
                "name": name.full,
            }
        )
    return out
