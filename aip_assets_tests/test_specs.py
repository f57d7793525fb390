"""The metric specs as data: every config model against the parameter manifest kept in the repo
(``aip_assets/specs/manifests.json``, extracted from shared/spec): names, types, defaults, bounds
and enums, in one test. Where the project adds to a spec, the addition is listed here with why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import aip_assets
from aip_assets.metrics import REGISTRY

MANIFESTS = json.loads((Path(aip_assets.__file__).parent / "specs" / "manifests.json").read_text())

# (metric, field, key): what the project adds to a spec's manifest, and why
ADDED = {
    # the consistency page gives no bounds but responses_per_query's; issue 4 set these
    **{
        (m, f, k): "bounds set by issue 4 (the spec page has a table, no schema)"
        for m in ("llm.semantic_consistency", "llm.factual_consistency", "llm.safety_consistency")
        for f, k in (
            ("sut_temperature", "minimum"),
            ("sut_temperature", "maximum"),
            ("concurrency_limit", "minimum"),
            ("concurrency_limit", "maximum"),
            ("timeout_seconds", "exclusiveMinimum"),
            ("n_sut_retries", "minimum"),
            ("n_sut_retries", "maximum"),
            ("n_judge_retries", "minimum"),
            ("n_judge_retries", "maximum"),
        )
    },
}
# the hosted perturbation metric has no spec page: the external scorer's fields, plus these
HOSTED_EXTRA = {"perturbation_types", "variants_per_type", "sut_temperature", "n_sut_retries"}


def _type(p: dict) -> str | None:
    if "anyOf" in p:
        types = sorted(t.get("type") for t in p["anyOf"] if t.get("type") != "null")
        return types[0] if len(types) == 1 else "|".join(map(str, types))
    return p.get("type")


def _enum(schema: dict, p: dict) -> set | None:
    for cand in (p, p.get("items", {}), *(p.get("anyOf") or [])):
        if "enum" in cand:
            return set(cand["enum"])
        ref = cand.get("$ref") or cand.get("items", {}).get("$ref")
        if ref:
            return set(schema["$defs"][ref.split("/")[-1]]["enum"])
    return None


@pytest.mark.parametrize("metric", sorted(REGISTRY))
def test_config_model_matches_the_spec_manifest(metric):
    plugin = REGISTRY[metric]
    name = "llm.perturbation_robustness_external" if metric == "llm.perturbation_robustness" else metric
    manifest = MANIFESTS[name]["config_schema"]["properties"]
    schema = plugin.config_model.model_json_schema()
    props = schema["properties"]
    expected_names = set(manifest) | (HOSTED_EXTRA if metric == "llm.perturbation_robustness" else set())
    assert set(props) == expected_names, (metric, set(props) ^ expected_names)
    cfg = plugin.config_model()
    for field, want in manifest.items():
        got = props[field]
        if field == "metric_name" and metric == "llm.perturbation_robustness":
            assert cfg.metric_name == "perturbation_robustness"  # its own name, not the external scorer's
            continue
        assert _type(got) == _type(want), (metric, field, got, want)
        if "default" in want:
            assert getattr(cfg, field) == want["default"], (metric, field)
        for key in ("minimum", "maximum", "exclusiveMinimum"):
            if key in want:
                assert got.get(key) == want[key], (metric, field, key)
            elif key in got:
                assert (metric, field, key) in ADDED, f"{metric}.{field}: {key} {got[key]} is not in the spec"
        if _enum(MANIFESTS[name]["config_schema"], want) is not None:
            assert _enum(schema, got) == _enum(MANIFESTS[name]["config_schema"], want), (metric, field)


def test_metric_versions_are_the_specs():
    for metric, m in MANIFESTS.items():
        assert REGISTRY[metric].version.split(".")[0] == str(m["version"]).split(".")[0], metric


def test_execution_manifests_max_concurrency_is_the_run_queue_limit():
    """The specs allow max_concurrency executions of one metric at once: the Dagster instance
    (the repo's dagster.yaml and the one the CLI writes) runs at most that many queued runs at
    once, and each evaluation run is one (run, metric) partition, so no metric exceeds it."""
    import yaml

    from aip_assets.dagster_home import MAX_CONCURRENCY, instance_settings

    limits = {m["execution"]["max_concurrency"] for m in MANIFESTS.values() if m["execution"]}
    assert limits == {MAX_CONCURRENCY}
    repo = Path(aip_assets.__file__).parent.parent
    for cfg in (yaml.safe_load((repo / "dagster.yaml").read_text()), yaml.safe_load(instance_settings(Path("/x")))):
        assert cfg["run_coordinator"]["class"] == "QueuedRunCoordinator"
        assert cfg["concurrency"] == {
            "runs": {
                "max_concurrent_runs": MAX_CONCURRENCY,
                "tag_concurrency_limits": [
                    {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
                ],
            }
        }


def test_execution_manifests_timeout_is_each_rows_deadline(tmp_path):
    """The specs' execution timeout_seconds is the time one dataset row's calls may be in flight in
    one stage (docs/metrics/index.md, spec decisions); the spec's limits.row_timeout_seconds overrides it, and the
    metrics whose spec has no execution manifest have no deadline unless the spec sets one."""
    from aip_assets.metrics.base import StageContext, execution_timeout
    from aip_assets.runspec import parse_spec

    want = {
        "llm.decision_flip": 900,
        "llm.group_interaction_bias": 21600,
        "llm.perturbation_robustness_external": 900,
        "llm.perturbation_robustness": 900,
        "llm.semantic_consistency": None,
        "llm.factual_consistency": None,
        "llm.safety_consistency": None,
    }
    assert set(want) == set(REGISTRY)
    for metric, t in want.items():
        name = REGISTRY[metric].spec_manifest or metric
        assert t == ((MANIFESTS[name]["execution"] or {}).get("timeout_seconds")), metric
        assert execution_timeout(metric) == t, metric

    from .conftest import write_dataset

    ds = write_dataset(tmp_path / "d.jsonl", 2)

    def ctx(metric, **limits):
        spec = parse_spec(
            {"name": "t", "dataset": str(ds), "sut": {"provider": "builtin"}, "metrics": {metric: {}}, "limits": limits}
        )
        c = StageContext("r", metric, spec, None, None, None)
        client = c.client("sut", "sampling", 2)
        return c.row_timeout_s, client.row_timeout_s

    assert ctx("llm.decision_flip") == (900, 900)
    assert ctx("llm.group_interaction_bias") == (21600, 21600)
    assert ctx("llm.semantic_consistency") == (None, None)
    assert ctx("llm.semantic_consistency", row_timeout_seconds=30) == (30, 30)
    assert ctx("llm.decision_flip", row_timeout_seconds=2.5) == (2.5, 2.5)
    with pytest.raises(Exception, match="row_timeout_seconds"):
        ctx("llm.decision_flip", row_timeout_seconds=0)


def test_records_match_the_warehouse():
    """The typed records the metrics build (checked by mypy) name exactly the warehouse's columns
    (less run_id and metric, which the writing stage adds; plus the gate's inputs)."""
    from typing import get_type_hints

    from aip_assets import records
    from aip_assets.warehouse import TABLES

    for table, td, extra in (
        ("row_scores", records.RowScore, ()),
        ("score_units", records.ScoreUnit, ()),
        ("metric_scores", records.MetricScore, records.GATE_INPUTS),
        ("run_notes", records.RunNote, ()),
    ):
        cols = {c for c, _ in TABLES[table]} - {"run_id", "metric"} - ({"stage"} if table == "run_notes" else set())
        assert set(get_type_hints(td)) == cols | set(extra), table


DOCS = Path(aip_assets.__file__).parent.parent / "docs"


def _decision_rows(page: Path) -> list[list[str]]:
    """The rows (point, decision, test) of a docs page's spec-decision table."""
    text = page.read_text()
    head = text.index("| point | decision | test |")
    table = text[head:].split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in table]


def test_the_docs_spec_decisions_name_tests_that_exist():
    """Each metric page and the metrics overview carry a table of spec decisions (where the spec is
    silent or open, how the code reads it), and every test a row names is a test of the suite."""
    import re

    tests = {
        m
        for f in Path(__file__).parent.glob("test_*.py")
        for m in re.findall(r"^(?:async )?def (test_\w+)", f.read_text(), re.MULTILINE)
    }
    pages = sorted((DOCS / "metrics").glob("*.md"))
    assert {p.stem for p in pages} >= {
        "index",
        "decision-flip",
        "group-interaction-bias",
        "consistency",
        "perturbation-robustness",
    }
    named = set()
    for page in pages:
        rows = _decision_rows(page)
        assert rows and all(len(r) == 3 for r in rows), page
        for point, decision, test in rows:
            assert point and decision, (page.name, point)
            cited = re.findall(r"`(test_\w+)`", test)
            assert cited or test == "same", (page.name, point, test)
            named.update(cited)
    assert named and not named - tests, sorted(named - tests)


def test_the_docs_example_specs_validate():
    """The run-spec page's spec with every field, and the README's "point it at your model" spec,
    are specs the validator takes (their dataset put at the demo's)."""
    import re

    import yaml

    from aip_assets.runspec import parse_spec

    demo = DOCS.parent / "data" / "datasets" / "demo_decisions.jsonl"
    blocks = {
        "docs/concepts/run-spec.md": (DOCS / "concepts" / "run-spec.md").read_text(),
        "README.md": (DOCS.parent / "README.md").read_text(),
    }
    for where, text in blocks.items():
        [first, *_] = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
        data = yaml.safe_load(first)
        assert data["metrics"] and data["sut"]["provider"] == "openai", where
        spec = parse_spec({**data, "dataset": str(demo)}, where=where)
        assert "llm.decision_flip" in spec.metrics, where


def _models_in(annotation) -> list[type]:
    """The pydantic models an annotation holds (``Connection``, ``list[Connection] | None``, ``dict[str, X]``...)."""
    import typing

    from pydantic import BaseModel

    found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _undocumented(roots: list[type]) -> tuple[list[str], set[str]]:
    """Every ``Model.field`` without a description among ``roots`` and the models their fields hold,
    recursively, and the names of the models walked."""
    seen: set[type] = set()
    missing: list[str] = []
    todo = list(roots)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if not (field.description or "").strip():
                missing.append(f"{model.__name__}.{name}")
            todo += _models_in(field.annotation)
    return sorted(missing), {m.__name__ for m in seen}


def test_the_walk_finds_an_undocumented_field_in_a_nested_model():
    from pydantic import BaseModel, Field

    class Inner(BaseModel):
        documented: int = Field(0, description="a number")
        bare: int = 0

    class Outer(BaseModel):
        inner: list[Inner] | None = Field(None, description="the inners")
        by_name: dict[str, Inner] = Field(default_factory=dict, description="inners by name")

    missing, walked = _undocumented([Outer])
    assert missing == ["Inner.bare"]
    assert walked == {"Outer", "Inner"}


def test_every_config_runspec_and_connection_field_has_a_description():
    """Each metric's config model, the run spec and the connection, with every model they hold
    (metric entries, limits, the judge audit, the builtin profile, batch settings, prices), document
    each field with ``Field(description=...)``: the text a reader of the schema or the code sees."""
    from aip_assets.connections import Connection
    from aip_assets.runspec import RunSpec

    configs = [REGISTRY[m].config_model for m in sorted(REGISTRY)]
    missing, walked = _undocumented([*configs, RunSpec, Connection])
    assert walked >= {
        *(c.__name__ for c in configs),
        "RunSpec",
        "MetricEntry",
        "Limits",
        "JudgeAudit",
        "Connection",
        "BuiltinProfile",
        "BatchSettings",
        "Prices",
    }, walked
    assert not missing, "fields without a description: " + ", ".join(missing)
