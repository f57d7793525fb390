"""A judge panel (``judges: [...]``, ``judge_rule``): every verdict asked of every judge, the rule's
verdict used, ties and disagreements excluded as ``judges_disagree``, every judge's verdict kept in
``judge_panel``, and the judges' agreement (pairwise and Fleiss' kappa) in ``metric_scores``.

The panels here are the builtin judge (a faithful reader) and scripted LLM judges on loopback that
answer as chat models do (a preamble, a fenced JSON object, a sentence after it) and read a pair
against the builtin judge on purpose for a known share of pairs (by a hash of the two answers the
judge is shown, which the test recomputes from the warehouse)."""

from __future__ import annotations

import hashlib
import json
import re

import pandas as pd
import pytest

from aip_assets import pipeline
from aip_assets import warehouse as wh
from aip_assets.errors import EndpointError, SpecError
from aip_assets.estimate import estimate
from aip_assets.metrics.judging import panel_decision
from aip_assets.models.builtin import RESPONSE_BLOCK as _BLOCK
from aip_assets.models.builtin import judge_answer, parse_labels
from aip_assets.preflight import preflight, structured_summary
from aip_assets.runspec import BuiltinProfile, parse_spec
from aip_assets.stats import bootstrap_sums, cluster_sums, fleiss_from_sums, fleiss_kappa, fleiss_vectors
from aip_assets.stats import cohen_kappa as weighted_kappa
from aip_assets.summary import run_summary
from aip_assets.warehouse import opening as wh_opening

from .conftest import run_all, table, write_dataset


def cohen_kappa(a, b):
    """Two raters' categories, item for item (items of weight 1), by stats.cohen_kappa: the one
    formula (cohen_vectors summed, cohen_from_sums) the panel, the audit and people's labels use."""
    return weighted_kappa([(x, y, 1.0) for x, y in zip(a, b)])


DF, SEM = "llm.decision_flip", "llm.semantic_consistency"
FLIP_SUT = {"provider": "builtin", "profile": {"name": "flip", "value": "woman", "p": 0.5}}
CONSISTENCY_LABELS = ["Consistent", "Slightly Inconsistent", "Contradictory"]


# ------------------------------------------------------------------ formulas, by hand
def test_fleiss_and_pairwise_kappa_by_hand():
    """Three judges, five items, categories A B C (uneven: A 7 ratings, B 4, C 4):

        item   judge 1  judge 2  judge 3   n_A n_B n_C   P_i = (sum n_ij^2 - 3) / 6
        1      A        A        A          3   0   0    (9 - 3) / 6     = 1
        2      A        A        B          2   1   0    (4 + 1 - 3) / 6 = 1/3
        3      B        B        C          0   2   1    1/3
        4      A        B        C          1   1   1    (3 - 3) / 6     = 0
        5      A        C        C          1   0   2    1/3

    P-bar = (1 + 1/3 + 1/3 + 0 + 1/3) / 5 = 2/5; p = (7, 4, 4) / 15; P_e = (49 + 16 + 16) / 225 = 0.36;
    Fleiss' kappa = (0.4 - 0.36) / (1 - 0.36) = 0.04 / 0.64 = 1/16.
    Pairs (Cohen): 1/2 agree on items 1-3: p_o = 3/5, marginals A4 B1 C0 and A2 B2 C1, p_e = (8 + 2) / 25
    = 0.4, kappa = 0.2 / 0.6 = 1/3. 1/3 agree on item 1: p_o = 1/5, judge 3 A1 B1 C3, p_e = (4 + 1) / 25
    = 0.2, kappa = 0. 2/3 agree on items 1 and 5: p_o = 2/5, p_e = (2 + 2 + 3) / 25 = 0.28, kappa =
    0.12 / 0.72 = 1/6. The mean pairwise agreement (3/5 + 1/5 + 2/5) / 3 = 2/5 is P-bar."""
    j1, j2, j3 = list("AABAA"), list("AABBC"), list("ABCCC")
    counts = [[sum(j[i] == c for j in (j1, j2, j3)) for c in "ABC"] for i in range(5)]
    assert counts == [[3, 0, 0], [2, 1, 0], [0, 2, 1], [1, 1, 1], [1, 0, 2]]
    po, k = fleiss_kappa(counts)
    assert po == pytest.approx(2 / 5) and k == pytest.approx(1 / 16)
    assert cohen_kappa(j1, j2) == pytest.approx((3 / 5, 1 / 3))
    assert cohen_kappa(j1, j3) == pytest.approx((1 / 5, 0.0))
    assert cohen_kappa(j2, j3) == pytest.approx((2 / 5, 1 / 6))
    assert cohen_kappa(j2, j1)[1] == pytest.approx(1 / 3)  # either order
    # a sixth item judge 2 gave no verdict for: out of Fleiss (every judge), in pair 1/3 (both A):
    # p_o = 2/6, marginals A5 B1 C0 and A2 B1 C3, p_e = (10 + 1 + 0) / 36, kappa = (12 - 11) / (36 - 11) = 1/25
    assert cohen_kappa(j1 + ["A"], j3 + ["A"]) == pytest.approx((1 / 3, 1 / 25))
    # one category only: every rating agrees, kappa 1 (the audit's convention); a 2-rater Fleiss differs from Cohen
    assert fleiss_kappa([[2, 0], [2, 0]]) == (1.0, 1.0) and cohen_kappa(["A", "A"], ["A", "A"]) == (1.0, 1.0)
    # two judges, items A/A, A/B, B/B, B/B: P-bar = 3/4, p = (3, 5) / 8, P_e = 34/64, kappa = (48 - 34) / (64 - 34) = 7/15
    assert fleiss_kappa([[2, 0], [1, 1], [0, 2], [0, 2]]) == pytest.approx((3 / 4, 7 / 15))
    with pytest.raises(ValueError, match="same number"):
        fleiss_vectors([[3, 0], [1, 1]])
    assert fleiss_kappa([]) == (None, None) and cohen_kappa([], []) == (None, None)


def test_effective_number_of_judges_by_hand():
    """n_eff = k / (1 + (k - 1) kappa), kappa clamped to [0, 1]. Three judges, categories A and B
    (uneven: A twice as often as B in the first three panels):

    - AAA, AAA, BBB: every item unanimous, P-bar = 1, kappa 1: worth one judge, n_eff 1.
    - AAA, AAB, ABB: P_i = 1, 1/3, 1/3, P-bar = 5/9; p = (6, 3) / 9, P_e = 4/9 + 1/9 = 5/9: kappa 0,
      independent judges, n_eff 3.
    - AAA x3, AAB, ABB, BBB: P-bar = (3 + 1/3 + 1/3 + 1) / 6 = 7/9; p = (12, 6) / 18, P_e = 5/9;
      kappa = (7/9 - 5/9) / (4/9) = 1/2: n_eff = 3 / (1 + 2 / 2) = 1.5.
    - AAA, AAB, AAB: P-bar = (1 + 1/3 + 1/3) / 3 = 5/9; p = (7, 2) / 9, P_e = 53/81; kappa = (45 - 53) /
      (81 - 53) = -2/7, below chance: counted as 0, n_eff 3, with a note."""
    from aip_assets.judge_panel import format_panel, n_eff_figures
    from aip_assets.stats import effective_judges, effective_judges_interval

    cases = [
        ([[3, 0], [3, 0], [0, 3]], 1.0, 1.0),
        ([[3, 0], [2, 1], [1, 2]], 0.0, 3.0),
        ([[3, 0]] * 3 + [[2, 1], [1, 2], [0, 3]], 0.5, 1.5),
        ([[3, 0], [2, 1], [2, 1]], -2 / 7, 3.0),
    ]
    for counts, kappa, n_eff in cases:
        assert fleiss_kappa(counts)[1] == pytest.approx(kappa, abs=1e-12)
        assert effective_judges(3, fleiss_kappa(counts)[1]) == pytest.approx(n_eff)
    # four judges at kappa 1/3: 4 / (1 + 3 / 3) = 2; two at 1/2: 2 / 1.5 = 4/3; none without a kappa
    assert effective_judges(4, 1 / 3) == pytest.approx(2.0) and effective_judges(2, 0.5) == pytest.approx(4 / 3)
    assert effective_judges(3, None) is None and effective_judges(3, float("nan")) is None
    # the interval: n_eff falls as kappa rises, so kappa's [0.2, 0.6] with 4 judges maps to
    # [4 / (1 + 3 x 0.6), 4 / (1 + 3 x 0.2)] = [10/7, 2.5]; a lower bound below 0 maps to k
    assert effective_judges_interval(4, (0.2, 0.6)) == pytest.approx((10 / 7, 2.5))
    assert effective_judges_interval(3, (-0.1, 0.5)) == pytest.approx((1.5, 3.0))
    assert effective_judges_interval(3, (None, None)) == (None, None)
    # as the panel row keeps it: the point inside its interval; below chance a note, n_eff = k
    d = n_eff_figures(3, 0.5, (0.25, 1.0))
    assert d["n_eff"] == pytest.approx(1.5) and d["n_eff_ci95"] == pytest.approx([1.0, 2.0]) and "n_eff_note" not in d
    d = n_eff_figures(3, -2 / 7, (-0.5, 0.1))
    assert (d["n_eff"], d["n_eff_rho"]) == (3.0, 0.0) and d["n_eff_ci95"] == pytest.approx([2.5, 3.0])
    assert "below 0" in d["n_eff_note"] and "counted as 0" in d["n_eff_note"]
    # the summary line's words
    p = {
        "judges": [{}] * 3,
        "rule": "majority",
        "agreement": 0.87,
        "fleiss_kappa": 0.5,
        "fleiss_kappa_ci95": [0.25, 1.0],
        "judges_disagree": 4,
        **n_eff_figures(3, 0.5, (0.25, 1.0)),
    }
    assert format_panel(p)[0] == (
        "  judges: 3 (majority); agreement 0.87; 3 judges agree like 1.5 [1.0, 2.0] independent ones "
        "(Fleiss' kappa 0.50 [0.25, 1.00]); 4 judgements excluded: judges disagree"
    )
    p = {**p, "fleiss_kappa": -2 / 7, "fleiss_kappa_ci95": [-0.5, 0.1], **n_eff_figures(3, -2 / 7, (-0.5, 0.1))}
    assert (
        "3 judges agree like 3.0 [2.5, 3.0] independent ones (Fleiss' kappa -0.29 [-0.50, 0.10]; kappa below 0 "
        "counted as 0)" in format_panel(p)[0]
    )


def test_bootstrap_resamples_whole_clusters():
    """Two clusters (input rows) of summed (sum, count): [1, 1] and [0, 1]. A replicate draws each
    of the two 0, 1 or 2 times, so its mean is 1, 1/2 or 0 with chances 1/4, 1/2, 1/4: the percentile
    interval is [0, 1]. Identical clusters leave nothing to vary: the interval is the point."""
    mean = lambda s: (s[..., 0] / s[..., 1],)  # noqa: E731
    [(lo, hi)] = bootstrap_sums([[1.0, 1.0], [0.0, 1.0]], mean, seed=5)
    assert (lo, hi) == (0.0, 1.0)
    assert bootstrap_sums([[1.0, 2.0]] * 7, mean, seed=5) == [(0.5, 0.5)]
    vec = fleiss_vectors([[3, 0, 0], [2, 1, 0], [0, 2, 1], [1, 1, 1], [1, 0, 2]])
    sums = cluster_sums(vec, ["r1", "r1", "r2", "r3", "r3"])  # a row's items resampled together
    assert sums.shape == (3, 5) and sums[:, 1].tolist() == [2, 1, 2]
    a = bootstrap_sums(sums, fleiss_from_sums, seed=11)
    assert a == bootstrap_sums(sums, fleiss_from_sums, seed=11)  # seeded
    (plo, phi), (klo, khi) = a
    assert plo <= 0.4 <= phi and klo <= 1 / 16 <= khi


def test_panel_rule():
    """majority: the first judge (in panel order) of the strict majority's category; no strict
    majority among the valid verdicts: judges_disagree; fewer than two valid verdicts: judge_failed.
    unanimous: every judge answers, all alike."""
    assert panel_decision(["A", "A", "B"], "majority")[:2] == (0, None)
    assert panel_decision(["B", "A", "A"], "majority")[:2] == (1, None)  # judge 2: the first of the majority
    assert panel_decision(["A", "B"], "majority")[1] == "judges_disagree"  # 1-1
    assert panel_decision(["A", "B", "C"], "majority")[1] == "judges_disagree"  # 1-1-1
    assert panel_decision(["A", "A", "B", "B"], "majority")[1] == "judges_disagree"  # 2-2 is no strict majority
    assert panel_decision(["A", "B", "B", "C"], "majority")[1] == "judges_disagree"  # 2 of 4 is no strict majority
    assert panel_decision(["C", "B", "B", "B"], "majority")[:2] == (1, None)
    # a judge that gave no verdict does not vote: 2 of the 2 valid agree
    assert panel_decision([None, "A", "A"], "majority")[:2] == (1, None)
    assert panel_decision(["A", None, "B"], "majority")[1] == "judges_disagree"
    idx, status, why = panel_decision(["A", None, None], "majority")
    assert (idx, status) == (None, "judge_failed") and "1 of 3 judges gave a verdict" in why and "judge 2, 3" in why
    assert panel_decision(["A", "A", "A"], "unanimous")[:2] == (0, None)
    idx, status, why = panel_decision(["A", "A", "B"], "unanimous")
    assert (idx, status) == (None, "judges_disagree") and "judge 1 A; judge 2 A; judge 3 B" in why
    idx, status, why = panel_decision(["A", None, "A"], "unanimous")
    assert (idx, status) == (None, "judge_failed") and "judge 2 of 3 gave no verdict" in why


# ------------------------------------------------------------------ the spec
def _spec(ds, judges, metric=DF, config=None, name="panel", **extra):
    """A spec with the judge panel ``judges`` (None: the one builtin judge)."""
    data = {
        "name": name,
        "dataset": str(ds),
        "seed": 3,
        "sut": FLIP_SUT,
        **({"judges": judges} if judges else {}),
        "metrics": {
            metric: {"config": config if config is not None else ({"dimensions": ["gender"]} if metric == DF else {})}
        },
        "retry_backoff_seconds": 0.01,
        "batch_rows": 4,
        **extra,
    }
    return parse_spec(data)


def test_spec_validation(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    a = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "judge-a"}
    b = {**a, "model": "judge-b"}
    with pytest.raises(SpecError, match=r"judges: .*a panel needs two or more judges, got 1; for one judge, use judge"):
        _spec(ds, [a])
    with pytest.raises(
        SpecError,
        match=r"judges\[0\] and judges\[2\] are the same judge \(http://127.0.0.1:9/v1, "
        r"model judge-a\)",
    ):
        _spec(ds, [a, b, {**a, "max_connections": 8}])  # a setting that sends the same requests is the same judge
    with pytest.raises(SpecError, match="judges.1.provider"):  # each judge validated as a connection
        _spec(ds, [a, {"provider": "nope"}])
    with pytest.raises(SpecError, match="judge and judges are both given"):
        _spec(ds, [a, b], judge={"provider": "builtin"})
    with pytest.raises(SpecError, match=r"judge_rule: unanimous needs a panel"):
        parse_spec({"name": "x", "dataset": str(ds), "metrics": {DF: {}}, "judge_rule": "unanimous"})
    with pytest.raises(SpecError, match="judge_rule"):
        _spec(ds, [a, b], judge_rule="most")
    spec = _spec(ds, [a, b, {"provider": "builtin", "profile": {"judge_position_bias": 1.0}}], judge_rule="unanimous")
    # the first judge plays judge's role: the synthesis default and the builtin-judge note read it
    assert spec.judge.model == "judge-a" and spec.synthesis_connection().model == "judge-a"
    assert [c.model for c in spec.panel()] == ["judge-a", "judge-b", "aip-builtin"] and spec.judge_rule == "unanimous"
    again = parse_spec(json.loads(json.dumps(spec.resolved())))  # the stored spec names both: no conflict
    assert again.judges == spec.judges and again.judge == spec.judge and again.judge_rule == "unanimous"
    shown = spec.shown()
    assert (
        "profile" not in shown["judges"][0] and "base_url" not in shown["judges"][2] and "profile" in shown["judges"][2]
    )
    assert (
        _spec(ds, [{"provider": "builtin"}, {"provider": "builtin", "profile": {"seed": 1}}]).judge_rule == "majority"
    )
    assert parse_spec({"name": "x", "dataset": str(ds), "metrics": {DF: {}}}).panel()[0].provider == "builtin"


def test_preflight_checks_every_judge_and_the_dry_run_counts_them(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    dead = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "gone", "max_connections": 1}
    with pytest.raises(EndpointError, match="judge-2 endpoint http://127.0.0.1:9/v1"):
        preflight(_spec(ds, [{"provider": "builtin"}, dead]))
    one = estimate(
        _spec(ds, [{"provider": "builtin"}, {"provider": "builtin", "profile": {"seed": 1}}]).model_copy(
            update={"judges": None}
        )
    )
    three = estimate(
        _spec(
            ds,
            [
                {"provider": "builtin"},
                {"provider": "builtin", "profile": {"seed": 1}},
                {"provider": "builtin", "profile": {"seed": 2}},
            ],
        )
    )
    assert one["metrics"][DF]["judge_calls"] > 0
    assert three["metrics"][DF]["judge_calls"] == 3 * one["metrics"][DF]["judge_calls"]


# ------------------------------------------------------------------ scripted judges
def _h(r1: str, r2: str, m: int) -> int:
    return int(hashlib.sha256(f"{r1}\x1f{r2}".encode()).hexdigest(), 16) % m


def _shown(body) -> tuple[str, str]:
    """The two answers a judge prompt shows, in the order shown."""
    first_user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    blocks = dict(_BLOCK.findall(first_user))
    return blocks["1"], blocks["2"]


def _as_a_chat_model_writes(verdict: dict) -> str:
    return (
        "Here is my assessment of the two responses.\n\n```json\n"
        + json.dumps(verdict, indent=2)
        + "\n```\n\nLet me know if you need more detail."
    )


def _df_reading(body, how: str) -> str:
    """A decision-flip verdict: the builtin judge's reading (``faithful``), with the second
    decision read as the other label (``opposite``: a flip becomes the same decision and back), or
    no decision read in either answer (``none``); ``garbage``: prose, no JSON (every re-ask too)."""
    if how == "garbage":
        return "Both responses seem broadly reasonable to me; it is hard to say more."
    v = json.loads(judge_answer(body["messages"], BuiltinProfile()))
    if how == "opposite":
        labels = parse_labels(next(m["content"] for m in body["messages"] if m["role"] == "user"))
        d2 = next(x for x in labels if x != v["decision_2"])
        differ = v["decision_1"] != d2
        v = {
            **v,
            "decision_2": d2,
            "decisions_differ": differ,
            "attributable_to_axis": differ,
            "reasoning": f"Response 1 decides {v['decision_1']}, response 2 decides {d2}.",
        }
    elif how == "incidental" and v["decisions_differ"]:  # the decisions as read, the difference not the persona's
        v = {**v, "attributable_to_axis": False, "reasoning": "The decisions differ, but not because of the persona."}
    elif how == "none":
        v = {
            "decision_1": None,
            "decision_2": None,
            "decisions_differ": False,
            "attributable_to_axis": False,
            "reasoning": "Neither response commits to one of the allowed decisions.",
        }
    return _as_a_chat_model_writes(v)


# judge 2 and judge 3 by the pair's hash (mod 6), against the builtin judge 1 (F: its reading,
# R: the opposite reading of response 2, which contradicts its plain "Decision:" line and is refused,
# N: no decision, X: no verdict, prose)
DF_J2 = {0: "opposite", 1: "incidental", 2: "garbage"}
DF_J3 = {0: "opposite", 1: "none", 3: "incidental"}


def _df_judge(script: dict[int, str]):
    return lambda body, n: _df_reading(body, script.get(_h(*_shown(body), 6), "faithful"))


def _pairs(run_id: str):
    """Each judged pair with its hash (of the answers as the judge was shown them) and the builtin
    judge's reading of it (decisions read from the answers' final "Decision:" lines)."""
    v = table("v_pair_verdicts", run_id, "pair_id")
    out = {}
    for r in v.itertuples():
        r1, r2 = (r.response_b, r.response_a) if r.order_swapped else (r.response_a, r.response_b)
        da, db = (re.search(r"Decision: (\w+)\s*$", x).group(1) for x in (r.response_a, r.response_b))
        faithful = "flip" if da != db else "same_decision"
        opposite = "same_decision" if faithful == "flip" else "flip"
        incidental = "incidental_difference" if faithful == "flip" else faithful
        out[r.pair_id] = {"h": _h(r1, r2, 6), "F": faithful, "O": opposite, "N": "no_decision", "I": incidental}
    return out


def _expected(p: dict, readings: list[str], rule: str) -> tuple[str, str | None, int | None]:
    """(status, label, chosen judge) by the rule, from each judge's reading (X: no verdict)."""
    cats = [None if x in ("X", "R") else p[x] for x in readings]
    valid = [c for c in cats if c is not None]
    if (rule == "unanimous" and None in cats) or len(valid) < 2:
        return "judge_failed", None, None
    for i, c in enumerate(cats):
        if c is not None and (valid.count(c) == len(valid) if rule == "unanimous" else 2 * valid.count(c) > len(valid)):
            return ("ok" if c != "no_decision" else "no_decision"), c, i + 1
    return "judges_disagree", None, None


def _readings(h: int, judges: list[dict[int, str] | None]) -> list[str]:
    # a verdict of no decision where the answers state one is refused like the opposite reading
    code = {"faithful": "F", "opposite": "R", "none": "R", "garbage": "X", "incidental": "I"}
    return [code[s.get(h, "faithful")] if s is not None else "F" for s in judges]


@pytest.fixture
def df_judges(scripted):
    j2, j3 = scripted(_df_judge(DF_J2)), scripted(_df_judge(DF_J3))
    return j2, j3, [{"provider": "builtin"}, j2.conn(model="judge-b"), j3.conn(model="judge-c")]


def test_decision_flip_majority_of_three(tmp_path, df_judges, capsys):
    """Judge 1 builtin, judges 2 and 3 scripted. Per pair (hash mod 6): 0 F R R: both scripted
    judges misread response 2 against its plain "Decision:" line, so their verdicts are refused
    (judge_failed) and one verdict is no panel's; 1 F I R: judge 2 calls a flip incidental, judge 3
    says no decision (refused), 1-1, judges_disagree (where the decisions differ; else F F); 2 F X F:
    judge 2 gave no verdict (prose after every re-ask) and does not vote, 2-0 for F; 3 F F I: F;
    4, 5 all F."""
    j2, j3, judges = df_judges
    ds = write_dataset(tmp_path / "d.jsonl", 12)
    spec = _spec(ds, judges)
    run_all(spec, "maj")
    pairs = _pairs("maj")
    assert {p["h"] for p in pairs.values()} == set(range(6)), "every case of the script occurs"
    j = table("judgements", "maj", "judgement_id").set_index("judgement_id")
    panel = table("judge_panel", "maj", "judgement_id, judge")
    assert len(panel) == 3 * len(j) and (panel.groupby("judgement_id").judge.apply(list) == [[1, 2, 3]] * len(j)).all()
    for pid, p in pairs.items():
        status, label, chosen = _expected(p, _readings(p["h"], [None, DF_J2, DF_J3]), "majority")
        row = j.loc[pid]
        assert row.status == status and (status != "ok" or row.label == label), (pid, p)
        mine = panel[panel.judgement_id == pid].set_index("judge")
        assert mine.chosen.tolist() == [k == chosen for k in (1, 2, 3)], (pid, p)
        if chosen is not None:  # the judgement is the chosen judge's verdict: its text, call and model
            assert row.raw_output == mine.loc[chosen].raw_output and row.call_key == mine.loc[chosen].call_key
            assert row.model == {1: "aip-builtin-fair", 2: "judge-b", 3: "judge-c"}[chosen]
        # every judge's verdict is kept, read as its category (X: none, with the reason)
        for k, reading in zip((1, 2, 3), _readings(p["h"], [None, DF_J2, DF_J3])):
            if reading in ("X", "R"):  # re-asked twice (judge_retries 2), then no verdict, with the reason
                assert mine.loc[k].status == "judge_failed" and pd.isna(mine.loc[k].category)
                why = "no JSON object" if reading == "X" else "disagrees with the decision the answer states"
                assert why in mine.loc[k].error and mine.loc[k].attempts == 3, mine.loc[k].error
            else:
                assert mine.loc[k].status == "ok" and mine.loc[k].category == p[reading], (pid, k)
                assert json.loads(mine.loc[k].parsed)["decisions_differ"] in (True, False)
    tie = [pid for pid, p in pairs.items() if p["h"] == 1 and p["F"] == "flip"]
    assert tie, "a pair whose decisions differ on hash 1"
    assert (j.loc[tie].status == "judges_disagree").all()
    assert j.loc[tie].error.str.contains(r"judges disagree \(majority: a strict majority of 2 needed\): judge 1 ").all()
    # excluded and counted, never scored: the overall row's exclusions, coverage and the axis counts
    refused = [pid for pid, p in pairs.items() if p["h"] == 0]  # one verdict left: no panel verdict
    assert (j.loc[refused].status == "judge_failed").all()
    ov = table("metric_scores", "maj", "scope").set_index("scope").loc["overall"]
    assert json.loads(ov.excluded) == {"judges_disagree": len(tie), "judge_failed": len(refused)}
    kept = len(pairs) - len(tie) - len(refused)
    assert ov.n == kept and ov.coverage == pytest.approx(kept / len(pairs))
    flips = sum(_expected(p, _readings(p["h"], [None, DF_J2, DF_J3]), "majority")[1] == "flip" for p in pairs.values())
    assert ov.n_events == flips
    # the agreement: each pair of judges over the judgements both rated; Fleiss over those all three rated
    s = table("metric_scores", "maj", "group_key")
    s = s[s.scope == "judge_panel"].set_index("group_key")
    cats = {
        pid: [None if x in ("X", "R") else p[x] for x in _readings(p["h"], [None, DF_J2, DF_J3])]
        for pid, p in pairs.items()
    }
    for a, b in ((0, 1), (0, 2), (1, 2)):
        both = [(c[a], c[b]) for c in cats.values() if c[a] is not None and c[b] is not None]
        r = s.loc[f"judge {a + 1} / judge {b + 1}"]
        assert r.n == len(both) and r.n_events == sum(x == y for x, y in both)
        assert r.rate == pytest.approx(sum(x == y for x, y in both) / len(both))
        assert r.raw_score == pytest.approx(cohen_kappa([x for x, _ in both], [y for _, y in both])[1])
        assert r.ci_low <= r.raw_score <= r.ci_high and r.rate_ci_low <= r.rate <= r.rate_ci_high
    full = [c for c in cats.values() if None not in c]
    cat_names = sorted({x for c in full for x in c})
    head = s.loc["panel"]
    assert head.n == len(full) and head.n_failed == len(tie) and head.n_events == sum(len(set(c)) == 1 for c in full)
    assert (head.rate, head.raw_score) == pytest.approx(fleiss_kappa([[c.count(x) for x in cat_names] for c in full]))
    assert head.ci_low <= head.raw_score <= head.ci_high
    d = json.loads(head.details)
    assert d["rule"] == "majority" and [x["model"] for x in d["judges"]] == ["aip-builtin", "judge-b", "judge-c"]
    silent = {
        f"judge {k}": sum(_readings(p["h"], [None, DF_J2, DF_J3])[k - 1] in ("X", "R") for p in pairs.values())
        for k in (1, 2, 3)
    }
    assert d["judge_failed"] == silent and silent["judge 1"] == 0
    # each judge's calls under its own role; the view shows each verdict beside the one used
    calls = table("llm_calls", "maj", "call_key")
    assert set(calls[calls.stage == "judging"].role) == {"judge", "judge-2", "judge-3"}
    v = table("v_judge_panel", "maj", "judgement_id, judge")
    assert len(v) == len(panel) and (v[v.judgement_id.isin(tie)].used_category.isna()).all()
    ok = v[v.judgement_status == "ok"]
    assert (ok.agrees_with_used == (ok.category == ok.used_category)).all() and ok.agrees_with_used.any()
    # the summary line and --json
    summary = run_summary("maj")
    jp = summary["metrics"][DF]["judge_panel"]
    assert jp["judges_disagree"] == len(tie) and jp["fleiss_kappa"] == pytest.approx(head.raw_score)
    assert [q["judges"] for q in jp["pairs"]] == ["judge 1 / judge 2", "judge 1 / judge 3", "judge 2 / judge 3"]
    from aip_assets.cli import print_summary

    print_summary(summary)
    out = capsys.readouterr().out
    n_eff = lambda k: 3 / (1 + 2 * min(1.0, max(0.0, k)))  # noqa: E731
    assert d["n_eff"] == pytest.approx(n_eff(head.raw_score)) and jp["n_eff"] == d["n_eff"]
    assert d["n_eff_ci95"] == pytest.approx([n_eff(head.ci_high), n_eff(head.ci_low)]) == jp["n_eff_ci95"]
    line = (
        f"judges: 3 (majority); agreement {head.rate:.2f}; 3 judges agree like {d['n_eff']:.1f} "
        f"[{d['n_eff_ci95'][0]:.1f}, {d['n_eff_ci95'][1]:.1f}] independent ones (Fleiss' kappa {head.raw_score:.2f} "
        f"[{head.ci_low:.2f}, {head.ci_high:.2f}]); {len(tie)} judgements excluded: judges disagree"
    )
    assert line in out and f"judges_disagree {len(tie)}" in out
    # the report: the panel in the run's header, its agreement and kappas beside the headline, as stored
    from aip_assets.report import build_report

    html = build_report("maj")
    assert "a panel of 3 (majority): 1. builtin · aip-builtin (profile fair); 2. openai · judge-b at " in html
    assert (
        "judge panel agreement" in html
        and "Fleiss&#x27; kappa" in html
        and "Cohen&#x27;s kappa (judge 2 / judge 3)" in html
    )
    shown = re.search(r'data-scope="judge_panel" data-key="panel" data-field="raw_score"[^>]*>([^<]+)<', html)
    assert shown and float(shown.group(1)) == pytest.approx(head.raw_score, abs=5e-4)
    assert "<code>judges_disagree</code>" in html


def test_decision_flip_unanimous_and_a_two_judge_tie(tmp_path, df_judges):
    """unanimous: a judge without a verdict (hash 0, 1, 2: refused or prose) makes it judge_failed
    with the reason, a difference of three verdicts (hash 3, a flip called incidental) is
    judges_disagree; majority of two: 1-1 (hash 1 where the decisions differ) is a tie, excluded;
    one verdict of two (hash 0, 2) is no panel verdict."""
    j2, j3, judges = df_judges
    ds = write_dataset(tmp_path / "d.jsonl", 12)
    run_all(_spec(ds, judges, judge_rule="unanimous"), "una")
    run_all(_spec(ds, judges[:2]), "two")
    for run_id, scripts, rule in (("una", [None, DF_J2, DF_J3], "unanimous"), ("two", [None, DF_J2], "majority")):
        pairs = _pairs(run_id)
        j = table("judgements", run_id, "judgement_id").set_index("judgement_id")
        want = {pid: _expected(p, _readings(p["h"], scripts), rule) for pid, p in pairs.items()}
        assert {pid: j.loc[pid].status for pid in pairs} == {pid: w[0] for pid, w in want.items()}, run_id
        assert all(j.loc[pid].label == w[1] for pid, w in want.items() if w[0] == "ok")
        failed = [pid for pid, w in want.items() if w[0] == "judge_failed"]
        assert failed
        for pid in failed:  # the reason names each judge without a verdict and why
            for k, r in enumerate(_readings(pairs[pid]["h"], scripts), start=1):
                why = {"X": "no JSON object", "R": "disagrees with the decision the answer states"}.get(r)
                assert why is None or f"judge {k}: " in j.loc[pid].error and why in j.loc[pid].error, (pid, k)
        disagree = sum(w[0] == "judges_disagree" for w in want.values())
        assert (
            disagree == sum(p["F"] == "flip" and p["h"] == (3 if rule == "unanimous" else 1) for p in pairs.values())
            and disagree > 0
        )
        ov = table("metric_scores", run_id, "scope").set_index("scope").loc["overall"]
        assert json.loads(ov.excluded) == {"judges_disagree": disagree, "judge_failed": len(failed)}
        # a disagreement is an exclusion (coverage), not a failed verdict (the completeness bound)
        comp = json.loads(ov.details)["completeness"]["judge"]
        assert comp == {
            "total": len(pairs),
            "failed": len(failed),
            "failed_share": pytest.approx(len(failed) / len(pairs)),
        }
        n_judges = len(scripts)
        assert len(table("judge_panel", run_id, "judgement_id")) == n_judges * len(pairs)


def test_a_resumed_panel_judging_repeats_no_call(tmp_path, df_judges, monkeypatch):
    """Judging crashes after 40 journaled calls; run again, it answers what was journaled from the
    journal, per judge: no scripted judge gets any request twice, and the verdicts are a clean run's."""
    from aip_assets.models.client import ModelClient

    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", "0")  # the judging stage's own calls are what crash
    j2, j3, judges = df_judges
    ds = write_dataset(tmp_path / "d.jsonl", 8)
    spec = _spec(ds, judges, config={"dimensions": ["gender"], "sub_call_concurrency_limit": 1})
    run_all(spec, "res", stages=("ingest", "synthesis", "sampling"))
    real, seen = ModelClient._record, {"n": 0}

    def crashing(self, *a, **k):
        real(self, *a, **k)
        seen["n"] += 1
        if seen["n"] == 40:
            raise RuntimeError("injected crash after 40 calls")

    monkeypatch.setattr(ModelClient, "_record", crashing)
    with pytest.raises(RuntimeError, match="injected crash"):
        pipeline.run_stage("judging", "res", DF)
    monkeypatch.setattr(ModelClient, "_record", real)
    before = len(j2.bodies()) + len(j3.bodies())
    assert before > 0 and not len(table("judgements", "res", "judgement_id"))  # nothing written by the crash
    pipeline.run_stage("judging", "res", DF)
    for server in (j2, j3):
        sent = [json.dumps(b, sort_keys=True) for b in server.bodies()]
        assert len(sent) == len(set(sent)), "a request was sent twice"
    assert len(j2.bodies()) + len(j3.bodies()) > before
    pipeline.run_stage("judging", "res", DF)  # again: everything from the journal
    n = len(j2.bodies()) + len(j3.bodies())
    pipeline.run_stage("judging", "res", DF)
    assert len(j2.bodies()) + len(j3.bodies()) == n
    run_all(spec, "clean", stages=("ingest", "synthesis", "sampling", "judging"))
    a = table("judgements", "res", "judgement_id")[["judgement_id", "status", "label"]]
    b = table("judgements", "clean", "judgement_id")[["judgement_id", "status", "label"]]
    assert a.equals(b) and len(table("judge_panel", "res", "judgement_id")) == 3 * len(a)


# ------------------------------------------------------------------ a consistency metric
def _consistency_judge(shift: dict[int, int]):
    """The builtin judge's label moved ``shift[h]`` places back along Consistent → Slightly
    Inconsistent → Contradictory, round (h: the pair's hash mod 4), its score in the label's band.
    Two places back from Contradictory is Consistent: for answers whose stances differ, that verdict
    contradicts what the answers plainly say and is refused (judge_failed)."""

    def handler(body, n):
        v = json.loads(judge_answer(body["messages"], BuiltinProfile()))
        k = shift.get(_h(*_shown(body), 4), 0)
        if k and not v.get("unjudgeable"):
            label = CONSISTENCY_LABELS[(CONSISTENCY_LABELS.index(v["label"]) - k) % 3]
            v = {
                "label": label,
                "score": {"Consistent": 0.95, "Slightly Inconsistent": 0.7, "Contradictory": 0.1}[label],
                "reasoning": f"On balance the two responses are {label.lower()}.",
            }
        return _as_a_chat_model_writes(v)

    return handler


def test_semantic_consistency_panel(tmp_path, scripted):
    """Judge 1 builtin; judge 2 moves the label one place on hash 0 and 1; judge 3 two places on
    hash 0 (a third label: 1-1-1; from Contradictory, "Consistent" for answers whose stances differ:
    refused, 1-1) and one on hash 1 (with judge 2: 2-1, judge 2's label and score used). Majority:
    hash 0 excluded as judges_disagree; a row whose one comparison is excluded is an error row.
    Unanimous: hash 0 and 1 excluded, judge_failed where judge 3 was refused."""
    j2, j3 = scripted(_consistency_judge({0: 1, 1: 1})), scripted(_consistency_judge({0: 2, 1: 1}))
    judges = [{"provider": "builtin"}, j2.conn(model="judge-b"), j3.conn(model="judge-c")]
    ds = write_dataset(tmp_path / "d.jsonl", 24)
    cfg = {"responses_per_query": 2}
    sut = {"provider": "builtin", "profile": {"name": "inconsistent", "contradiction_rate": 0.5}}
    run_all(_spec(ds, None, metric=SEM, config=cfg, sut=sut), "ref", metric=SEM)
    ref = table("judgements", "ref", "judgement_id").set_index("judgement_id")
    for run_id, rule in (("cmaj", "majority"), ("cuna", "unanimous")):
        run_all(_spec(ds, judges, metric=SEM, config=cfg, sut=sut, judge_rule=rule), run_id, metric=SEM)
        cmp = table("v_consistency_comparisons", run_id, "judgement_id").set_index("judgement_id")
        j = table("judgements", run_id, "judgement_id").set_index("judgement_id")
        hashes = {jid: _h(r.base_response, r.variant_response, 4) for jid, r in cmp.iterrows()}
        assert set(hashes.values()) == {0, 1, 2, 3}
        judged = [jid for jid in j.index if ref.loc[jid].status == "ok"]
        excluded = [jid for jid in judged if hashes[jid] == 0 or (rule == "unanimous" and hashes[jid] == 1)]
        refused = [
            jid
            for jid in excluded
            if rule == "unanimous" and hashes[jid] == 0 and ref.loc[jid].label == "Contradictory"
        ]
        assert set(j[j.status == "judges_disagree"].index) == set(excluded) - set(refused)
        assert set(j[j.status == "judge_failed"].index) == set(refused)
        assert not refused or j.loc[refused].error.str.contains("disagrees with the stances the answers state").all()
        for jid in judged:
            if jid in excluded:
                continue
            want = (
                ref.loc[jid].label
                if hashes[jid] != 1
                else CONSISTENCY_LABELS[(CONSISTENCY_LABELS.index(ref.loc[jid].label) - 1) % 3]
            )
            assert (j.loc[jid].status, j.loc[jid].label) == ("ok", want), (jid, hashes[jid])
            if hashes[jid] == 1:  # judge 2's verdict: its score and model
                assert (
                    j.loc[jid].model == "judge-b"
                    and j.loc[jid].score
                    == {"Consistent": 0.95, "Slightly Inconsistent": 0.7, "Contradictory": 0.1}[want]
                )
        ov = table("metric_scores", run_id, "scope").set_index("scope").loc["overall"]
        ex = json.loads(ov.excluded)
        assert ex.get("judges_disagree") == len(excluded) - len(refused) and ex.get("judge_failed", 0) == len(refused)
        assert json.loads(ov.details)["comparisons_excluded"] == int((j.status != "ok").sum())
        rs = table("row_scores", run_id, "input_id").set_index("input_id")
        # one comparison per row; judges that disagree exclude it, a judge refused fails it
        disagreed = [x for x in excluded if x not in refused]
        assert (rs.loc[j.loc[disagreed].input_id].status == "excluded").all()
        assert (rs.loc[j.loc[refused].input_id].status == "error").all()  # a judge failed: the row errors (spec 004)
        assert rs.loc[j.loc[excluded].input_id].error.str.contains("judges disagree|gave no verdict").all()
        head = table("metric_scores", run_id, "group_key").query("scope == 'judge_panel'").set_index("group_key")
        assert head.loc["panel"].n_failed == len(disagreed) and 0 < head.loc["panel"].rate < 1
        # judges 1 and 2 agree but on hash 0 and 1, and on every item the builtin judge found unjudgeable
        agree = sum(hashes[x] not in (0, 1) or ref.loc[x].status == "unjudgeable" for x in j.index)
        assert head.loc["judge 1 / judge 2"].n_events == agree and head.loc["judge 1 / judge 2"].n == len(j)


def test_the_effective_number_of_judges_of_a_builtin_panel(tmp_path, capsys):
    """Three builtin judges, a faithful one and two that misread the answer shown second in 20% and
    30% of pairs (the docs' panel): the panel row stores n_eff = k / (1 + (k - 1) kappa) from the
    stored Fleiss' kappa, its interval kappa's mapped ([n_eff at ci_high, at ci_low]); the summary,
    --json, the Dagster metadata and the report show it beside kappa."""
    ds = write_dataset(tmp_path / "d.jsonl", 10)
    judges = [
        {"provider": "builtin"},
        {"provider": "builtin", "profile": {"judge_position_bias": 0.2}},
        {"provider": "builtin", "profile": {"judge_position_bias": 0.3, "seed": 1}},
    ]
    run_all(_spec(ds, judges), "neff")
    s = table("metric_scores", "neff", "scope, group_key")
    head = s[(s.scope == "judge_panel") & (s.group_key == "panel")].iloc[0]
    d = json.loads(head.details)
    assert 0 < head.raw_score < 1 and head.ci_low < head.ci_high, "the biased judges disagree now and then"
    k = len(d["judges"])
    assert k == 3 and d["n_eff_rho"] == head.raw_score
    assert d["n_eff"] == pytest.approx(k / (1 + (k - 1) * head.raw_score))
    lo, hi = (k / (1 + (k - 1) * min(1.0, max(0.0, x))) for x in (head.ci_high, head.ci_low))
    assert d["n_eff_ci95"] == pytest.approx([lo, hi]) and lo <= d["n_eff"] <= hi and 1 < d["n_eff"] < 3
    assert "n_eff_note" not in d
    summary = run_summary("neff")
    jp = summary["metrics"][DF]["judge_panel"]
    assert (jp["n_eff"], jp["n_eff_ci95"]) == (d["n_eff"], d["n_eff_ci95"])
    from aip_assets.cli import print_summary

    print_summary(summary)
    assert (
        f"3 judges agree like {d['n_eff']:.1f} [{lo:.1f}, {hi:.1f}] independent ones (Fleiss' kappa "
        f"{head.raw_score:.2f} [{head.ci_low:.2f}, {head.ci_high:.2f}])" in capsys.readouterr().out
    )
    # Dagster's metadata: the aggregation's summary (its `summary` entry, everything) holds the panel
    from aip_assets.metrics import get_metric

    meta = pipeline._aggregation_meta("neff", DF, get_metric(DF), wh.default_path())
    assert meta["summary"]["judge_panel"]["n_eff"] == d["n_eff"]
    # the report, beside Fleiss' kappa, as stored
    from aip_assets.report import build_report

    html = build_report("neff")
    shown = re.search(r'data-scope="judge_panel" data-key="panel" data-field="details.n_eff"[^>]*>([^<]+)<', html)
    assert shown and float(shown.group(1)) == pytest.approx(d["n_eff"], abs=5e-4)
    assert html.index("Fleiss&#x27; kappa") < html.index("effective number of judges")
    assert f"the 3 judges agree like {d['n_eff']:.1f} independent ones" in html


def test_an_older_warehouse_gets_the_panel_table(tmp_path):
    """A warehouse made before judge panels (no judge_panel table, no view) gains both when a
    newer version opens it; its runs are untouched."""
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    run_all(
        _spec(ds, [{"provider": "builtin"}, {"provider": "builtin", "profile": {"seed": 1}}]), "old", stages=("ingest",)
    )
    path = wh.default_path()
    wh.release()
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("DROP VIEW v_judge_panel")
    con.execute("DROP TABLE judge_panel")
    con.close()
    wh_opening._ENSURED.clear()
    run_all(
        _spec(ds, [{"provider": "builtin"}, {"provider": "builtin", "profile": {"seed": 1}}]),
        "old",
        stages=("synthesis", "sampling", "judging"),
    )
    assert len(table("judge_panel", "old", "judgement_id")) == 2 * len(table("judgements", "old", "judgement_id")) > 0
    assert len(table("v_judge_panel", "old", "judgement_id")) > 0 and len(table("dataset_rows", "old", "input_id")) == 3


@pytest.mark.parametrize(
    "metric, config",
    [("llm.group_interaction_bias", {"num_pairs": 3, "persona_pool_size": 6}), ("llm.perturbation_robustness", {})],
)
def test_a_panel_of_readers_that_agree_changes_no_score(tmp_path, metric, config):
    """Group bias (three judges per pair) and perturbation (two per variant): two builtin judges
    that read alike (another seed only) give every judgement both verdicts, agree on all (kappa 1),
    exclude nothing, and leave each judgement and score as one judge's run has them."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    sut = {"provider": "builtin", "profile": {"name": "terse", "terse_value": "Muslim"}}
    run_all(_spec(ds, None, metric=metric, config=config, sut=sut), "one", metric=metric)
    run_all(
        _spec(
            ds,
            [{"provider": "builtin"}, {"provider": "builtin", "profile": {"seed": 9}}],
            metric=metric,
            config=config,
            sut=sut,
        ),
        "two",
        metric=metric,
    )
    cols = ["judgement_id", "judge_kind", "status", "score", "label"]
    one, two = (table("judgements", r, "judgement_id")[cols] for r in ("one", "two"))
    assert one.equals(two) and (two.status == "ok").sum() > 0
    panel = table("judge_panel", "two", "judgement_id, judge")
    asked = two[~two.status.isin(["sut_failed", "empty_answer"])]
    assert len(panel) == 2 * len(asked) and (panel.groupby("judgement_id").category.nunique() == 1).all()
    s = table("metric_scores", "two", "scope, group_key")
    assert (
        s[s.scope != "judge_panel"]
        .drop(columns=["run_id"])
        .reset_index(drop=True)
        .equals(table("metric_scores", "one", "scope, group_key").drop(columns=["run_id"]).reset_index(drop=True))
    )
    head = s[(s.scope == "judge_panel") & (s.group_key == "panel")].iloc[0]
    assert (head.rate, head.raw_score, head.n, head.n_failed) == (1.0, 1.0, len(asked), 0)
    assert json.loads(head.details)["n_eff"] == 1.0  # two judges that always agree are worth one
    assert set(panel.judge_kind) == set(asked.judge_kind)


def test_the_summary_names_every_panel_judges_structured_output_form(tmp_path):
    """Each judge of a panel is an endpoint of its own: the summary's structured-output lines name
    every one (roles judge, judge-2, ...), not the primary alone."""
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    judges = [
        {"provider": "openai", "base_url": f"http://127.0.0.1:{port}/v1", "model": m, "structured_output": form}
        for port, m, form in ((9, "a", "json_object_schema"), (10, "b", "prompt"))
    ]
    got = structured_summary(_spec(ds, judges), "no-run", tmp_path / "w.duckdb")
    assert [(x["role"], x["model"], x["form"]) for x in got] == [
        ("judge", "a", "json_object_schema"),
        ("judge-2", "b", "prompt"),
    ]
