"""What a run will spend and what it may: the dry run's estimate (``aip-eval run --dry-run``) and a
registered run's caps (``update_limits``, raised to resume it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import warehouse as wh
from .hashing import stable_json
from .metrics import get_metric
from .metrics.base import StageContext
from .pipeline import WarehouseReader, load_run, register_run, run_stage
from .runspec import RunSpec, parse_spec

ASSUMED_ANSWER_TOKENS = 300  # when the SUT connection sets no max_tokens
JUDGE_PROMPT_TOKENS = 450  # a judge prompt's own text, before the answers it quotes
JUDGE_ANSWER_TOKENS = 80


def estimate(spec: RunSpec) -> dict[str, Any]:
    """What a run of ``spec`` will spend, without calling any model: ingest and synthesis run in a
    temporary warehouse (personas from the catalogue), then each metric counts its calls from
    the probes it made. Tokens are estimated at 4 characters a token."""
    import tempfile

    from .runspec import Connection
    from .warehouse import lake

    with (
        tempfile.TemporaryDirectory(prefix="aip-dry-run-") as tmp,
        lake.set_aside(),
    ):  # a local file, even in shared mode
        path = Path(tmp) / "estimate.duckdb"
        offline = spec.model_copy(update={"synthesis": Connection()})
        register_run(offline, "dry-run", path)
        sut_answer = spec.sut.max_tokens or ASSUMED_ANSWER_TOKENS
        out: dict[str, Any] = {
            "metrics": {},
            "assumptions": {
                "chars_per_token": 4,
                "sut_answer_tokens": sut_answer,
                "judge_prompt_tokens": JUDGE_PROMPT_TOKENS,
                "judge_answer_tokens": JUDGE_ANSWER_TOKENS,
            },
        }
        for metric in spec.metrics:
            for stage in ("ingest", "synthesis"):
                run_stage(stage, "dry-run", metric, log=lambda m: None, path=path)
            plugin = get_metric(metric)
            # the metric counts from the probes synthesised offline, with the run's real connections
            ctx = StageContext(
                run_id="dry-run",
                metric=metric,
                spec=spec,
                config=spec.metric_config(metric),
                journal=None,
                reader=WarehouseReader("dry-run", metric, path),
                threshold=spec.metrics[metric].threshold,
                batch_rows=spec.batch_rows,
            )
            e: dict[str, Any] = dict(plugin.estimate(ctx))
            plan = plugin.plan(ctx)
            if plan is not None:
                e["detectable"] = plan
            asked = e["judge_calls"]
            e["judge_calls"] *= len(spec.panel())  # a panel: every judge asked every verdict
            if spec.judge_audit is not None:  # the audit judge asks a share of the judgements again
                e["judge_calls"] += int(asked * spec.judge_audit.share + 0.999)
            e["sut_prompt_tokens"] = e.pop("sut_prompt_chars") // 4
            e["sut_completion_tokens"] = e["sut_calls"] * sut_answer
            e["judge_prompt_tokens"] = e["judge_calls"] * (JUDGE_PROMPT_TOKENS + 2 * sut_answer)
            e["judge_completion_tokens"] = e["judge_calls"] * JUDGE_ANSWER_TOKENS
            out["metrics"][metric] = e
    first = next(iter(out["metrics"].values()))
    tot = {k: sum(m[k] for m in out["metrics"].values()) for k in first if k != "detectable"}
    tot["calls"] = tot["sut_calls"] + tot["judge_calls"] + tot["synthesis_calls"]
    tot["tokens"] = sum(v for k, v in tot.items() if k.endswith("_tokens"))
    out["total"] = tot
    lim = spec.limits
    out["limits"] = lim.model_dump()
    out["within_limits"] = (lim.max_calls is None or tot["calls"] <= lim.max_calls) and (
        lim.max_tokens is None or tot["tokens"] <= lim.max_tokens
    )
    return out


def update_limits(run_id: str, max_calls: int | None, max_tokens: int | None, path: Path | None = None) -> None:
    """Raise (or set) a registered run's caps, recorded in its stored spec, so it can resume."""
    spec, rec = load_run(run_id, path)
    data = json.loads(rec["spec"])
    data.setdefault("limits", {})
    if max_calls is not None:
        data["limits"]["max_calls"] = max_calls
    if max_tokens is not None:
        data["limits"]["max_tokens"] = max_tokens
    parse_spec(data, where=f"eval_runs[{run_id}].spec")
    with wh.connect(path) as con:
        wh.transaction(
            con,
            lambda c: c.execute("UPDATE eval_runs SET spec = ? WHERE run_id = ?", [stable_json(data), run_id]),
            f"run {run_id}'s limits",
        )
