"""The file people fill in: ``aip-eval label export`` writes a seeded, stratified sample of one
run × metric's judgements to a CSV (or JSONL); ``aip-eval label import`` checks a filled-in file
and stores its labels (the estimates and the sampling: ``human_labels``)."""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import AipError
from .human_labels import (
    EXPORT_COLUMNS,
    FORMULA_PREFIXES,
    JUDGEMENT_COLUMNS,
    PERSON_COLUMNS,
    SCOPE,
    VERDICT_COLUMNS,
    agreement_records,
    draw,
    match_category,
    population,
    shown_contents,
    shown_hash,
)
from .metrics.base import THIRDS_TEXT


def _item(metric: str, r: dict[str, Any]) -> str:
    from .metrics import get_metric

    return get_metric(metric).human_item(r) or f"{r.get('judge_kind')} ({THIRDS_TEXT})"


def _contents(run_id: str, metric: str, ids: list[str], path: Path) -> dict[str, dict[str, Any]]:
    """What the judge compared for each judgement (``human_labels.shown_contents``), from the warehouse at ``path``."""
    from . import warehouse as wh

    return shown_contents(metric, ids, lambda sql, params: wh.query(sql, [run_id, *params], path).to_dict("records"))


def _context(metric: str, spec, rows: dict[str, Any], r: dict[str, Any]) -> str:
    """What else the judge was given: decision flip's decision labels, perturbation's reference."""
    row = rows.get(r["input_id"])
    if row is None:
        return ""
    from .metrics import get_metric

    return get_metric(metric).human_context(spec.metric_config(metric), row, r)


def _safe_cell(v: Any) -> Any:
    """A text cell as a spreadsheet shows it, never run as a formula (a leading ' where it would be)."""
    return "'" + v if isinstance(v, str) and v.startswith(FORMULA_PREFIXES) else v


def _plain_cell(v: str) -> str:
    """A CSV cell as it was before :func:`_safe_cell` guarded it (the ' before a formula-looking
    text taken off), so a note such as "- too strict" reads back as written."""
    return v[1:] if v.startswith("'") and v[1:].startswith(FORMULA_PREFIXES) else v


def _load(run_id: str, metric: str, path: Path, where: Callable[[str], str] = lambda field: ""):
    """(spec, run record, plugin, judgements, population) of a run × metric; an unknown run or
    metric is the user's mistake (AipError, prefixed by ``where(field)``)."""
    from . import pipeline
    from . import warehouse as wh
    from .metrics import get_metric

    if not wh.exists(path):
        raise AipError(f"{path}: no warehouse yet; run `aip-eval run <spec>` first")
    if not pipeline.run_exists(run_id, path):
        raise AipError(f"{where('run_id')}run {run_id!r} is not registered in {path} (see `aip-eval runs`)")
    spec, rec = pipeline.load_run(run_id, path)
    if metric not in spec.metrics:
        raise AipError(
            f"{where('metric')}metric {metric!r} is not configured for run {run_id} (configured: "
            f"{', '.join(spec.metrics)})"
        )
    plugin = get_metric(metric)
    reader = pipeline.WarehouseReader(run_id, metric, path)
    j = reader.read("judgements", None, JUDGEMENT_COLUMNS)
    return spec, rec, plugin, j, population(metric, plugin, j, reader.read("probe_pairs", None, ["pair_id", "kind"]))


def export(
    run_id: str,
    metric: str,
    n: int,
    out: str | Path | None = None,
    show_verdict: bool = False,
    seed: int | None = None,
    path: str | Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write the sample people label (see the module's docstring); returns what was written."""
    from . import warehouse as wh
    from .dataset import DatasetRow

    path = Path(path) if path else wh.default_path()
    if n < 1:
        raise AipError(f"--n must be at least 1, got {n}")
    out = Path(out) if out else path.parent / "labels" / f"{run_id}--{metric}.csv"
    fmt = {".csv": "csv", ".jsonl": "jsonl"}.get(out.suffix.lower())
    if fmt is None:
        raise AipError(f"{out}: the file's extension picks its format: .csv or .jsonl")
    if out.exists() and not force:
        raise AipError(f"{out} exists (it may hold labels already): pick another --out, or --force to replace it")
    spec, rec, _plugin, j, pop = _load(run_id, metric, path)
    if not len(j):
        raise AipError(
            f"run {run_id} × {metric} has no judgements yet (its judging stage has not run): nothing to label"
        )
    if not len(pop):
        raise AipError(
            f"run {run_id} × {metric}: none of its {len(j)} judgements has a verdict of the judge "
            f"(statuses: {', '.join(f'{k} {v}' for k, v in Counter(j['status']).most_common())}): nothing "
            "to label"
        )
    seed = int(rec["seed"] or 0) if seed is None else seed
    chosen, strata = draw(pop, n, seed)
    ids = list(chosen["judgement_id"])
    contents = _contents(run_id, metric, ids, path)
    rows_df = wh.read_partition("dataset_rows", run_id, metric, path)
    rows = {r["input_id"]: DatasetRow.from_record(r) for r in rows_df.to_dict("records")}
    records = []
    for r in chosen.to_dict("records"):
        c = contents.get(r["judgement_id"], {})
        rec_out = {
            "judgement_id": r["judgement_id"],
            "run_id": run_id,
            "metric": metric,
            "input_id": r["input_id"],
            "item": _item(metric, r),
            **{k: c.get(k) or "" for k in EXPORT_COLUMNS[5:11]},
            "context": _context(metric, spec, rows, r),
            "allowed": " | ".join(r["allowed"]),
            "shown_hash": shown_hash(c),
        }
        if show_verdict:
            rec_out.update(judge_category=r["judge_category"], judge_reasoning=r.get("reasoning") or "")
        rec_out.update({k: "" for k in PERSON_COLUMNS})
        records.append(rec_out)
    cols = EXPORT_COLUMNS + (VERDICT_COLUMNS if show_verdict else []) + PERSON_COLUMNS
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    if fmt == "csv":  # UTF-8 with a byte-order mark, which spreadsheets need to read it as UTF-8
        with open(tmp, "w", encoding="utf-8-sig", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            for r in records:
                w.writerow({k: _safe_cell(v) for k, v in r.items()})
    else:
        with open(tmp, "w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps({k: r[k] for k in cols}, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    return {
        "file": str(out),
        "run_id": run_id,
        "metric": metric,
        "rows": len(records),
        "seed": seed,
        "verdict_shown": show_verdict,
        "judgements_with_a_verdict": int(len(pop)),
        "strata": strata,
        "allocation": "equal per judge category, capped at its size (water-filling)",
    }


# ------------------------------------------------------------------ reading a filled-in file
REQUIRED = ("judgement_id", "run_id", "metric", "human_label")


def read_filled(file: str | Path) -> list[tuple[int, dict[str, str]]]:
    """The rows of a filled-in file as (row number, {column: text}): a CSV's rows numbered as a
    spreadsheet shows them (the header is row 1), its cells as written before export's guard
    against formulas (:func:`_plain_cell`); a JSONL's lines from 1."""
    p = Path(file)
    if not p.exists():
        raise AipError(f"{p}: no such file")
    fmt = {".csv": "csv", ".jsonl": "jsonl"}.get(p.suffix.lower())
    if fmt is None:
        raise AipError(f"{p}: the file's extension picks its format: .csv or .jsonl")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise AipError(f"{p}: not UTF-8 text ({e}); save it as UTF-8 CSV") from None
    rows: list[tuple[int, dict[str, str]]] = []
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise AipError(
                f"{p}: row 1 (the header): no column {', '.join(missing)} (columns: {', '.join(header) or 'none'})"
            )
        reader.fieldnames = header
        for i, r in enumerate(reader, start=2):
            if None in r:
                raise AipError(f"{p}: row {i}: more cells than the header has columns")
            rows.append((i, {k: _plain_cell("" if v is None else str(v)) for k, v in r.items()}))
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise AipError(f"{p}: line {i}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise AipError(f"{p}: line {i}: not a JSON object")
            missing = [c for c in REQUIRED if c not in obj]
            if missing:
                raise AipError(f"{p}: line {i}, field {missing[0]}: missing")
            rows.append((i, {k: "" if v is None else str(v) for k, v in obj.items()}))
    return rows


def _where(p: Path, rownum: int, field: str) -> str:
    return f"{p}: {'line' if p.suffix.lower() == '.jsonl' else 'row'} {rownum}, field {field}"


def import_labels(file: str | Path, labeller: str | None = None, path: str | Path | None = None) -> dict[str, Any]:
    """Check and store a filled-in file's labels, then the judge's agreement with people (see the
    module's docstring). Every row is checked before anything is written; an error names the
    file, row and field. Returns a summary: counts and the figures written."""
    from . import warehouse as wh

    path = Path(path) if path else wh.default_path()
    p = Path(file)
    rows = read_filled(p)
    if not rows:
        raise AipError(f"{p}: no rows")
    first_row, first = rows[0]
    run_id, metric = first["run_id"].strip(), first["metric"].strip()
    for rownum, r in rows:
        for field, want in (("run_id", run_id), ("metric", metric)):
            if r[field].strip() != want:
                raise AipError(
                    f"{_where(p, rownum, field)}: {r[field].strip()!r}, but the file's first row is of "
                    f"{run_id} × {metric}: a file holds one run × metric (as exported)"
                )
    if not run_id:
        raise AipError(f"{_where(p, first_row, 'run_id')}: empty")
    spec, rec, plugin, j, pop = _load(run_id, metric, path, lambda field: f"{_where(p, first_row, field)}: ")
    status = dict(zip(j["judgement_id"], j["status"]))
    items = {r["judgement_id"]: r for r in pop.to_dict("records")}
    seen: dict[tuple[str, str], int] = {}
    new: list[dict[str, Any]] = []
    blank = 0
    for rownum, r in rows:
        jid = r["judgement_id"].strip()
        if not jid:
            raise AipError(f"{_where(p, rownum, 'judgement_id')}: empty")
        if jid not in status:
            raise AipError(
                f"{_where(p, rownum, 'judgement_id')}: unknown judgement {jid!r} (run {run_id} × {metric} "
                "has none of that id)"
            )
        text = r["human_label"].strip()
        if not text:
            blank += 1
            continue
        if jid not in items:
            raise AipError(
                f"{_where(p, rownum, 'judgement_id')}: judgement {jid!r} has no verdict of the judge (status "
                f"{status[jid]}): there is nothing to compare a person's label with"
            )
        cat = match_category(text, items[jid]["allowed"])
        if cat is None:
            raise AipError(
                f"{_where(p, rownum, 'human_label')}: {text!r} is not one of the allowed categories: "
                + " | ".join(items[jid]["allowed"])
            )
        who = (r.get("labeller") or "").strip() or (labeller or "").strip()
        if not who:
            raise AipError(f"{_where(p, rownum, 'labeller')}: empty, and no --labeller given")
        if (jid, who) in seen:
            raise AipError(
                f"{_where(p, rownum, 'judgement_id')}: duplicate: judgement {jid!r} labelled by {who!r} "
                f"already in row {seen[(jid, who)]}"
            )
        seen[(jid, who)] = rownum
        new.append(
            {
                "judgement_id": jid,
                "category": cat,
                "labeller": who,
                "note": (r.get("note") or "").strip() or None,
                "judge_category": items[jid]["judge_category"],
                "source_file": p.name,
                "source_row": rownum,
            }
        )
    if not new:
        raise AipError(f"{p}: no row has a human_label ({blank} blank): nothing to import")
    shown = {rownum: r.get("shown_hash", "").strip() for rownum, r in rows}
    if any(shown[x["source_row"]] for x in new):  # the answers labelled are still the run's
        now_shown = _contents(run_id, metric, [x["judgement_id"] for x in new], path)
        for x in new:
            want = shown[x["source_row"]]
            if want and want != shown_hash(now_shown.get(x["judgement_id"], {})):
                raise AipError(
                    f"{_where(p, x['source_row'], 'shown_hash')}: the questions and answers this row "
                    f"showed are not those of judgement {x['judgement_id']!r} in run {run_id} now (its "
                    "answers were sampled again, or the row is another run's): export it again"
                )
    now = datetime.now(UTC).replace(tzinfo=None)
    incoming = wh.frame("human_labels", new, run_id=run_id, metric=metric, imported_at=now)
    before = wh.read_partition("human_labels", run_id, metric, path, columns=["judgement_id", "category", "labeller"])
    keys = set(zip(incoming["judgement_id"], incoming["labeller"]))
    kept = before[[k not in keys for k in zip(before["judgement_id"], before["labeller"])]] if len(before) else before
    labels = pd.concat([kept, incoming[["judgement_id", "category", "labeller"]]], ignore_index=True)
    cfg = spec.metric_config(metric)
    seed = int(rec["seed"] or 0)
    scores = wh.frame(
        "metric_scores",
        agreement_records(metric, pop, labels, seed, cfg.metric_name, cfg.weight),
        run_id=run_id,
        metric=metric,
    )

    def write(con) -> None:
        con.register("_labels", incoming)
        con.execute(
            "DELETE FROM human_labels h WHERE h.run_id = ? AND h.metric = ? AND EXISTS (SELECT 1 FROM _labels l "
            "WHERE l.judgement_id = h.judgement_id AND l.labeller = h.labeller)",
            [run_id, metric],
        )
        cols = ", ".join(incoming.columns)
        con.execute(f"INSERT INTO human_labels ({cols}) SELECT {cols} FROM _labels")
        con.unregister("_labels")
        con.execute("DELETE FROM metric_scores WHERE run_id = ? AND metric = ? AND scope = ?", [run_id, metric, SCOPE])
        if len(scores):
            con.register("_scores", scores)
            cols = ", ".join(scores.columns)
            con.execute(f"INSERT INTO metric_scores ({cols}) SELECT {cols} FROM _scores")
            con.unregister("_scores")

    with wh.connect(path) as con:
        wh.transaction(con, write, f"the human labels of {run_id} × {metric}")
    return {
        "file": str(p),
        "run_id": run_id,
        "metric": metric,
        "imported": len(new),
        "blank": blank,
        "replaced": int(len(before) - len(kept)) if len(before) else 0,
        "labels_stored": int(len(labels)),
        "scores": [
            {k: (None if (isinstance(v, float) and v != v) else v) for k, v in r.items()}
            for r in scores.drop(columns=["run_id", "metric"]).to_dict("records")
        ],
    }


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The import's figures as text lines (the CLI's summary)."""
    f: Callable[[Any], str] = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    out = [
        f"imported {result['imported']} label(s) of {result['run_id']} × {result['metric']} from {result['file']}"
        f" ({result['blank']} row(s) left blank, {result['replaced']} earlier label(s) replaced; "
        f"{result['labels_stored']} stored)"
    ]
    header = False
    for s in result["scores"]:
        d = json.loads(s["details"]) if s.get("details") else {}
        key = s["group_key"]
        if key == "agreement" or key.startswith("agreement:"):
            who = "judge vs people" if key == "agreement" else f"  its {key.split(':', 1)[1]} judge"
            out.append(
                f"  {who}: agreement {f(s['rate'])} 95% CI [{f(s['rate_ci_low'])}, "
                f"{f(s['rate_ci_high'])}], Cohen's kappa {f(s['raw_score'])} [{f(s['ci_low'])}, {f(s['ci_high'])}]"
                f" on {s['n']} item(s)" + (", weighted to the run's judge categories" if key == "agreement" else "")
            )
        elif key.startswith("category:"):
            if not header:
                header = True
                out.append(f"  {'category':<26}{'people':>7}{'sensitivity':>24}{'specificity':>24}")
            se = f"{f(d.get('sensitivity'))} [{f(d['sensitivity_ci95'][0])}, {f(d['sensitivity_ci95'][1])}]"
            sp = f"{f(d.get('specificity'))} [{f(d['specificity_ci95'][0])}, {f(d['specificity_ci95'][1])}]"
            out.append(f"  {key.split(':', 1)[1]:<26}{d.get('people_said', 0):>7}{se:>24}{sp:>24}")
        elif key.startswith("corrected:"):
            if s.get("rate") is None:
                out.append(f"  corrected {key.split(':', 1)[1]} rate: none: {d.get('why')}")
            else:
                out.append(
                    f"  corrected {key.split(':', 1)[1]} rate {f(s['rate'])} 95% CI [{f(s['rate_ci_low'])}, "
                    f"{f(s['rate_ci_high'])}] (the judge's {f(s['raw_score'])}; Rogan–Gladen with Se "
                    f"{f(d.get('sensitivity'))}, Sp {f(d.get('specificity'))})"
                )
    return out
