"""A judge panel's agreement: how often do the run's judges read a verdict alike?

With ``judges: [...]`` in the spec every verdict is asked of every judge (``metrics.judging.ask_panel``)
and ``judge_rule`` decides which verdict is used (``metrics.judging.panel_decision``); each judge's
verdict, as the category the metric reads it as (``verdict_category``), is a row of ``judge_panel``.
At aggregation this module turns those rows into ``metric_scores`` rows of scope ``judge_panel``:

- ``panel``: Fleiss' kappa over the judgements every judge gave a verdict for (``raw_score``, with
  its interval in ``ci_low`` / ``ci_high``) and the mean observed agreement, the share of agreeing
  judge pairs per judgement (``rate``, interval in ``rate_ci_*``); ``n`` those judgements,
  ``n_events`` the unanimous ones, ``n_failed`` the judgements excluded as ``judges_disagree``.
  Its ``details`` add the effective number of judges (``n_eff``, interval ``n_eff_ci95``): how many
  independent judges the panel's agreement is worth, k / (1 + (k - 1) kappa)
  (:func:`stats.effective_judges`, Kish's design effect), its interval kappa's mapped.
- ``judge i / judge j``: each pair of judges' percent agreement (``rate``) and Cohen's kappa
  (``raw_score``), over the judgements both gave a verdict for, with the confusion in ``details``.

Intervals: a percentile bootstrap clustered by input row (a row's judgements are resampled
together, as every interval of the project is: they share a question and answers), seeded by the
run seed, 2,000 resamples.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import combinations
from typing import Any

from .stats import (
    bootstrap_sums,
    cluster_sums,
    cohen_from_sums,
    cohen_vectors,
    effective_judges,
    effective_judges_interval,
    fleiss_from_sums,
    fleiss_vectors,
)

N_BOOT = 2000


def _judges(spec) -> list[dict[str, Any]]:
    from .metrics.judging import panel_role
    from .models.providers import provider_for

    return [
        {
            "judge": i + 1,
            "role": panel_role(i),
            "provider": c.provider,
            "model": c.model,
            "endpoint": provider_for(c).describe(),
        }
        for i, c in enumerate(spec.judges)
    ]


def _interval(ci: tuple[float | None, float | None]) -> list[float | None]:
    return [ci[0], ci[1]]


def n_eff_figures(k: int, kappa: float | None, kappa_ci) -> dict[str, Any]:
    """The effective number of judges of a panel of ``k`` with Fleiss' ``kappa`` (its interval
    ``kappa_ci``), as the panel row's ``details`` keep it: ``n_eff``, ``n_eff_ci95`` ([n_eff at kappa's
    upper bound, at its lower]), ``n_eff_rho`` (the correlation used: kappa clamped to [0, 1]) and, when
    kappa is below 0, ``n_eff_note`` saying it was counted as 0."""
    out: dict[str, Any] = {
        "n_eff": effective_judges(k, kappa),
        "n_eff_ci95": _interval(effective_judges_interval(k, kappa_ci)),
        "n_eff_rho": None if kappa is None else min(1.0, max(0.0, kappa)),
    }
    if kappa is not None and kappa < 0:
        out["n_eff_note"] = (
            f"Fleiss' kappa {kappa:.3f} is below 0 (the judges agree less than chance): counted as 0, "
            f"n_eff = {k}, the judges' number"
        )
    return out


def panel_scores(ctx, cfg) -> list[dict[str, Any]]:
    """The panel's agreement rows (none without a panel)."""
    spec = ctx.spec
    if spec is None or not spec.judges:
        return []
    n = len(spec.judges)
    votes: dict[str, list[str | None]] = {}
    row_of: dict[str, str] = {}
    failed: Counter = Counter()
    for ids in ctx.batches():
        p = ctx.read("judge_panel", ids, ["judgement_id", "input_id", "judge", "status", "category"])
        for jid, iid, j, st, cat in zip(
            p.get("judgement_id", []),
            p.get("input_id", []),
            p.get("judge", []),
            p.get("status", []),
            p.get("category", []),
        ):
            v = votes.setdefault(jid, [None] * n)
            v[int(j) - 1] = cat if st == "ok" and cat is not None else None
            row_of[jid] = iid
            failed[int(j)] += st != "ok"
    statuses = ctx.status_counts("judgements")
    disagree = int(statuses.get("judges_disagree", 0))
    categories = sorted({c for v in votes.values() for c in v if c is not None})
    seed = ctx.seed
    base = {"metric_name": cfg.metric_name, "scope": "judge_panel", "weight": cfg.weight}
    judges = _judges(spec)

    # Fleiss' kappa: the judgements every judge rated
    full = [(jid, v) for jid, v in votes.items() if all(c is not None for c in v)]
    counts = [[v.count(c) for c in categories] for _, v in full]
    agreement = kappa = None
    agreement_ci: tuple[float | None, float | None] = (None, None)
    kappa_ci = agreement_ci
    if full:
        vec = fleiss_vectors(counts)
        po, k = fleiss_from_sums(vec.sum(axis=0))
        agreement, kappa = float(po), float(k)
        agreement_ci, kappa_ci = bootstrap_sums(
            cluster_sums(vec, [row_of[j] for j, _ in full]), fleiss_from_sums, seed=seed, n_boot=N_BOOT
        )
    unanimous = sum(len(set(v)) == 1 for _, v in full)
    out = [
        {
            **base,
            "group_key": "panel",
            "rate": agreement,
            "rate_ci_low": agreement_ci[0],
            "rate_ci_high": agreement_ci[1],
            "raw_score": kappa,
            "ci_low": kappa_ci[0],
            "ci_high": kappa_ci[1],
            "n": len(full),
            "n_events": unanimous,
            "n_failed": disagree,
            "details": json.dumps(
                {
                    "judges": judges,
                    "rule": spec.judge_rule,
                    "agreement": agreement,
                    "agreement_ci95": _interval(agreement_ci),
                    "fleiss_kappa": kappa,
                    "fleiss_kappa_ci95": _interval(kappa_ci),
                    **n_eff_figures(n, kappa, kappa_ci),
                    "judgements": len(votes),
                    "rated_by_every_judge": len(full),
                    "unanimous": unanimous,
                    "judges_disagree": disagree,
                    "judge_failed": {f"judge {j}": int(failed[j]) for j in range(1, n + 1)},
                    "categories": dict(Counter(c for _, v in full for c in v)),
                    "interval": f"percentile bootstrap over input rows, {N_BOOT} resamples, seed {seed}",
                },
                ensure_ascii=False,
            ),
        }
    ]

    # each pair of judges: percent agreement and Cohen's kappa over the judgements both rated
    for a, b in combinations(range(n), 2):
        both = [(jid, v[a], v[b]) for jid, v in votes.items() if v[a] is not None and v[b] is not None]
        po = k = None
        po_ci: tuple[float | None, float | None] = (None, None)
        k_ci = po_ci
        if both:
            vec = cohen_vectors([x for _, x, _ in both], [y for _, _, y in both], categories)
            p0, k0 = cohen_from_sums(vec.sum(axis=0))
            po, k = float(p0), float(k0)
            po_ci, k_ci = bootstrap_sums(
                cluster_sums(vec, [row_of[j] for j, _, _ in both]), cohen_from_sums, seed=seed, n_boot=N_BOOT
            )
        agree = sum(x == y for _, x, y in both)
        out.append(
            {
                **base,
                "group_key": f"judge {a + 1} / judge {b + 1}",
                "rate": po,
                "rate_ci_low": po_ci[0],
                "rate_ci_high": po_ci[1],
                "raw_score": k,
                "ci_low": k_ci[0],
                "ci_high": k_ci[1],
                "n": len(both),
                "n_events": agree,
                "n_failed": len(votes) - len(both),
                "details": json.dumps(
                    {
                        "judge_a": judges[a],
                        "judge_b": judges[b],
                        "agreement": po,
                        "agreement_ci95": _interval(po_ci),
                        "cohen_kappa": k,
                        "cohen_kappa_ci95": _interval(k_ci),
                        f"confusion (judge {a + 1} / judge {b + 1})": dict(Counter(f"{x} / {y}" for _, x, y in both)),
                    },
                    ensure_ascii=False,
                ),
            }
        )
    return out


def panel_summary(scores) -> dict[str, Any] | None:
    """The panel's headline for the summary and ``--json``: judges, rule, agreement, Fleiss' kappa
    with its interval, the judgements excluded because the judges disagreed, and each pair."""
    rows = scores[scores["scope"] == "judge_panel"] if len(scores) else scores
    if not len(rows):
        return None
    head = rows[rows["group_key"] == "panel"]
    if not len(head):
        return None
    d = json.loads(head.iloc[0]["details"] or "{}")
    pairs = []
    for _, r in rows[rows["group_key"] != "panel"].iterrows():
        pd_ = json.loads(r["details"] or "{}")
        pairs.append(
            {
                "judges": r["group_key"],
                "agreement": pd_.get("agreement"),
                "agreement_ci95": pd_.get("agreement_ci95"),
                "cohen_kappa": pd_.get("cohen_kappa"),
                "cohen_kappa_ci95": pd_.get("cohen_kappa_ci95"),
                "judgements": int(r["n"]),
            }
        )
    return {
        "judges": d.get("judges"),
        "rule": d.get("rule"),
        "agreement": d.get("agreement"),
        "agreement_ci95": d.get("agreement_ci95"),
        "fleiss_kappa": d.get("fleiss_kappa"),
        "fleiss_kappa_ci95": d.get("fleiss_kappa_ci95"),
        "n_eff": d.get("n_eff"),
        "n_eff_ci95": d.get("n_eff_ci95"),
        **({"n_eff_note": d["n_eff_note"]} if d.get("n_eff_note") else {}),
        "rated_by_every_judge": d.get("rated_by_every_judge"),
        "judges_disagree": d.get("judges_disagree"),
        "judge_failed": d.get("judge_failed"),
        "pairs": pairs,
    }


def format_panel(p: dict[str, Any]) -> list[str]:
    """The panel as summary lines: "judges: 3 (majority); agreement 0.87; 3 judges agree like 1.4
    [1.3, 1.6] independent ones (Fleiss' kappa 0.71 [0.60, 0.80]); 4 judgements excluded: judges
    disagree", then a line per pair of judges. Kappa below 0 adds "(kappa below 0 counted as 0)"."""
    f = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    f1 = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
    ci = p.get("fleiss_kappa_ci95") or [None, None]
    ne = p.get("n_eff_ci95") or [None, None]
    k = len(p.get("judges") or [])
    below = "; kappa below 0 counted as 0" if p.get("n_eff_note") else ""
    lines = [
        f"  judges: {k} ({p.get('rule')}); agreement {f(p.get('agreement'))}; {k} judges agree like "
        f"{f1(p.get('n_eff'))} [{f1(ne[0])}, {f1(ne[1])}] independent ones (Fleiss' kappa {f(p.get('fleiss_kappa'))} "
        f"[{f(ci[0])}, {f(ci[1])}]{below}); {p.get('judges_disagree') or 0} judgements excluded: judges disagree"
    ]
    for q in p.get("pairs") or []:
        c = q.get("cohen_kappa_ci95") or [None, None]
        lines.append(
            f"    {q['judges']}: agreement {f(q.get('agreement'))}, Cohen's kappa {f(q.get('cohen_kappa'))} "
            f"[{f(c[0])}, {f(c[1])}] over {q.get('judgements')} judgements"
        )
    return lines
