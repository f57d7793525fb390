"""Commands on specs and datasets that run no evaluation: `aip-eval validate`, `templates`,
`perturb`."""

from __future__ import annotations

import json

from ..errors import AipError


def cmd_validate(args) -> int:
    from .. import pipeline
    from ..runspec import load_spec

    spec = load_spec(args.spec)
    rows = pipeline.validate_datasets(spec)
    print(
        json.dumps(
            {"spec": spec.name, "dataset_rows": rows[spec.dataset], "datasets": rows, "resolved": spec.shown()},
            indent=2,
        )
    )
    return 0


def cmd_templates(args) -> int:
    from ..catalog.templates import catalogue

    extra = {}
    if args.spec:
        from ..runspec import load_spec

        extra = load_spec(args.spec).templates
    for family, items in catalogue(extra).items():
        if args.family and family != args.family:
            continue
        for t in items:
            print(f"{t.template_id:<32} {t.category:<14} {t.text}")
    return 0


def cmd_perturb(args) -> int:
    from ..recipes import perturb_file
    from ..runspec import Connection

    conn = None
    if args.paraphrase_base_url:
        conn = Connection(
            provider="openai",
            base_url=args.paraphrase_base_url,
            model=args.paraphrase_model,
            api_key_env=args.paraphrase_api_key_env,
        )
    types = args.types.split(",") if args.types else None
    try:
        out = perturb_file(args.seed_dataset, args.out, types, args.seed, args.variants_per_type, conn)
    except ValueError as e:
        raise AipError(str(e)) from None
    print(json.dumps(out, indent=2))
    return 0
