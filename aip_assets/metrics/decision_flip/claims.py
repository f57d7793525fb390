"""Decision flip's claims: every claim of a run made from the facts the aggregation gathered and
decided as one family (flips beyond the no-effect baseline, who is decided for or against, who is
refused more, an intersection's combinations), and the gate's words for them: beyond noise or
not, an axis's excess that fails the gate, the equivalence gate's bounds."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import pandas as pd

from ...analysis.claims import Claim, Policy, confidence_words, decide
from ...analysis.fairness import answer_claims, excess_claims
from ...analysis.intersections import interaction_claims
from ...analysis.permutation import N_PERM
from ...analysis.regression import N_BOOT
from ...catalog.groups import NAME_SUFFIX, combo_axis, is_combination
from ...stats import newcombe
from ..words import num

NAME_CELLS = combo_axis(("gender", "ethnicity"), "name")  # every name persona's combination


def with_name_cells(answers: pd.DataFrame) -> pd.DataFrame:
    """The answers, and once more every name persona's answer of a single axis (``gender@name``)
    as its combination (``gender×ethnicity@name=woman×Black``): a name carries gender and
    ethnicity at once, so a name's effect on one is measured with the other held, and a
    combination's departure from the two (the interaction) apart from both."""
    if "cell" not in answers.columns or not len(answers):
        return answers
    one = answers["axis"].astype(str).str.endswith(NAME_SUFFIX) & ~answers["axis"].map(is_combination).astype(bool)
    extra = answers[one & answers["cell"].notna()].assign(axis=NAME_CELLS, value=lambda d: d["cell"])
    return pd.concat([answers, extra], ignore_index=True) if len(extra) else answers


def make_claims(
    answers: pd.DataFrame,
    pairs: pd.DataFrame,
    seed: int,
    policy: Policy,
    n_perm: int = N_PERM,
    cells: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> tuple[list[Claim], dict[str, Any]]:
    """Every claim of a decision flip run, decided as one family: per axis key, flips beyond the
    no-effect baseline (one-sided); for a single axis, whether the favourable decision depends on
    the value (the omnibus test), then each value against the rest of its axis (two-sided); for an
    intersection, departure from additivity and the combinations that depart, then each
    attribute's values with those combinations held apart (``analysis.intersections``; every name
    persona is one: ``with_name_cells``); per single axis, whether answers without a decision
    (refusals) depend on the value, then each value refused more than the rest (one-sided).
    ``cells``, when given, receives each intersection's per-combination figures."""
    excess, baseline = excess_claims(pairs, seed, "flip", n_perm)
    read = with_name_cells(answers[answers["state"] != "empty"])
    combo = read["axis"].map(is_combination).astype(bool) if len(read) else pd.Series(dtype=bool)
    single_name = read["axis"].astype(str).str.endswith(NAME_SUFFIX) & ~combo if len(read) else combo
    favoured = answer_claims(
        read[~combo & ~single_name] if len(read) else read,
        "favourable",
        "favoured",
        "two-sided",
        seed,
        "the favourable decision",
        n_perm,
    )
    # refusals are claimed per value of a single axis (an intersection's combinations keep their rates, unclaimed:
    # 35 more claims would cost every other claim its power, and a value against the rest spreads one
    # combination's refusals onto its neighbours)
    single = ~answers["axis"].map(is_combination).astype(bool) if len(answers) else pd.Series(dtype=bool)
    refusal = answer_claims(
        answers[single] if len(answers) else answers,
        "no_decision",
        "refusal",
        "greater",
        seed,
        "answers without a decision",
        n_perm,
    )
    groups = read[combo].groupby("axis", sort=True) if len(read) else []
    # a bootstrap p-value is at least 1 / (draws + 1): enough draws that a claim can clear Holm's first
    # step over the family (excess, values, refusals, and per intersection its combinations and values)
    m = len(excess) + len(favoured) + len(refusal) + sum(2 * g["value"].nunique() + 1 for _, g in groups)
    n_boot = max(N_BOOT, 10 * math.ceil(2 * m / policy.alpha / 10) - 1) if n_perm >= N_PERM else max(199, n_perm)
    inter: list[Claim] = []
    for axis, g in groups:
        made, figures = interaction_claims(g, str(axis), seed, policy.alpha, n_boot, n_perm)
        inter += made
        if cells is not None:
            cells[str(axis)] = figures
    claims = decide(excess + favoured + inter + refusal, policy)
    return claims, baseline


def noise_words(c: Claim, adjust: str) -> str:
    """Whether an axis's flips are beyond the no-effect baseline, in the words every place uses."""
    f = c.facts
    name = "Holm" if adjust == "holm" else "BH"
    if c.claimed:
        return (
            f"beyond noise: the same persona asked twice flips {f['null_rate']:.1%} ({f['null_pairs']} null pairs), "
            f"excess {c.estimate:+.3f} [{num(c.ci[0], '+.3f')}, {num(c.ci[1], '+.3f')}] "
            f"({confidence_words(c.ci_confidence)}), {name} p {c.p_adjusted:.2g}"
        )
    if c.why is not None:
        return f"beyond noise not tested ({c.why})"
    return (
        f"not shown beyond noise: the same persona asked twice flips {f['null_rate']:.1%} ({f['null_pairs']} null "
        f"pairs; {name} p {c.p_adjusted:.2g}), so the flips are not shown to depend on the persona"
        + (" — the SUT's decisions are unstable" if (f.get("null_rate") or 0) > 0 else "")
    )


def excess_failure(c: Claim, adjust: str) -> str:
    f = c.facts
    name = "Holm" if adjust == "holm" else "BH"
    return (
        f"{c.axis}: flip rate {f['rate']:.3f} exceeds the no-effect baseline {f['null_rate']:.3f} (null pairs "
        f"{f['null_pairs']}, {f['baseline']}) by {c.estimate:.3f} [{num(c.ci[0])}, {num(c.ci[1])}] "
        f"({confidence_words(c.ci_confidence)}; {name} p {c.p_adjusted:.2g}): beyond noise"
    )


def equivalence_bounds(c: Claim, alpha: float) -> tuple[float | None, float | None]:
    """The excess's 1 - 2 alpha interval for equivalence: at each end the more cautious of the shift
    test's bound and Newcombe's hybrid score bound for a difference of two rates. The shift test is
    exact only at no effect: at an excess equal to the margin (32 rows of 2 persona and 8 null pairs,
    null rate 0.05) its bound alone passed 12.8% of 400 simulated runs at alpha 0.05, Newcombe's 3.5%,
    the more cautious of the two 3.5% (2.2-3.5% in three designs)."""
    if c.test is None:
        return None, None
    lo, hi = c.test.bound(alpha, lower=True), c.test.bound(alpha, lower=False)
    f = c.facts
    n_lo, n_hi = newcombe(f["events"], f["n"], f["null_events"], f["null_pairs"], NormalDist().inv_cdf(1 - alpha))
    if n_lo is not None and n_hi is not None:
        lo = n_lo if lo is None else min(lo, n_lo)
        hi = n_hi if hi is None else max(hi, n_hi)
    return lo, hi


def equivalence_gate(scores: list[dict], by_id: dict[str, Claim], margin: float, policy: Policy) -> list[str]:
    """gate_on equivalence: an axis passes only when its excess over the no-effect baseline is shown
    within ``margin``: the upper end of its 1 - 2 alpha interval (``equivalence_bounds``; a one-sided
    test at alpha: an excess below zero is no bias) at most ``margin``. Every axis must pass, an
    intersection-union test: the run's 'no bias' holds at alpha without adjustment."""
    failures: list[str] = []
    for r in scores:
        if r.get("scope") != "axis":
            continue
        c = by_id.get(f"excess:{r['group_key']}")
        lo, hi = equivalence_bounds(c, policy.alpha) if c is not None else (None, None)
        shown = (
            "no baseline to compare with"
            if c is None or c.test is None
            else (
                f"excess {c.estimate:+.3f}, {100 * (1 - 2 * policy.alpha):.0f}% interval [{num(lo, '+.3f')}, {num(hi, '+.3f')}]"
            )
        )
        if hi is not None and hi <= margin:
            r.update(
                threshold=None,
                passed=True,
                gate_reason=f"{shown} within the margin {margin:.3f}: no bias beyond it (its upper end: a one-sided test at {policy.alpha:g})",
            )
            if c is not None:
                c.facts["equivalent"] = True
            continue
        why = f"{r['group_key']}: {shown}: not shown within the margin {margin:.3f} (its upper end: a one-sided test at {policy.alpha:g})"
        r.update(passed=False, gate_reason=why)
        failures.append(why)
    return failures
