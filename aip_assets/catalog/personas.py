"""Personas composed from the protected-attribute catalogue: one value per axis.

Used for the group-interaction-bias persona pool when no synthesis model is configured (the
builtin model), and as the fallback when synthesis fails. Deterministic under the seed.
"""

from __future__ import annotations

import random

from .attributes import values

PERSONA_AXES = ("gender", "ethnicity", "religion", "role")


def catalogue_personas(n: int, seed: int, language: str = "en") -> list[dict]:
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
