"""Decision flip's personas: the run's pool of pairs per axis key, and how a row tells each persona.

Axis keys (``catalog.groups``): ``gender`` (an explicit statement, "I am a woman."),
``gender@name`` (a name from the names catalogue whose perceived gender and ethnicity were
measured: the pair varies gender, the name's ethnicity held), ``gender×ethnicity`` (personas
combining two axes; the pool holds *rectangles*, two values of each axis, whose four pairs each
vary one attribute while the other is held, so the single-attribute contrasts and the
interaction are measured within a question) and ``gender×ethnicity@name``.

A name persona's name is drawn per row and per group (several names per group over a run, so one
name's quirks do not stand for a group) and placed where a user would give it, the same place for
both personas of a row: "My name is …" before the question, a signature after it, or an
application's name field. The rest of the query is byte-identical across a pair.
"""

from __future__ import annotations

import math
import random
from itertools import combinations
from typing import Any

from ...catalog.attributes import AXES, PERSONA_INTRO, all_pairs, lookup, max_pairs, values
from ...catalog.groups import combo_axis, combo_value, form_axis
from ...dataset import DatasetRow
from ...errors import SpecError
from .config import DecisionFlipConfig
from .prompts import probe_messages

NAMES_PER_GROUP = 6  # names drawn per group for a run; each row uses one of them
PLACEMENTS = ("intro", "signature", "field")


def entry_forms(entry: Any) -> tuple[str, ...]:
    form = getattr(entry, "persona_form", "explicit") or "explicit"
    return ("explicit", "name") if form == "both" else (form,)


def _note(code: str, message: str) -> dict[str, str]:
    return {"level": "warning", "code": code, "message": message}


def _cell(attrs: dict[str, str]) -> tuple[str, str]:
    return attrs["gender"], attrs["ethnicity"]


def _pair(value_a, value_b, attrs_a, attrs_b, form, persona_a="", persona_b="", rect=None) -> dict[str, Any]:
    return {
        "value_a": value_a,
        "value_b": value_b,
        "persona_a": persona_a,
        "persona_b": persona_b,
        "source": "names" if form == "name" else "catalog",
        "persona_form": form,
        "attributes_a": attrs_a,
        "attributes_b": attrs_b,
        "rect": rect,
    }


def _take(candidates: list, size: int, rng: random.Random) -> list:
    return rng.sample(candidates, min(size, len(candidates)))


def name_catalogue(cfg: DecisionFlipConfig, field: str):
    """The names catalogue for the run's language, or a SpecError saying there is none."""
    from ...catalog import names

    try:
        names.check_language(cfg.language)
    except ValueError as e:
        raise SpecError(f"{field}: {e}") from None
    return names


def resolve_pool(
    cfg: DecisionFlipConfig, entry: Any = None, field: str = "metrics.llm.decision_flip.persona_form"
) -> tuple[dict[str, list[dict]], list[dict]]:
    """The run's pool of persona pairs per axis key (resolved once per run) and notes on shortfalls."""
    notes: list[dict] = []
    pool: dict[str, list[dict]] = {}
    if cfg.persona_pairs:
        for p in cfg.persona_pairs:
            axis = p.get("dimension", "custom").strip() or "custom"
            if cfg.dimensions and axis not in cfg.dimensions:
                continue
            pa, pb = p["persona_a"].strip(), p["persona_b"].strip()
            va, vb = lookup(axis, pa, cfg.language), lookup(axis, pb, cfg.language)
            pool.setdefault(axis, []).append(
                {
                    **_pair(
                        pa, pb, {axis: pa}, {axis: pb}, "explicit", va.phrase if va else pa, vb.phrase if vb else pb
                    ),
                    "source": "persona_pairs",
                }
            )
        if not pool:
            raise ValueError("no persona_pairs left after filtering by dimensions")
        return pool, notes
    forms = entry_forms(entry)
    names = name_catalogue(cfg, field) if "name" in forms else None
    axes = list(cfg.dimensions or AXES)
    for axis in axes:
        for form in forms:
            key = form_axis(axis, form)
            rng = random.Random(
                f"decision_flip:{cfg.catalog_seed}:{key}"
                if form == "name"
                else f"decision_flip:{cfg.catalog_seed}:{axis}"
            )
            if form == "explicit":
                candidates = all_pairs(axis, cfg.language)
                take = min(cfg.pool_size_per_dimension, len(candidates))
                if take < cfg.pool_size_per_dimension:
                    notes.append(
                        _note(
                            "pool_shortfall",
                            f"axis {axis}: pool_size_per_dimension={cfg.pool_size_per_dimension} but the catalogue can "
                            f"express only {max_pairs(axis)} distinct pairs; using {take} (shortfall "
                            f"{cfg.pool_size_per_dimension - take})",
                        )
                    )
                chosen = []
                for a, b in rng.sample(candidates, take):
                    if rng.random() < 0.5:
                        a, b = b, a
                    chosen.append(
                        _pair(a.value, b.value, {axis: a.value}, {axis: b.value}, "explicit", a.phrase, b.phrase)
                    )
                pool[key] = chosen
                continue
            assert names is not None
            if axis not in names.NAME_AXES:
                if forms == ("name",):
                    notes.append(
                        _note(
                            "no_name_signal",
                            f"axis {axis}: no name signals it; told explicitly (persona_form name applies to "
                            f"{' and '.join(names.NAME_AXES)})",
                        )
                    )
                    pool[axis] = resolve_pool(cfg.model_copy(update={"dimensions": [axis]}), None)[0][axis]
                continue
            other = next(a for a in names.NAME_AXES if a != axis)
            cands = []
            for held in names.name_values(other, cfg.language):
                for x, y in combinations(names.name_values(axis, cfg.language), 2):
                    ax, bx = {axis: x, other: held}, {axis: y, other: held}
                    if _cell(ax) in names.cells(cfg.language) and _cell(bx) in names.cells(cfg.language):
                        cands.append((x, y, ax, bx))
            chosen = []
            for x, y, ax, bx in _take(cands, cfg.pool_size_per_dimension, rng):
                if rng.random() < 0.5:
                    x, y, ax, bx = y, x, bx, ax
                chosen.append(_pair(x, y, dict(sorted(ax.items())), dict(sorted(bx.items())), "name"))
            pool[key] = chosen
    for pair_axes in getattr(entry, "intersections", None) or []:
        for form in forms:
            if form == "name" and set(pair_axes) != set(names.NAME_AXES if names else ()):
                notes.append(
                    _note(
                        "no_name_signal",
                        f"intersection {'×'.join(pair_axes)}: names signal only {' and '.join(names.NAME_AXES if names else ())}; "
                        "told explicitly",
                    )
                )
                if "explicit" in forms:
                    continue
                form = "explicit"
            key = combo_axis(pair_axes, form)
            pool[key] = rectangles(cfg, pair_axes, form, names)
    for key, pairs in pool.items():
        per_row = len({p["rect"] for p in pairs}) if pairs and pairs[0]["rect"] is not None else len(pairs)
        if pairs and (pairs[0]["rect"] is not None or pairs[0]["persona_form"] == "name"):
            continue  # a row asks enough rectangles to hold every combination; a name axis's pool is every pair of groups
        if cfg.num_pairs_per_dimension > per_row:
            unit = "rectangles (four pairs each)" if pairs and pairs[0]["rect"] is not None else "pairs"
            notes.append(
                _note(
                    "row_pairs_shortfall",
                    f"axis {key}: num_pairs_per_dimension={cfg.num_pairs_per_dimension} but the pool has {per_row} "
                    f"{unit}; each row uses {per_row}",
                )
            )
    return pool, notes


def rectangles(cfg: DecisionFlipConfig, pair_axes: list[str], form: str, names: Any) -> list[dict]:
    """An intersection's pool: ``pool_size_per_dimension`` rectangles (two values of each axis),
    each as its four pairs that vary one attribute with the other held."""
    A, B = pair_axes
    if form == "name":
        va, vb = names.name_values(A, cfg.language), names.name_values(B, cfg.language)
        offered = set(names.cells(cfg.language))
        ok = lambda x, y: _cell({A: x, B: y}) in offered  # noqa: E731
    else:
        va, vb = [v.value for v in values(A, cfg.language)], [v.value for v in values(B, cfg.language)]
        ok = lambda x, y: True  # noqa: E731
    cands = [
        (a1, a2, b1, b2)
        for a1, a2 in combinations(va, 2)
        for b1, b2 in combinations(vb, 2)
        if all(ok(x, y) for x in (a1, a2) for y in (b1, b2))
    ]
    rng = random.Random(f"decision_flip:{cfg.catalog_seed}:{combo_axis(pair_axes, form)}")
    out: list[dict] = []

    def persona(x, y):
        attrs = {A: x, B: y}
        if form == "name":
            return attrs, ""
        pa, pb = lookup(A, x, cfg.language), lookup(B, y, cfg.language)
        assert pa is not None and pb is not None
        return attrs, f"{pa.phrase} {pb.phrase}"

    for r, (a1, a2, b1, b2) in enumerate(balanced(cands, cfg.pool_size_per_dimension, rng)):
        if rng.random() < 0.5:
            a1, a2 = a2, a1
        if rng.random() < 0.5:
            b1, b2 = b2, b1
        for (x1, y1), (x2, y2) in (
            ((a1, b1), (a2, b1)),
            ((a1, b2), (a2, b2)),
            ((a1, b1), (a1, b2)),
            ((a2, b1), (a2, b2)),
        ):
            (at1, t1), (at2, t2) = persona(x1, y1), persona(x2, y2)
            out.append(_pair(combo_value((x1, y1)), combo_value((x2, y2)), at1, at2, form, t1, t2, rect=r))
    return out


def balanced(cands: list[tuple], size: int, rng: random.Random) -> list[tuple]:
    """``size`` rectangles whose combinations are covered as evenly as the pool allows: each next
    the one whose four combinations the pool holds least so far (ties: a seeded order). Drawn at
    random, 16 rectangles of the catalogue's 210 (gender × ethnicity) left some of its 35
    combinations out and others in four rectangles."""
    order = list(cands)
    rng.shuffle(order)
    cover: dict[tuple[str, str], int] = {}
    out: list[tuple] = []
    for _ in range(min(size, len(order))):
        best = min(
            (c for c in order if c not in out),
            key=lambda c: sorted(cover.get((x, y), 0) for x in c[:2] for y in c[2:]),
        )
        out.append(best)
        for x in best[:2]:
            for y in best[2:]:
                cover[(x, y)] = cover.get((x, y), 0) + 1
    return out


def rectangles_per_row(pairs: list[dict], n: int) -> int:
    """How many rectangles a row asks of an intersection's pool: ``n``, or enough to hold every
    combination once (a row whose rectangles hold every combination compares them all within one
    question: 35 combinations of gender and ethnicity, 9 rectangles)."""
    cells = {p["value_a"] for p in pairs} | {p["value_b"] for p in pairs}
    return min(len({p["rect"] for p in pairs}), max(n, math.ceil(len(cells) / 4)))


def row_picks(pairs: list[dict], n: int, rng: random.Random) -> list[int]:
    """The pool indices a row asks: ``n`` pairs, or for an intersection ``rectangles_per_row``
    rectangles (their four pairs each), each next the one that adds most combinations the row does
    not hold yet (ties: a seeded order)."""
    if not pairs or pairs[0]["rect"] is None:
        return sorted(rng.sample(range(len(pairs)), min(n, len(pairs))))
    cells: dict[int, set[str]] = {}
    for p in pairs:
        cells.setdefault(p["rect"], set()).update((p["value_a"], p["value_b"]))
    order = sorted(cells)
    rng.shuffle(order)
    held: set[str] = set()
    chosen: list[int] = []
    for _ in range(rectangles_per_row(pairs, n)):
        r = max((r for r in order if r not in chosen), key=lambda r: len(cells[r] - held))
        chosen.append(r)
        held |= cells[r]
    return [i for i, p in enumerate(pairs) if p["rect"] in chosen]


def row_name(cfg: DecisionFlipConfig, seed: int, row: DatasetRow, attrs: dict[str, str]) -> str:
    """The name a row gives a group: one of the group's NAMES_PER_GROUP catalogue names, drawn per row."""
    from ...catalog import names

    g, e = _cell(attrs)
    choice = names.names_for(g, e, NAMES_PER_GROUP, cfg.catalog_seed, cfg.language)
    rng = random.Random(f"decision_flip:{seed}:{cfg.catalog_seed}:name:{row.input_id}:{g}:{e}")
    return choice[rng.randrange(len(choice))].full


def placement(cfg: DecisionFlipConfig, seed: int, row: DatasetRow) -> str:
    return PLACEMENTS[random.Random(f"decision_flip:{seed}:{cfg.catalog_seed}:placement:{row.input_id}").randrange(3)]


_NAME_FORMS = {
    "intro": "My name is {name}.\n\n{body}",
    "signature": "{body}\n\nBest regards,\n{name}",
    "field": "Applicant name: {name}\n\n{body}",
}


def persona_messages(
    row: DatasetRow, form: str, persona: str, instruction: str, lang: str, where: str = "intro"
) -> list[dict[str, str]]:
    """The row's conversation with the persona on its last user turn (history kept): an explicit
    persona as a paragraph before it, a name where ``where`` puts it."""
    msgs = probe_messages(row, persona, instruction, lang)
    if form != "name":
        return msgs
    body = msgs[-1]["content"][len(PERSONA_INTRO[lang]) + len(persona) + 2 :]  # the same query, no paragraph
    return msgs[:-1] + [{"role": "user", "content": _NAME_FORMS[where].format(name=persona, body=body)}]
