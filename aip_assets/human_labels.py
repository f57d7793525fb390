"""Judges checked against people: the sample people label and the estimates from their labels
(the file they fill in, ``aip-eval label export`` and ``aip-eval label import``: ``label_files``).

- **Export** writes a seeded sample of one run × metric's judgements to a CSV (or JSONL) a person
  fills in: each item's stable ``judgement_id``, what the judge compared (both questions, both
  answers, the personas or variants, the decision labels or the reference), the categories
  allowed (``allowed``), the judge's own category only with ``show_verdict``, and empty
  ``human_label``, ``labeller`` and ``note`` columns. The sample is **stratified by the judge's
  category** (the metric's ``audit_category``, the scale ``judge_audit.py`` compares two judges
  on), with **equal allocation**: each category the judge used gets an equal share of ``n``,
  a category with fewer judgements than its share gives all it has and the rest is shared
  equally among the others (water-filling), so rare categories such as flips are labelled as
  often as common ones. Within a category the items are the first by a seeded hash of their id;
  the file lists them in another seeded order, never grouped by category (that would show the
  verdict).
- **Import** checks every row (an unknown judgement, a label that is not one of the item's
  allowed categories, a row twice for one labeller, a row of another run or metric, answers that
  are no longer those the row showed, by its ``shown_hash``: an error
  naming the file, row and field, and nothing written), stores the labels in ``human_labels``
  (a labeller's label of a judgement replaces the one imported before) and replaces the run ×
  metric's ``human_agreement`` rows in ``metric_scores`` (aggregation recomputes them too).

**The estimates.** Because the sample over-represents rare categories, every estimate weighs
a labelled item by N_h / n_h (the judgements in its judge category over those labelled there),
so it speaks of the run's judgements, not of the sample; with equal weights each is the
textbook formula. Several labellers of one item: the item's label is their most common one (a
tie leaves it out, counted). Figures, all in scope ``human_agreement``:

- ``agreement``: the share of items where the judge and people agree (``rate``, Wilson interval
  at Kish's effective sample size) and Cohen's kappa (``raw_score``; ``ci_low``/``ci_high`` a
  95% percentile interval from 2,000 seeded bootstrap resamples of the labelled items within
  each judge category).
  Where an item has several judges (group bias's similarity, tone and effort; perturbation's
  correctness and robustness), ``agreement:<kind>`` is each judge's too.
- ``category:<c>``: the judge's sensitivity for c against people (``rate``: of the items people
  put in c, the share the judge put there) and specificity (``details``: of the items people put
  elsewhere, the share the judge did not put in c), each with a Wilson interval at Kish's n;
  with several judges, over the items of c's judge.
- ``corrected:<c>``: the metric's key rate corrected for the judge's measured sensitivity and
  specificity (Rogan–Gladen, clipped to [0, 1]), with a 95% interval from a parametric bootstrap
  of p_obs, Se and Sp drawn together from the run's counts and the labels
  (``stats.rogan_gladen_stratified``); ``raw_score`` is the judge's rate. No corrected rate
  (``rate`` NULL, ``details.why``) with fewer than 10 labels on either side, a judge category of
  the rate nobody labelled, or Se + Sp - 1 <= 0.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from .errors import AipError
from .judge_audit import AUDITED  # judgements the judge gave a verdict for: people label what it judged
from .metrics.base import KeyRate
from .stats import RG_DRAWS, cohen_kappa, kish_n, rogan_gladen_stratified, wilson_share

SCOPE = "human_agreement"

MIN_PER_SIDE = 10  # labels each side (people's c and not c) the corrected rate needs
KAPPA_BOOT = 2000
Records = Callable[[str, list[Any]], Iterable[dict[str, Any]]]
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet runs a cell starting so as a formula


def allowed(metric: str, judgement: dict[str, Any]) -> list[str]:
    """The categories a person may give this judgement, as the metric declares them
    (``Metric.human_categories``: those its ``audit_category`` returns for it)."""
    from .metrics import get_metric

    declared = get_metric(metric).human_categories(judgement)
    if declared is None:
        raise AipError(f"{metric}: its verdicts have no categories for people to label (the metric declares none)")
    return list(declared)


def key_rate(metric: str) -> KeyRate | None:
    from .metrics import get_metric

    return get_metric(metric).human_key_rate


def _canon(s: str) -> str:
    return re.sub(r"[\s_-]+", " ", s.strip().lower())


def match_category(text: str, categories: Iterable[str]) -> str | None:
    """The allowed category a person wrote, in any case, with spaces, '-' or '_' alike ("Flip",
    "same decision", "slightly-inconsistent"); None when it is none of them."""
    want = _canon(text)
    return next((c for c in categories if _canon(c) == want), None)


# ------------------------------------------------------------------ what a person is shown
# the columns of the file people fill in (``label_files``): what they are shown, the judge's verdict
# (``--show-verdict``), what they write
EXPORT_COLUMNS = [
    "judgement_id",
    "run_id",
    "metric",
    "input_id",
    "item",
    "persona_a",
    "question_a",
    "answer_a",
    "persona_b",
    "question_b",
    "answer_b",
    "context",
    "allowed",
    "shown_hash",
]
VERDICT_COLUMNS = ["judge_category", "judge_reasoning"]
PERSON_COLUMNS = ["human_label", "labeller", "note"]
SHOWN = ("question_a", "answer_a", "question_b", "answer_b")


def shown_hash(content: dict[str, Any]) -> str:
    """A fingerprint of the questions and answers a row shows ("sha256:" and 16 hex digits, which
    no spreadsheet reads as a number): the import refuses a label whose item no longer shows them
    (answers sampled again, another run's)."""
    text = "\x1f".join(str(content.get(k) or "") for k in SHOWN)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def shown_contents(metric: str, ids: list[str], records: Records) -> dict[str, dict[str, Any]]:
    """What the judge compared for each judgement: personas (or variants), questions, answers.

    Args:
        metric: The metric of the judgements.
        ids: The judgement ids.
        records: Runs a query of one run: ``records(sql, params)`` binds the run's id as the first
            parameter, then ``params``, and returns the rows as dicts.

    Returns:
        ``{judgement_id: {persona_a, question_a, answer_a, persona_b, question_b, answer_b}}`` (the
        ``_b`` fields absent where the judge read one answer), None for what was not recorded.
    """
    from .metrics import get_metric

    p = [metric, ids]
    shown = get_metric(metric).human_shown  # what the judge compared: persona pairs, or a row and its variant
    if shown == "pairs":
        rows = records(
            """
            SELECT j.judgement_id, pa.persona AS persona_a, pb.persona AS persona_b, pp.value_a, pp.value_b,
                   pa.query_text AS question_a, pb.query_text AS question_b, ra.response AS answer_a, rb.response AS answer_b
            FROM judgements j
            JOIN probe_pairs pp ON pp.run_id = j.run_id AND pp.metric = j.metric AND pp.pair_id = j.pair_id
            JOIN probes pa ON pa.run_id = pp.run_id AND pa.metric = pp.metric AND pa.probe_id = pp.probe_a
            JOIN probes pb ON pb.run_id = pp.run_id AND pb.metric = pp.metric AND pb.probe_id = pp.probe_b
            LEFT JOIN sut_responses ra ON ra.run_id = pp.run_id AND ra.metric = pp.metric AND ra.probe_id = pp.probe_a
                 AND ra.sample_index = 0
            LEFT JOIN sut_responses rb ON rb.run_id = pp.run_id AND rb.metric = pp.metric AND rb.probe_id = pp.probe_b
                 AND rb.sample_index = coalesce(pp.sample_b, 0)
            WHERE j.run_id = ? AND j.metric = ? AND j.judgement_id IN (SELECT unnest(?::VARCHAR[]))""",
            p,
        )
        recs = list(rows)
        for r in recs:
            r["persona_a"] = f"{r.pop('value_a')}: {r['persona_a']}"
            r["persona_b"] = f"{r.pop('value_b')}: {r['persona_b']}"
    elif shown == "variants":
        rows = records(
            """
            SELECT j.judgement_id, 'original question' AS persona_a, 'reworded question (' || coalesce(pv.category, '?')
                   || coalesce(', template ' || pv.template_id, '') || coalesce(', wrapped: ' || pv.wrapper_id, '')
                   || '), answer ' || j.sample_index AS persona_b,
                   pb.query_text AS question_a, pv.query_text AS question_b, b.response AS answer_a, a.response AS answer_b
            FROM judgements j
            JOIN probes pb ON pb.run_id = j.run_id AND pb.metric = j.metric AND pb.input_id = j.input_id AND pb.role = 'base'
            JOIN probes pv ON pv.run_id = j.run_id AND pv.metric = j.metric AND pv.input_id = j.input_id AND pv.role = 'variant'
            LEFT JOIN sut_responses b ON b.run_id = j.run_id AND b.metric = j.metric AND b.probe_id = pb.probe_id
                 AND b.sample_index = 0
            LEFT JOIN sut_responses a ON a.run_id = j.run_id AND a.metric = j.metric AND a.probe_id = pv.probe_id
                 AND a.sample_index = j.sample_index
            WHERE j.run_id = ? AND j.metric = ? AND j.judgement_id IN (SELECT unnest(?::VARCHAR[]))""",
            p,
        )
        recs = list(rows)
    else:  # perturbation groups: a correctness judgement reads one answer; a robustness one, baseline and variant
        rows = records(
            """
            SELECT j.judgement_id, j.judge_kind, j.variant_id, j.category, bp.query_text AS base_q, br.response AS base_a,
                   vp.query_text AS var_q, vr.response AS var_a
            FROM judgements j
            LEFT JOIN probes bp ON bp.run_id = j.run_id AND bp.metric = j.metric AND bp.group_id = j.group_id
                 AND bp.role = 'baseline'
            LEFT JOIN sut_responses br ON br.run_id = bp.run_id AND br.metric = bp.metric AND br.probe_id = bp.probe_id
                 AND br.sample_index = 0
            LEFT JOIN probes vp ON vp.run_id = j.run_id AND vp.metric = j.metric AND vp.group_id = j.group_id
                 AND vp.role = 'variant' AND coalesce(vp.variant_id, vp.input_id) = j.variant_id
            LEFT JOIN sut_responses vr ON vr.run_id = vp.run_id AND vr.metric = vp.metric AND vr.probe_id = vp.probe_id
                 AND vr.sample_index = 0
            WHERE j.run_id = ? AND j.metric = ? AND j.judgement_id IN (SELECT unnest(?::VARCHAR[]))""",
            p,
        )
        recs = []
        for r in rows:
            variant = {
                "persona_a": f"reworded question ({r['category']})",
                "question_a": r["var_q"],
                "answer_a": r["var_a"],
            }
            base = {"persona_a": "original question", "question_a": r["base_q"], "answer_a": r["base_a"]}
            if r["judge_kind"] == "robustness":
                recs.append(
                    {
                        "judgement_id": r["judgement_id"],
                        **base,
                        "persona_b": variant["persona_a"],
                        "question_b": r["var_q"],
                        "answer_b": r["var_a"],
                    }
                )
            else:
                recs.append({"judgement_id": r["judgement_id"], **(variant if pd.notna(r["variant_id"]) else base)})
    return {str(r["judgement_id"]): {k: (None if pd.isna(v) else v) for k, v in r.items()} for r in recs}


# ------------------------------------------------------------------ the population and the sample
JUDGEMENT_COLUMNS = [
    "judgement_id",
    "pair_id",
    "input_id",
    "axis",
    "judge_kind",
    "category",
    "status",
    "label",
    "score",
    "reasoning",
    "sample_index",
    "group_id",
    "variant_id",
]


def population(metric: str, plugin, judgements: pd.DataFrame, pairs: pd.DataFrame | None) -> pd.DataFrame:
    """The judgements people can check: those the judge gave a verdict for (status ok,
    no_decision, unjudgeable) of real items (the no-effect baseline's null pairs left out: the
    rate corrected is the persona pairs'), each with its judge category (``judge_category``,
    the metric's ``audit_category``) and its ``allowed`` categories, in judgement_id order."""
    if not len(judgements):
        return pd.DataFrame(columns=JUDGEMENT_COLUMNS + ["judge_category", "allowed"])
    j = judgements[judgements["status"].isin(AUDITED)]
    if pairs is not None and len(pairs) and "kind" in pairs:
        null = set(pairs[pairs["kind"] == "null"]["pair_id"])
        j = j[~j["pair_id"].isin(null)]
    recs = [r for r in j.to_dict("records") if plugin.audit_model(r) is not None]
    for r in recs:
        r["judge_category"] = plugin.audit_category(None, r, None)
        r["allowed"] = allowed(metric, r)
    out = pd.DataFrame(recs, columns=list(j.columns) + ["judge_category", "allowed"])
    return out.sort_values("judgement_id", kind="stable").reset_index(drop=True)


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """Equal allocation of ``n`` items to strata of ``sizes``, each capped at its size: every
    stratum gets an equal share; one with fewer items gives all it has, and what it leaves is
    shared equally among the rest, until n are placed or every item is. A remainder smaller than
    the strata still open goes one each to the largest (then by name)."""
    alloc = {c: 0 for c in sizes}
    left = min(n, sum(sizes.values()))
    open_ = [c for c in sorted(sizes) if sizes[c] > 0]
    while left > 0 and open_:
        share = left // len(open_)
        if share == 0:
            for c in sorted(open_, key=lambda c: (-sizes[c], c))[:left]:
                alloc[c] += 1
            break
        for c in list(open_):
            add = min(share, sizes[c] - alloc[c])
            alloc[c] += add
            left -= add
            if alloc[c] == sizes[c]:
                open_.remove(c)
    return alloc


def _rank(seed: int, what: str, judgement_id: str) -> str:
    return hashlib.sha256(f"label\x1f{what}\x1f{seed}\x1f{judgement_id}".encode()).hexdigest()


def draw(pop: pd.DataFrame, n: int, seed: int) -> tuple[pd.DataFrame, dict[str, dict[str, int]]]:
    """The stratified sample (:func:`allocate` per judge category; within one, the first by a
    seeded hash of the id), in a seeded order of its own; and {category: {judged, sampled}}."""
    sizes = {str(c): int(k) for c, k in pop["judge_category"].value_counts().items()}
    alloc = allocate(sizes, n)
    ranked = pop.assign(_r=[_rank(seed, "pick", i) for i in pop["judgement_id"]])
    chosen = pd.concat([g.sort_values("_r").head(alloc[str(c)]) for c, g in ranked.groupby("judge_category")])
    chosen = chosen.assign(_o=[_rank(seed, "order", i) for i in chosen["judgement_id"]]).sort_values("_o")
    strata = {c: {"judged": sizes[c], "sampled": alloc[c]} for c in sorted(sizes, key=lambda c: (-alloc[c], c))}
    return chosen.drop(columns=["_r", "_o"]).reset_index(drop=True), strata


# ------------------------------------------------------------------ the estimates
def consensus(labels: pd.DataFrame) -> tuple[dict[str, str], dict[str, Any]]:
    """Each judgement's label from its labellers' (the most common; a tie leaves it out), and
    counts: labellers, items with several labellers, of them those all labellers agreed on, ties."""
    out: dict[str, str] = {}
    several = unanimous = ties = 0
    for jid, g in labels.groupby("judgement_id", sort=True):
        counts = Counter(g["category"]).most_common()
        if len(g) > 1:
            several += 1
            unanimous += len(counts) == 1
        if len(counts) > 1 and counts[0][1] == counts[1][1]:
            ties += 1
            continue
        out[str(jid)] = str(counts[0][0])
    return out, {
        "labellers": sorted(set(labels["labeller"])),
        "items_with_several_labellers": several,
        "of_them_unanimous": unanimous,
        "ties_left_out": ties,
    }


def _share(items: list[tuple[float, bool]]) -> tuple[float | None, float]:
    """(weighted share of True, Kish's effective n) of (weight, outcome) items."""
    tot = sum(w for w, _ in items)
    if tot <= 0:
        return None, 0.0
    return sum(w for w, x in items if x) / tot, kish_n([w for w, _ in items])


def _kappa_interval(items: list[tuple[str, str, float]], seed: int, n_boot: int = KAPPA_BOOT) -> list[float | None]:
    """95% percentile interval of the weighted kappa, resampling the labelled items with
    replacement within each judge category (the sample's strata), ``n_boot`` times, seeded."""
    import numpy as np

    if len(items) < 2:
        return [None, None]
    cats = sorted({a for a, _, _ in items} | {b for _, b, _ in items})
    code = {c: i for i, c in enumerate(cats)}
    k = len(cats)
    ja = np.array([code[a] for a, _, _ in items])
    hb = np.array([code[b] for _, b, _ in items])
    w = np.array([x for _, _, x in items], dtype=float)
    rng = np.random.default_rng(seed)
    strata = [np.flatnonzero(ja == i) for i in range(k)]
    out = []
    for _ in range(n_boot):
        idx = np.concatenate([s[rng.integers(0, len(s), len(s))] for s in strata if len(s)])
        m = np.bincount(ja[idx] * k + hb[idx], weights=w[idx], minlength=k * k).reshape(k, k)
        m = m / m.sum()
        po = float(np.trace(m))
        pe = float(m.sum(axis=1) @ m.sum(axis=0))
        out.append((1.0 if po >= 1 - 1e-12 else 0.0) if pe >= 1 - 1e-12 else (po - pe) / (1 - pe))
    lo, hi = np.percentile(out, [2.5, 97.5])
    return [float(lo), float(hi)]


def _agreement_row(
    items: list[tuple[str, str, float]], group_key: str, seed: int, base: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    """Agreement (Wilson at Kish's n) and Cohen's kappa (stratified bootstrap) of weighted items."""
    po, kappa = cohen_kappa(items)
    agree_share, n_eff = _share([(w, a == b) for a, b, w in items])
    lo, hi = wilson_share(agree_share, n_eff)
    k_lo, k_hi = _kappa_interval(items, seed)
    confusion = Counter(f"{a} / {b}" for a, b, _ in items)
    return {
        **base,
        "group_key": group_key,
        "rate": po,
        "rate_ci_low": lo,
        "rate_ci_high": hi,
        "raw_score": kappa,
        "ci_low": k_lo,
        "ci_high": k_hi,
        "n": len(items),
        "n_events": sum(a == b for a, b, _ in items),
        "details": json.dumps(
            {
                "agreement": po,
                "agreement_ci95": [lo, hi],
                "kappa": kappa,
                "kappa_ci95": [k_lo, k_hi],
                "kappa_interval": f"percentile, {KAPPA_BOOT} bootstrap resamples of the labelled items within each "
                f"judge category, seed {seed}",
                "items_compared": len(items),
                "effective_n": n_eff,
                **extra,
                "confusion (judge / people)": dict(sorted(confusion.items())),
            },
            ensure_ascii=False,
        ),
    }


def agreement_records(
    metric: str, pop: pd.DataFrame, labels: pd.DataFrame, seed: int, metric_name: str, weight: float = 1.0
) -> list[dict[str, Any]]:
    """The ``human_agreement`` metric_scores records of one run × metric from its people's labels
    (``labels``: judgement_id, category, labeller) and the judgements they label (``pop``, from
    :func:`population`). See the module's docstring for what each says. A metric with several
    judges of an item (group bias's similarity, tone and effort; perturbation's correctness and
    robustness) also gets ``agreement:<kind>`` per judge, and a category's sensitivity and
    specificity are its judge's items' (the other judges' items would be easy true negatives)."""
    if not len(labels):
        return []
    agreed, people = consensus(labels)
    judge = dict(zip(pop["judgement_id"], pop["judge_category"]))
    kind_of = dict(zip(pop["judgement_id"], pop["judge_kind"].fillna(""))) if "judge_kind" in pop else {}
    sizes = Counter(pop["judge_category"])
    compared = [(jid, judge[jid], h) for jid, h in agreed.items() if jid in judge]
    not_in_population = sorted(jid for jid in agreed if jid not in judge)
    labelled = Counter(j for _, j, _ in compared)
    wt = {c: sizes[c] / labelled[c] for c in labelled}
    items = [(j, h, wt[j]) for _, j, h in compared]
    kinds = [str(kind_of.get(jid, "")) for jid, _, _ in compared]
    uncovered = {c: sizes[c] for c in sizes if not labelled.get(c)}
    base = {"metric_name": metric_name, "scope": SCOPE, "weight": weight}
    overall = _agreement_row(
        items,
        "agreement",
        seed,
        base,
        {
            "labels": int(len(labels)),
            **people,
            "labels_of_judgements_without_a_verdict": len(not_in_population),
            "weighting": (
                "each labelled item weighs N_h / n_h: the run's judgements in its judge category over those "
                "labelled there, so the figures speak of the run's judgements"
            ),
            "strata": {c: {"judged": sizes[c], "labelled": labelled.get(c, 0)} for c in sorted(sizes)},
            "judge_categories_without_labels": uncovered,
        },
    )
    out = [{**overall, "n_failed": people["ties_left_out"] + len(not_in_population)}]
    if len(set(kinds)) > 1:
        for kind in sorted(set(kinds)):
            mine = [it for it, k in zip(items, kinds) if k == kind]
            out.append(_agreement_row(mine, f"agreement:{kind}", seed, base, {"judge_kind": kind}))
    order = {c: i for i, c in enumerate(dict.fromkeys(c for cats in pop["allowed"] for c in cats))}
    for c in sorted({a for a, _, _ in items} | {b for _, b, _ in items}, key=lambda c: (order.get(c, len(order)), c)):
        of_kind = c.split(":", 1)[0] if ":" in c and len(set(kinds)) > 1 else None
        scope = [it for it, k in zip(items, kinds) if of_kind is None or k == of_kind]
        se, se_n = _share([(w, a == c) for a, b, w in scope if b == c])
        sp, sp_n = _share([(w, a != c) for a, b, w in scope if b != c])
        se_ci, sp_ci = wilson_share(se, se_n), wilson_share(sp, sp_n)
        pos = [(a, b) for a, b, _ in scope if b == c]
        out.append(
            {
                **base,
                "group_key": f"category:{c}",
                "rate": se,
                "rate_ci_low": se_ci[0],
                "rate_ci_high": se_ci[1],
                "n": len(pos),
                "n_events": sum(a == c for a, _ in pos),
                "details": json.dumps(
                    {
                        "sensitivity": se,
                        "sensitivity_ci95": list(se_ci),
                        "specificity": sp,
                        "specificity_ci95": list(sp_ci),
                        "people_said": len(pos),
                        "people_said_other": len(scope) - len(pos),
                        "judge_said": sum(a == c for a, _, _ in scope),
                        "of_items": f"judge {of_kind}" if of_kind else "all",
                        "effective_n_sensitivity": se_n,
                        "effective_n_specificity": sp_n,
                    },
                    ensure_ascii=False,
                ),
            }
        )
    key = key_rate(metric)
    if key is not None:
        out.append(corrected_record(key, pop, items, uncovered, seed, base))
    return out


def corrected_record(
    key: KeyRate,
    pop: pd.DataFrame,
    items: list[tuple[str, str, float]],
    uncovered: dict[str, int],
    seed: int,
    base: dict[str, Any],
) -> dict[str, Any]:
    """The key rate corrected for the judge's sensitivity and specificity (Rogan–Gladen,
    ``stats.rogan_gladen_stratified``), or why not."""
    cats = pop["judge_category"]
    judged = {str(c): int(n) for c, n in cats[cats.isin(key.population)].value_counts().sort_index().items()}
    n_obs, k_obs = sum(judged.values()), judged.get(key.category, 0)
    mine = [(a, b == key.category) for a, b, _ in items if a in key.population]
    labelled = {c: (sum(a == c for a, _ in mine), sum(a == c and h for a, h in mine)) for c in judged}
    n_pos, n_neg = sum(h for _, h in mine), sum(not h for _, h in mine)
    d: dict[str, Any] = {
        "what": key.what,
        "judge_rate": k_obs / n_obs if n_obs else None,
        "judged": n_obs,
        "judge_said": k_obs,
        "people_said": n_pos,
        "people_said_other": n_neg,
        "strata (judged, labelled, of them people's key)": {c: [judged[c], *labelled[c]] for c in judged},
        "population": list(key.population),
        "why": None,
    }
    rec = {
        **base,
        "group_key": f"corrected:{key.category}",
        "raw_score": d["judge_rate"],
        "n": n_obs,
        "n_events": k_obs,
        "rate": None,
        "rate_ci_low": None,
        "rate_ci_high": None,
    }
    missing = {c: n for c, n in uncovered.items() if c in key.population}
    if not n_obs:
        d["why"] = f"no judgement of the run is in the rate's population ({', '.join(key.population)})"
    elif missing:
        d["why"] = (
            "no person labelled the judge's "
            + ", ".join(f"{c} ({n} judgements)" for c, n in missing.items())
            + ": the judge's sensitivity and specificity cannot be weighted over the run"
        )
    elif n_pos < MIN_PER_SIDE or n_neg < MIN_PER_SIDE:
        d["why"] = (
            f"too few labels: people put {n_pos} labelled item(s) in {key.category} and {n_neg} elsewhere; "
            f"the correction needs at least {MIN_PER_SIDE} on each side"
        )
    if d["why"] is not None:
        return {**rec, "details": json.dumps(d, ensure_ascii=False)}
    rg = rogan_gladen_stratified(judged, labelled, key.category, seed=seed)
    se, sp = rg["sensitivity"], rg["specificity"]
    d.update(sensitivity=se, specificity=sp)
    if rg["corrected"] is None:
        d["why"] = (
            f"Se + Sp - 1 = {se + sp - 1:.3f} <= 0 (sensitivity {se:.3f}, specificity {sp:.3f}): the judge's "
            f"{key.category} is no better than chance against people, so it says nothing about the rate"
        )
        return {**rec, "details": json.dumps(d, ensure_ascii=False)}
    d.update(
        corrected_rate=rg["corrected"],
        corrected_ci95=rg["ci95"],
        draws_without_a_rate=rg["undefined_share"],
        method=(
            "Rogan–Gladen: (p_obs + Sp - 1) / (Se + Sp - 1), clipped to [0, 1], Se and Sp weighted to the "
            "run's judge categories; 95% interval: parametric bootstrap of the run's category shares "
            "(Dirichlet) and each category's labels (Beta, Jeffreys), Se, Sp and p_obs from the same draw, "
            f"{RG_DRAWS} draws, seed {seed}"
        ),
    )
    return {
        **rec,
        "rate": rg["corrected"],
        "rate_ci_low": rg["ci95"][0],
        "rate_ci_high": rg["ci95"][1],
        "details": json.dumps(d, ensure_ascii=False),
    }


def human_scores(ctx, plugin) -> list[dict[str, Any]]:
    """Aggregation's ``human_agreement`` rows (the same as the last import wrote): [] without labels."""
    labels = ctx.read("human_labels", None, ["judgement_id", "category", "labeller"])
    if not len(labels):
        return []
    pop = population(
        ctx.metric,
        plugin,
        ctx.read("judgements", None, JUDGEMENT_COLUMNS),
        ctx.read("probe_pairs", None, ["pair_id", "kind"]),
    )
    return agreement_records(ctx.metric, pop, labels, ctx.seed, ctx.config.metric_name, ctx.config.weight)
