"""`aip-eval label export` and `label import`: the judge checked against people (a sample of its
judgements to label; the labels stored, agreement and kappa computed)."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_label_export(args) -> int:
    from .. import label_files

    path = Path(args.warehouse).resolve() if args.warehouse else None
    out = label_files.export(
        args.run,
        args.metric,
        args.n,
        out=args.out,
        show_verdict=args.show_verdict,
        seed=args.seed,
        path=path,
        force=args.force,
    )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"wrote {out['rows']} judgement(s) of {out['run_id']} × {out['metric']} to {out['file']} (seed {out['seed']}; "
        f"the judge's verdict {'shown' if out['verdict_shown'] else 'hidden'})"
    )
    print(f"  {'judge category':<26}{'judged':>8}{'sampled':>9}   (equal allocation, capped at each category's size)")
    for c, s in out["strata"].items():
        print(f"  {c:<26}{s['judged']:>8}{s['sampled']:>9}")
    print(
        f"Fill in human_label (one of the row's `allowed`), labeller and note, then: aip-eval label import {out['file']}"
    )
    return 0


def cmd_label_import(args) -> int:
    from .. import label_files

    path = Path(args.warehouse).resolve() if args.warehouse else None
    out = label_files.import_labels(args.file, labeller=args.labeller, path=path)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        for line in label_files.summary_lines(out):
            print(line)
    return 0
