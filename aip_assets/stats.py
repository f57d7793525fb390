"""Intervals and score normalisation (DESIGN.md "Scores")."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054
BOOT_CELLS = 5_000_000  # cluster draws held in memory at once by the bootstrap (a chunk of resamples)


def wilson(k: float, n: float, z: float = Z95) -> tuple[float | None, float | None]:
    """Wilson score interval for a rate k/n; (None, None) when n == 0. (k and n may be effective
    counts, :func:`wilson_share`.)"""
    if n <= 0:
        return None, None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def bootstrap(vectors, stat, seed: int = 0, n_boot: int = 2000) -> tuple[float | None, float | None]:
    """95% percentile interval of ``stat`` of summed cluster vectors, resampling whole clusters
    (each a row: its units' summed values and count). Vectorised (numpy) in chunks of resamples,
    so 100,000 clusters take seconds, not minutes. The statistic is exactly the one the score
    reports (a pooled mean weighs each cluster by its units; see ``scoring``)."""
    out = bootstrap_distribution(vectors, stat, seed, n_boot)
    if out is None or not len(out):
        return None, None
    return float(out[int(0.025 * len(out))]), float(out[int(0.975 * len(out))])  # int(0.975 L) < L


def bootstrap_distribution(vectors, stat, seed: int = 0, n_boot: int = 2000):
    """The sorted bootstrap replicates of ``stat`` (NaN dropped), resampling whole clusters; None
    without clusters (see :func:`bootstrap`)."""
    import numpy as np

    vectors = np.asarray(vectors, dtype=float)
    g = len(vectors)
    if g == 0:
        return None
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, BOOT_CELLS // g))  # the chunking never changes the interval, only memory
    out = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        idx = rng.integers(0, g, size=(k, g))
        out[start : start + k] = stat(vectors[idx].sum(axis=1))
    return np.sort(out[~np.isnan(out)])


def cluster_bootstrap_mean(
    values: Sequence[float], clusters: Sequence[str], n_boot: int = 2000, seed: int = 0
) -> tuple[float | None, float | None]:
    """95% percentile interval of the pooled mean of ``values``, resampling whole clusters (input
    rows): :func:`bootstrap` of each cluster's (sum, count)."""
    if not values:
        return None, None
    sums: dict[str, list[float]] = {}
    for v, c in zip(values, clusters):
        s = sums.setdefault(c, [0.0, 0.0])
        s[0] += v
        s[1] += 1
    return bootstrap(list(sums.values()), lambda x: x[..., 0] / x[..., 1], seed=seed, n_boot=n_boot)


def normalise_array(raw, lo: float, hi: float, inverted: bool):
    """clip((raw - min) / (max - min), 0, 1), then 1 - x when inverted; vectorised (NaN stays NaN).
    With min == max the normalised score is a step: 1 at or above it, else 0."""
    import numpy as np

    raw = np.asarray(raw, dtype=float)
    x = np.where(raw >= hi, 1.0, 0.0) if hi == lo else np.clip((raw - lo) / (hi - lo), 0.0, 1.0)
    x = np.where(np.isnan(raw), np.nan, x)
    return 1.0 - x if inverted else x


def normalise(raw: float | None, lo: float, hi: float, inverted: bool) -> float | None:
    """:func:`normalise_array` of one raw score (None stays None)."""
    return None if raw is None else float(normalise_array(raw, lo, hi, inverted))


def normalise_interval(lo_raw, hi_raw, lo: float, hi: float, inverted: bool) -> tuple[float | None, float | None]:
    a, b = normalise(lo_raw, lo, hi, inverted), normalise(hi_raw, lo, hi, inverted)
    if a is None or b is None:
        return None, None
    return min(a, b), max(a, b)


def third(score: float) -> str:
    """A 0-1 score as a category for agreement between judges: low [0, 1/3), mid, high [2/3, 1]."""
    return "low" if score < 1 / 3 else ("mid" if score < 2 / 3 else "high")


def newcombe(k1: int, n1: int, k2: int, n2: int, z: float = Z95) -> tuple[float | None, float | None]:
    """Newcombe's hybrid score interval (his method 10) for the difference of two rates k1/n1 -
    k2/n2, from each rate's Wilson interval; (None, None) when either group is empty."""
    if n1 <= 0 or n2 <= 0:
        return None, None
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    assert l1 is not None and u1 is not None and l2 is not None and u2 is not None
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


# ------------------------------------------------------------------ a judge checked against people
def kish_n(weights: Sequence[float]) -> float:
    """Kish's effective sample size of weighted items: (sum w)^2 / sum w^2 (n when the weights are equal)."""
    s, s2 = float(sum(weights)), float(sum(w * w for w in weights))
    return 0.0 if s2 == 0 else s * s / s2


def wilson_share(p: float | None, n_eff: float, z: float = Z95) -> tuple[float | None, float | None]:
    """Wilson interval of a weighted share ``p`` at its effective sample size (:func:`kish_n`): the
    usual Wilson interval when every weight is 1."""
    if p is None or n_eff <= 0:
        return None, None
    return wilson(p * n_eff, n_eff, z)


def cohen_kappa(rated: Sequence[tuple[str, str, float]]) -> tuple[float | None, float | None]:
    """(observed agreement, Cohen's kappa) of two raters' categories over weighted items
    ``(rater 1, rater 2, weight)``: p_o the weighted share of items both put in one category, p_e the
    sum over categories of the product of the raters' weighted shares, kappa = (p_o - p_e) / (1 - p_e).
    With every weight 1 it is the textbook kappa. When chance agreement is certain (p_e = 1: both
    raters used one category), kappa is 1 if they agree everywhere, else 0. (None, None) without items."""
    total = float(sum(w for _, _, w in rated))
    if not rated or total <= 0:
        return None, None
    import numpy as np

    a, b, w = zip(*rated)  # the panel's item vectors (cohen_vectors), each weighed, summed: one formula
    po, kappa = cohen_from_sums((cohen_vectors(a, b, sorted(set(a) | set(b))) * np.asarray(w)[:, None]).sum(axis=0))
    return float(po), float(kappa)


def rogan_gladen(p_obs: float, se: float, sp: float) -> float | None:
    """The true rate behind an observed one, given the rater's sensitivity and specificity
    (Rogan & Gladen 1978): (p_obs + Sp - 1) / (Se + Sp - 1), clipped to [0, 1]. None when
    Se + Sp - 1 <= 0: such a rater is no better than chance and says nothing about the rate."""
    d = se + sp - 1.0
    if d <= 0:
        return None
    return min(1.0, max(0.0, (p_obs + sp - 1.0) / d))


RG_DRAWS = 10_000


def rogan_gladen_stratified(
    judged: dict[str, int], labelled: dict[str, tuple[int, int]], key: str, seed: int = 0, draws: int = RG_DRAWS
) -> dict:
    """The Rogan–Gladen rate of ``key`` when people labelled a sample stratified by the judge's category.

    ``judged``: the run's items per judge category (the rate's population); ``labelled``: per judge
    category, (items people labelled, of them those people put in ``key``); every category of
    ``judged`` needs labels. Each labelled item weighs N_h / n_h, so p_obs = N_key / N, and
    Se = P(judge key | people key), Sp = P(judge not key | people not key) over the run:
    Se = N_key PPV_key / sum_h N_h PPV_h, Sp = sum_{h != key} N_h (1 - PPV_h) / sum_h N_h (1 - PPV_h),
    with PPV_h the share of stratum h's labels that say key. (The corrected rate is then
    sum_h N_h PPV_h / N, the stratified estimate: the two agree wherever Se + Sp > 1.)

    95% interval, a parametric bootstrap, seeded, ``draws`` times: the run's category shares drawn
    from Dirichlet(N_h + 1/2) (p_obs's uncertainty, the run's judged count) and each stratum's
    PPV from Beta(K_h + 1/2, n_h - K_h + 1/2) (Jeffreys: Se and Sp's uncertainty, the labelled
    counts); Se, Sp and p_obs recomputed from the same draw (they rest on the same strata: drawn
    independently, a low Se would be paired with a low Sp that no sample shows together),
    corrected and clipped; the 2.5th and 97.5th percentiles. A draw with Se + Sp - 1 <= 0 has no
    corrected rate: when more than 2.5% of draws have none, the interval is [0, 1] (the labels
    cannot exclude a judge without information); fewer are left out. Returns {p_obs,
    sensitivity, specificity, corrected (None when Se + Sp - 1 <= 0), ci95, undefined_share}."""
    import numpy as np

    cats = list(judged)
    if any(labelled.get(c, (0, 0))[0] <= 0 for c in cats):
        raise ValueError(f"every judge category needs labels: {[c for c in cats if labelled.get(c, (0, 0))[0] <= 0]}")
    big_n = np.array([judged[c] for c in cats], dtype=float)
    n_lab = np.array([labelled[c][0] for c in cats], dtype=float)
    k_lab = np.array([labelled[c][1] for c in cats], dtype=float)
    is_key = np.array([c == key for c in cats])

    def estimate(shares, ppv):
        """(p_obs, Se, Sp) per row of the run's category shares and each stratum's PPV."""
        with np.errstate(invalid="ignore", divide="ignore"):
            pos, neg = shares * ppv, shares * (1 - ppv)
            se = (pos * is_key).sum(axis=-1) / pos.sum(axis=-1)
            sp = (neg * ~is_key).sum(axis=-1) / neg.sum(axis=-1)
        return (shares * is_key).sum(axis=-1), se, sp

    out: dict = {
        "p_obs": None,
        "sensitivity": None,
        "specificity": None,
        "corrected": None,
        "ci95": [None, None],
        "undefined_share": None,
    }
    if not len(cats) or big_n.sum() <= 0:
        return out
    p_obs, se, sp = (float(x) for x in estimate(big_n / big_n.sum(), k_lab / n_lab))
    out.update(p_obs=p_obs, sensitivity=None if math.isnan(se) else se, specificity=None if math.isnan(sp) else sp)
    if math.isnan(se) or math.isnan(sp):
        return out
    out["corrected"] = rogan_gladen(p_obs, se, sp)
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(big_n + 0.5, size=draws)
    ppv = rng.beta(k_lab + 0.5, n_lab - k_lab + 0.5, size=(draws, len(cats)))
    p, se_d, sp_d = estimate(shares, ppv)
    d = se_d + sp_d - 1.0
    ok = np.nan_to_num(d, nan=-1.0) > 0
    out["undefined_share"] = float(1.0 - ok.mean())
    if out["undefined_share"] > 0.025:
        out["ci95"] = [0.0, 1.0]
        return out
    corrected = np.clip((p[ok] + sp_d[ok] - 1.0) / d[ok], 0.0, 1.0)
    lo, hi = np.percentile(corrected, [2.5, 97.5])
    out["ci95"] = [float(lo), float(hi)]
    return out


# ------------------------------------------------------------------ agreement between judges
def _kappa(po, pe):
    """Chance-corrected agreement; 1 where chance agreement is certain (every rating in one category:
    then every rating agrees), as ``judge_audit.kappa`` says."""
    import numpy as np

    po, pe = np.asarray(po, dtype=float), np.asarray(pe, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pe >= 1.0 - 1e-12, np.where(po >= 1.0 - 1e-12, 1.0, 0.0), (po - pe) / (1.0 - pe))


def fleiss_vectors(counts):
    """Per item, what Fleiss' kappa sums: ``[P_i, 1, n_i1, ..., n_ik]``, where ``n_ij`` is how many
    of the item's ``n`` raters chose category ``j`` and ``P_i = (sum_j n_ij^2 - n) / (n (n - 1))``
    its share of agreeing rater pairs. Every item needs the same ``n`` >= 2 raters."""
    import numpy as np

    c = np.asarray(counts, dtype=float)
    n = c.sum(axis=1)
    if len(c) and (n.min() != n.max() or n[0] < 2):
        raise ValueError("Fleiss' kappa needs the same number (two or more) of ratings for every item")
    p_i = ((c * c).sum(axis=1) - n) / (n * (n - 1)) if len(c) else np.zeros(0)
    return np.column_stack([p_i, np.ones(len(c)), c])


def fleiss_from_sums(sums):
    """(mean observed agreement P-bar, Fleiss' kappa) from summed :func:`fleiss_vectors` (a row
    of sums, or many: one per bootstrap replicate). P-bar = sum P_i / N; p_j = sum_i n_ij / (N n);
    P_e = sum p_j^2; kappa = (P-bar - P_e) / (1 - P_e)."""
    import numpy as np

    s = np.asarray(sums, dtype=float)
    n_items, counts = s[..., 1], s[..., 2:]
    with np.errstate(divide="ignore", invalid="ignore"):
        po = s[..., 0] / n_items
        p = counts / counts.sum(axis=-1, keepdims=True)
    pe = (p * p).sum(axis=-1)
    return po, _kappa(po, pe)


def fleiss_kappa(counts) -> tuple[float | None, float | None]:
    """(mean observed agreement, Fleiss' kappa) of an items x categories matrix of counts."""
    if not len(counts):
        return None, None
    po, k = fleiss_from_sums(fleiss_vectors(counts).sum(axis=0))
    return float(po), float(k)


def effective_judges(k: int, rho: float | None) -> float | None:
    """How many independent judges a panel of ``k`` is worth when their verdicts correlate on average
    ``rho``: n_eff = k / (1 + (k - 1) rho), k over Kish's design effect 1 + (k - 1) rho of a cluster of
    k correlated observations (Kish, *Survey Sampling*, 1965), the denominator of the Spearman-Brown
    formula for the reliability of a k-rater mean (Spearman, 1910; Brown, 1910). For categorical verdicts ``rho`` is the intraclass correlation Fleiss' kappa estimates (Fleiss,
    1971; Fleiss & Cuzick, 1979). ``rho`` is clamped to [0, 1]: perfect agreement is worth one judge,
    independent judges (kappa 0) all k, and agreement below chance (kappa < 0) is counted as 0, so k
    (no more independent than independent). None without a ``rho``."""
    if rho is None or (isinstance(rho, float) and math.isnan(rho)):
        return None
    r = min(1.0, max(0.0, float(rho)))
    return k / (1.0 + (k - 1) * r)


def effective_judges_interval(
    k: int, ci: tuple[float | None, float | None] | Sequence[float | None]
) -> tuple[float | None, float | None]:
    """The interval of :func:`effective_judges` from ``rho``'s (kappa's) interval: n_eff falls as
    rho rises, so its interval is [n_eff(hi), n_eff(lo)], the same resamples' percentiles mapped
    (percentiles commute with a monotone map; clamping keeps it monotone, not strictly)."""
    lo, hi = ci[0], ci[1]
    return effective_judges(k, hi), effective_judges(k, lo)


def cohen_vectors(a, b, categories):
    """Per item, what Cohen's kappa of two raters sums: ``[agree, 1, a's category one-hot, b's]``."""
    import numpy as np

    idx = {c: i for i, c in enumerate(categories)}
    k = len(categories)
    out = np.zeros((len(a), 2 + 2 * k))
    for r, (x, y) in enumerate(zip(a, b)):
        out[r, 0] = x == y
        out[r, 1] = 1
        out[r, 2 + idx[x]] = 1
        out[r, 2 + k + idx[y]] = 1
    return out


def cohen_from_sums(sums):
    """(observed agreement p_o, Cohen's kappa) from summed :func:`cohen_vectors`: p_e = sum_j
    (a_j / N)(b_j / N), kappa = (p_o - p_e) / (1 - p_e)."""
    import numpy as np

    s = np.asarray(sums, dtype=float)
    n = s[..., 1]
    k = (s.shape[-1] - 2) // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        po = s[..., 0] / n
        pe = (s[..., 2 : 2 + k] * s[..., 2 + k :]).sum(axis=-1) / (n * n)
    return po, _kappa(po, pe)


def cluster_sums(vectors, clusters):
    """The rows of ``vectors`` summed per cluster (an input row), clusters in sorted order."""
    import numpy as np

    keys, codes = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    out = np.zeros((len(keys), np.asarray(vectors).shape[1]))
    np.add.at(out, codes.ravel(), np.asarray(vectors, dtype=float))
    return out


def bootstrap_sums(vectors, stat, seed: int = 0, n_boot: int = 2000) -> list[tuple[float | None, float | None]]:
    """95% percentile intervals of each statistic ``stat`` returns (a tuple of arrays) from summed
    cluster vectors, resampling whole clusters: each replicate weighs every cluster by how often it
    was drawn (multinomial counts, the same law as drawing clusters with replacement), so memory is
    replicates x clusters however wide the vectors. NaN replicates are dropped."""
    import numpy as np

    v = np.asarray(vectors, dtype=float)
    g = len(v)
    if g == 0:
        return []
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, BOOT_CELLS // g))
    parts: list[list] = []
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        w = rng.multinomial(g, np.full(g, 1.0 / g), size=k)
        parts.append([np.asarray(x) for x in stat(w @ v)])
    out: list[tuple[float | None, float | None]] = []
    for j in range(len(parts[0])):
        x = np.sort(np.concatenate([p[j] for p in parts]))
        x = x[~np.isnan(x)]
        out.append((None, None) if not len(x) else (float(x[int(0.025 * len(x))]), float(x[int(0.975 * len(x))])))
    return out
