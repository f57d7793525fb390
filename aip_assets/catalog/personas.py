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

from .attributes import values

PERSONA_AXES = ("gender", "ethnicity", "religion", "role")


def catalogue_personas(n: int, seed: int | str, language: str = "en") -> list[dict]:
    """``n`` distinct personas, each one value per axis; every value used as evenly as possible."""
    rng = random.Random(f"personas:{seed}")
    decks: dict[str, list] = {axis: [] for axis in PERSONA_AXES}
    out: list[dict] = []
    seen: set = set()
    attempts = 0
    while len(out) < n and attempts < n * 50:
        attempts += 1
        combo = {}
        for axis in PERSONA_AXES:
            if not decks[axis]:  # deal each value once before any repeats
                decks[axis] = values(axis, language)
                rng.shuffle(decks[axis])
            combo[axis] = decks[axis].pop()
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


def separation(personas: list[dict]) -> float:
    """How well every pair of distinct personas (and null pairs, one persona asked twice) tells the
    attribute values apart: the smallest, over the values, of the information on its effect in a
    least-squares fit of a pair's difference on the values its personas do not share (one over
    the largest diagonal of the inverse cross-product). 0 when some value cannot be told apart."""
    import numpy as np

    keys = sorted({(a, str(p["attributes"].get(a))) for p in personas for a in p["attributes"]})
    if len(personas) < 2 or not keys:
        return 0.0
    held = np.array([[str(p["attributes"].get(a)) == v for a, v in keys] for p in personas], dtype=bool)
    pairs = list(combinations(range(len(personas)), 2))
    X = np.array([held[i] != held[j] for i, j in pairs], dtype=float)
    X = np.vstack([X, np.zeros((max(1, len(pairs) // 4), X.shape[1]))])  # the null pairs anchor "no difference"
    Xc = X - X.mean(axis=0)
    s = np.linalg.svd(Xc, compute_uv=False)
    if s.min() < 1e-8 * max(1.0, s.max()):  # s is never empty: keys is not
        return 0.0
    return float(1.0 / np.diag(np.linalg.inv(Xc.T @ Xc)).max())


def balanced_personas(n: int, seed: int, language: str = "en", candidates: int = CANDIDATES) -> list[dict]:
    """``n`` distinct personas (``catalogue_personas``) from the deal, of ``candidates`` seeded deals,
    whose pairs tell the attribute values apart best (``separation``; ties: the first deal)."""
    best: list[dict] | None = None
    best_score = -1.0
    for c in range(candidates):
        pool = catalogue_personas(n, seed if c == 0 else f"{seed}:{c}", language)
        score = separation(pool)
        if score > best_score + 1e-12:
            best, best_score = pool, score
    assert best is not None
    return best
