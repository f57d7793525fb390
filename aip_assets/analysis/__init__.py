"""The analysis layer: every statement that something is beyond chance is a claim made here.

A metric hands its units (answers, pairs) and the groups each belongs to; the layer builds the
tests (``permutation``: shuffles within questions; ``regression``: effects adjusted for what
else a persona carries), adjusts them as one family and decides (``claims``), and gives the
figures a verdict quotes beside them (``impact``: impact ratios; ``power``: what a run can
detect). The gate, the summary, the findings, the report and ``--json`` read its decisions.
An aggregation runs it on one BLAS thread (``blas``: its products are small).
"""
