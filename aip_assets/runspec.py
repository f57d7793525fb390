"""The run spec: what to evaluate, against which models, with which metric configs.

A spec is YAML validated whole by pydantic before any model call. Unknown fields and
out-of-range values are rejected with the field named. The resolved spec (defaults filled,
secrets never) is stored in ``eval_runs`` so a run can be reproduced after the YAML changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .connections import BuiltinProfile, Connection  # noqa: F401 - the spec's connections, named here too
from .errors import SpecError, format_validation_error, symlink_loop
from .hashing import file_sha256, stable_json  # noqa: F401 - also named here, where callers found them


class Limits(BaseModel):
    """Caps for a run (it stops cleanly when one is reached, nothing half-written, and resumes
    later) and the row deadline (a row past it is an error on that row; the run goes on)."""

    model_config = ConfigDict(extra="forbid")
    max_calls: int | None = Field(None, ge=1, description="model calls made over the network, all roles")
    max_tokens: int | None = Field(None, ge=1, description="prompt + completion tokens, all roles")
    row_timeout_seconds: float | None = Field(
        None,
        gt=0,
        description="seconds one dataset row's calls may take in one stage (default: the metric's "
        "execution manifest timeout_seconds: 900 decision flip and perturbation, 21600 "
        "group bias, none for consistency); a call it would outlast is cut, later ones "
        "are not sent, and each is an error on its row",
    )


class JudgeAudit(BaseModel):
    """A second judge for a sample of the judgements: how often do two judges agree?"""

    model_config = ConfigDict(extra="forbid")
    judge: Connection = Field(..., description="the auditing judge, another model than the run's judge")
    share: float = Field(0.2, gt=0.0, le=1.0, description="share of the judgements asked again (seeded per judgement)")


# the metric registry (name -> plug-in): set by ``aip_assets.metrics`` when it is imported, so the
# spec layer validates against it without importing any metric
_METRICS: Mapping[str, Any] | None = None
# the languages the names catalogue covers (catalog/names.py NAME_LANGUAGES: a test holds them equal; this
# layer does not import the catalogue)
NAME_LANGUAGES = ("en",)
# MetricEntry fields only some metrics take (``Metric.entry_fields`` says which)
OWN_ENTRY_FIELDS = (
    "fail_on_differential_refusal",
    "axis_threshold",
    "reference_values",
    "group_threshold",
    "baseline_share",
    "fail_on_excess",
    "min_impact_ratio",
    "persona_form",
    "intersections",
)


def use_metric_registry(registry: Mapping[str, Any]) -> None:
    """Validate run specs against this metric registry (``aip_assets.metrics`` passes its own)."""
    global _METRICS
    _METRICS = registry


def metric_registry() -> Mapping[str, Any]:
    """The metric registry specs are validated against."""
    if _METRICS is None:
        raise RuntimeError("no metric registry: import aip_assets.metrics before validating a run spec")
    return _METRICS


class MetricEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The metric's configuration: the fields of its config model (its metric page), validated "
        "before any call; the stored spec has every default filled in. Empty (default): every field's default.",
    )
    dataset: str | None = Field(None, description="this metric's own dataset (default: the run's)")
    threshold: float | None = Field(None, ge=0.0, le=1.0, description="fail the run when the normalised score is below")
    min_coverage: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="this metric's minimum share of planned units judged (default: the spec's min_coverage)",
    )
    fail_on_differential_refusal: bool | None = Field(
        None,
        description="llm.decision_flip: fail the gate when two values of one axis differ significantly in "
        "their refusal / no-decision rate (default true)",
    )
    axis_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="llm.decision_flip: every axis's score "
        "(1 - its flip rate) is held to this (default: the threshold)",
    )
    group_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="llm.group_interaction_bias: every "
        "attribute value's equitability is held to this (default: the threshold)",
    )
    gate_on: Literal["point", "interval", "equivalence"] = Field(
        "point",
        description="point: a score passes at or above its threshold; interval: only when its 95% interval's "
        "lower end does; equivalence (llm.decision_flip, llm.group_interaction_bias): an axis or group passes only "
        "when its effect beyond the no-effect baseline is shown to lie within margin (two one-sided tests: its "
        "interval's far end within margin), the only way a run claims 'no bias' rather than 'not shown'",
    )
    margin: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="gate_on equivalence: the largest effect counted as no bias, on the effect's own scale (an "
        "excess flip rate for llm.decision_flip, an equitability gap for llm.group_interaction_bias); required "
        "with equivalence, refused without it",
    )
    min_judge_exam: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="the share of its qualifying exam an LLM judge must get right before the run makes its first "
        "SUT call (items whose verdict is known by construction, built from the run's own questions and labels; "
        "docs/judges.md); below it the run stops with exit 2. 0 skips the exam. Default 0.8",
    )
    judge_exam_items: int = Field(
        3, ge=1, le=20, description="the judge exam's items per kind of item (default 3: 9 to 18 items per judge)"
    )
    baseline_share: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="llm.decision_flip, "
        "llm.group_interaction_bias: the share of pairs that get a null twin (the "
        "same persona asked twice) measuring the no-effect baseline (default 0.25 "
        "when sut_temperature > 0, else 0)",
    )
    fail_on_excess: bool | None = Field(
        None,
        description="llm.decision_flip, llm.group_interaction_bias: fail the "
        "gate when an axis's flips (a group's bias) exceed the null baseline's "
        "significantly (default true; needs a baseline)",
    )
    reference_values: dict[str, str] = Field(
        default_factory=dict,
        description="llm.decision_flip: per axis, a value whose favourable rate the words of 'who is favoured' "
        "quote beside the rest of the axis's (claims are always a value against the rest of its axis, within "
        "questions). Default: none",
    )
    min_impact_ratio: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="llm.decision_flip: fail the gate when an attribute value's impact ratio (its favourable rate "
        "over the highest of its axis) is below this (0.8: the four-fifths rule of the EEOC's Uniform "
        "Guidelines); gate_on interval or equivalence holds its interval's lower end. Default: no impact-ratio gate",
    )

    persona_form: Literal["explicit", "name", "both"] = Field(
        "explicit",
        description="llm.decision_flip, llm.group_interaction_bias: how a persona is told to the SUT: explicit "
        "(default: 'I am a woman. I am Black.'), name (a name from the names catalogue whose perceived gender and "
        "ethnicity were measured, where a user would give it: 'My name is ...', a signature, an application's name "
        "field; axes no name signals stay explicit) or both (each axis measured both ways in one run, the effects "
        "side by side). English only (docs/concepts/names.md)",
    )
    intersections: list[list[str]] = Field(
        default_factory=list,
        description="llm.decision_flip, llm.group_interaction_bias: pairs of axes whose values personas combine, "
        "e.g. [[gender, ethnicity]]: pairs vary one attribute while the other is held, so each combination's "
        "favourable rate and its interaction (how much worse it fares than its two attributes alone predict) are "
        "measured under the run's error control. Default: none",
    )

    @field_validator("intersections")
    @classmethod
    def _intersections(cls, v):
        known = ("role", "gender", "ethnicity", "religion")
        seen: set[tuple[str, str]] = set()
        for i, pair in enumerate(v):
            if len(pair) != 2 or len(set(pair)) != 2:
                raise ValueError(f"intersections[{i}]: {pair!r} must name two different axes, e.g. [gender, ethnicity]")
            for a in pair:
                if a not in known:
                    raise ValueError(f"intersections[{i}]: unknown axis {a!r}; known: {', '.join(known)}")
            key = tuple(sorted(pair))
            if key in seen:
                raise ValueError(f"intersections[{i}]: {pair!r} is listed twice")
            seen.add(key)
        return [list(p) for p in v]

    @model_validator(mode="after")
    def _margin(self):
        if self.gate_on == "equivalence" and self.margin is None:
            raise ValueError(
                "gate_on: equivalence needs a margin: the largest effect counted as no bias (e.g. margin: 0.05 for an "
                "excess flip rate of 5 points)"
            )
        if self.margin is not None and self.gate_on != "equivalence":
            raise ValueError(
                "margin is read only with gate_on: equivalence; set gate_on: equivalence or leave margin out"
            )
        return self


class ClaimsPolicy(BaseModel):
    """How every claim a run states as beyond chance is decided (docs/concepts/claims.md)."""

    model_config = ConfigDict(extra="forbid")
    adjust: Literal["holm", "bh"] = Field(
        "holm",
        description="holm (default): Holm's adjustment, holding the family-wise error rate (the chance of any false "
        "claim among one metric's claims in the run) at alpha; bh: Benjamini-Hochberg, holding the false discovery "
        "rate (the expected share of false claims among those made) at alpha",
    )
    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="the error rate the adjustment holds; default 0.05")


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        ...,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="The spec's name (up to 64 letters, digits, '_', '.' or '-', starting with a letter or digit): "
        "a run's id is <name>-<UTC timestamp>, and its runs are tagged with it.",
    )
    description: str = Field(
        "", description="Free text about the spec, stored with the resolved spec; it changes nothing measured."
    )
    dataset: str = Field(
        ...,
        description="The dataset file (gdi_text_v1: CSV, JSONL or Parquet), relative to the spec's folder; every "
        "metric without its own dataset reads it.",
    )
    sut: Connection = Field(
        default_factory=Connection,
        description="The system under test's connection. Default: the builtin offline model, profile fair.",
    )
    judge: Connection = Field(
        default_factory=Connection,
        description="The judge's connection. Default: the builtin model, whose judge is a heuristic for the "
        "offline rig; with judges given, the panel's first judge.",
    )
    judges: list[Connection] | None = Field(
        None,
        description="a judge panel (two or more): every verdict is asked of every judge and decided by "
        "judge_rule; the first judge is the primary and plays judge's role everywhere else (the "
        "synthesis default, the endpoint check, the builtin-judge note); give judges or judge",
    )
    judge_rule: Literal["majority", "unanimous"] = Field(
        "majority",
        description="a panel's rule: majority (the verdict of the first judge whose category a strict "
        "majority of the valid verdicts shares), unanimous (every judge answers, all alike); "
        "otherwise the judgement is excluded as judges_disagree",
    )
    synthesis: Connection | None = Field(None, description="model that writes personas/variants; default: the judge's")
    metrics: dict[str, MetricEntry] = Field(
        ...,
        description="The metrics to run, by registered name (llm.decision_flip...), each with its config and its "
        "gate fields; at least one.",
    )
    seed: int = Field(
        0,
        description="The run seed: each row's persona pairs, templates and variants, the order a judge is shown "
        "two answers, the null twins and the audit sample are drawn from it, so one seed repeats one draw. "
        "Default 0.",
    )
    judge_retries: int = Field(
        2,
        ge=0,
        le=5,
        description="one budget per judgement: extra requests for it, failed calls and re-asks of an unusable answer together (2: at most three requests)",
    )
    judge_temperature: float = Field(
        0.0,
        ge=0.0,
        le=2.0,
        description="Sampling temperature of the judges' calls (0-2); default 0.0. The consistency family judges "
        "at 0 whatever it says.",
    )
    reuse_calls_from: list[str] = Field(
        default_factory=list, description="earlier run ids whose successful calls may answer this run's"
    )
    templates: dict[Literal["semantic", "factual", "safety", "jailbreak"], list[dict[str, str]]] = Field(
        default_factory=dict, description="extra variant templates per family: [{category, template}]"
    )
    limits: Limits = Field(
        default_factory=Limits,
        description="Caps on the run's model calls and tokens (a clean, resumable stop) and the row deadline. "
        "Default: no cap, each metric's own deadline.",
    )
    schedule: str | None = Field(None, description="cron expression: evaluate this spec again on every tick (UTC)")
    max_failed_share: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="completeness checks fail above this share of failed SUT answers or judge verdicts",
    )
    batch_rows: int = Field(5000, ge=1, le=100_000, description="rows per streamed batch; memory is bounded by it")
    retry_backoff_seconds: float = Field(
        0.5, gt=0.0, le=30.0, description="base delay of exponential backoff on transient errors"
    )
    judge_audit: JudgeAudit | None = Field(
        None, description="a second judge for a sample of the judgements: agreement and Cohen's kappa per metric"
    )
    max_position_bias: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="the judge_position_bias check fails when the "
        "judge's verdicts differ by more than this between the two orders it was shown "
        "(and significantly)",
    )
    fail_on_regression: bool = Field(
        False,
        description="fail a metric's gate when it got significantly worse since the spec's previous completed run "
        "on the same dataset (the regression check: docs/concepts/history.md); default false: a regression is a "
        "finding and a warning on the regression check",
    )
    claims: ClaimsPolicy = Field(
        default_factory=ClaimsPolicy,
        description="How claims (an effect beyond chance, a group decided against, flips beyond noise) are decided: "
        "the adjustment within each metric's claims and the error rate it holds. Default: Holm at 0.05.",
    )
    min_coverage: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="the gate fails when a metric judged less than this "
        "share of what it planned (excluded: failed or empty answers, unreadable decisions, "
        "judges that never answered in form)",
    )

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v):
        registry = metric_registry()
        if not v:
            raise ValueError("at least one metric is required")
        unknown = [m for m in v if m not in registry]
        if unknown:
            import difflib

            near = {m: difflib.get_close_matches(m, list(registry), n=1, cutoff=0.6) for m in unknown}
            hints = "".join(f"; did you mean {near[m][0]!r} for {m!r}?" for m in unknown if near[m])
            raise ValueError(f"unknown metric(s) {unknown}; registered: {sorted(registry)}{hints}")
        for m, entry in v.items():
            for field in OWN_ENTRY_FIELDS:
                if getattr(entry, field) not in (None, {}, [], "explicit") and field not in registry[m].entry_fields:
                    # a stored spec names every field
                    takers = [name for name, plugin in registry.items() if field in plugin.entry_fields]
                    raise ValueError(f"{m}.{field}: only {' and '.join(takers)} take it")
            language = entry.config.get("language", "en")
            if entry.persona_form != "explicit" and language not in NAME_LANGUAGES:
                raise ValueError(
                    f"{m}.persona_form: no names catalogue for language {language!r}: names are catalogued for "
                    f"{', '.join(NAME_LANGUAGES)} only (their perception was measured among US raters); use "
                    "persona_form: explicit"
                )
            if entry.config.get("persona_pairs") and (entry.persona_form != "explicit" or entry.intersections):
                raise ValueError(
                    f"{m}: persona_form and intersections build personas from the catalogues; config.persona_pairs "
                    "gives its own personas word for word: leave persona_pairs out, or set persona_form: explicit "
                    "and no intersections"
                )
        return v

    @field_validator("judges")
    @classmethod
    def _panel(cls, v):
        if v is None:
            return v
        if len(v) < 2:
            raise ValueError(f"a panel needs two or more judges, got {len(v)}; for one judge, use judge: instead")
        seen: dict[tuple, int] = {}
        for i, c in enumerate(v):
            same = seen.setdefault(c.call_identity(), i)
            if same != i:
                raise ValueError(
                    f"judges[{same}] and judges[{i}] are the same judge ({c.endpoint_id()[:120]}, model "
                    f"{c.model}): they would share every call and answer alike; name another model or "
                    "endpoint"
                )
        return v

    @model_validator(mode="after")
    def _primary_judge(self):
        if self.judges is None:
            if self.judge_rule != "majority":
                raise ValueError(
                    f"judge_rule: {self.judge_rule} needs a panel (judges: [...]); with one judge there "
                    "is no rule to apply"
                )
            return self
        # a stored (resolved) spec names both, judge being judges[0]: that is no conflict
        if "judge" in self.model_fields_set and self.judge != self.judges[0]:
            raise ValueError(
                "judge and judges are both given: with a panel the first of judges is the judge; "
                "drop judge (or make it judges[0])"
            )
        self.judge = self.judges[0]
        return self

    def panel(self) -> list[Connection]:
        """The run's judges: the panel's, else the one judge."""
        return list(self.judges) if self.judges else [self.judge]

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v):
        if v is None:
            return v
        from dagster import DagsterInvalidDefinitionError, ScheduleDefinition

        try:  # Dagster's own check, through its public API: a schedule on this cron string
            ScheduleDefinition(name="aip_cron_check", cron_schedule=v, job_name="aip_cron_check")
        except (DagsterInvalidDefinitionError, ValueError):
            raise ValueError(f"not a valid cron expression: {v!r} (e.g. '0 2 * * *' for 02:00 UTC daily)") from None
        return v

    @field_validator("templates")
    @classmethod
    def _templates(cls, v):
        for family, items in v.items():
            slot = "{prompt}" if family == "jailbreak" else "{query}"
            for i, it in enumerate(items):
                if set(it) != {"category", "template"}:
                    raise ValueError(f"templates.{family}[{i}]: needs exactly 'category' and 'template'")
                if it["template"].count(slot) != 1:
                    raise ValueError(f"templates.{family}[{i}]: the template must contain {slot} exactly once")
        return v

    def dataset_for(self, metric: str) -> str:
        return self.metrics[metric].dataset or self.dataset

    def min_coverage_for(self, metric: str) -> float:
        own = self.metrics[metric].min_coverage
        return self.min_coverage if own is None else own

    def datasets(self) -> list[str]:
        return sorted({self.dataset_for(m) for m in self.metrics})

    def synthesis_connection(self) -> Connection:
        return self.synthesis or self.judge

    def metric_config(self, metric: str):
        return metric_registry()[metric].config_model.model_validate(self.metrics[metric].config)

    def shown(self) -> dict:
        """The resolved spec with, per connection, only the fields that apply to its provider
        (no builtin ``profile`` under an ``openai`` connection, no URL or headers under a builtin one)."""
        d = self.resolved()

        def shown(conn: Connection, data: dict) -> dict:
            return {k: v for k, v in data.items() if k not in conn.foreign_fields()}

        for role in ("sut", "judge", "synthesis"):
            conn = getattr(self, role)
            if conn is not None:
                d[role] = shown(conn, d[role])
        if self.judges:
            d["judges"] = [shown(c, x) for c, x in zip(self.judges, d["judges"])]
        return d

    def resolved(self) -> dict:
        """Defaults filled, metric configs resolved. Holds no secret: keys and secret headers are
        only ever named by environment variable (api_key_env, header_env)."""
        d = self.model_dump()
        for m in self.metrics:
            d["metrics"][m]["config"] = self.metric_config(m).model_dump(mode="json")
        return d


def _validate_metric_configs(spec: RunSpec, where: str) -> None:
    for m in spec.metrics:
        try:
            spec.metric_config(m)
        except ValidationError as e:
            raise SpecError(
                f"{where}: invalid config for metric {m}:\n" + format_validation_error(e, f"metrics.{m}.config")
            ) from None


def parse_spec(data: dict, where: str = "<spec>", base_dir: Path | None = None) -> RunSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: a run spec must be a mapping, got {type(data).__name__}")
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{where}: invalid run spec:\n" + format_validation_error(e)) from None
    _validate_metric_configs(spec, where)

    def resolve(value: str, field: str) -> str:
        ds = Path(value)
        if not ds.is_absolute():
            try:
                ds = ((base_dir or Path.cwd()) / ds).resolve()
            except (RuntimeError, OSError):  # a symbolic link loop (RuntimeError before Python 3.13)
                ds = (base_dir or Path.cwd()) / ds
        if (loop := symlink_loop(ds)) is not None:
            raise SpecError(f"{where}: {field}: {ds} {loop}")
        if not ds.exists():
            raise SpecError(f"{where}: {field}: file not found: {ds} (relative paths are read from the spec's folder)")
        return str(ds)

    spec.dataset = resolve(spec.dataset, "dataset")
    for m, entry in spec.metrics.items():
        if entry.dataset:
            entry.dataset = resolve(entry.dataset, f"metrics.{m}.dataset")
    return spec


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one YAML mapping: its lines (1-based)."""

    def __init__(self, key: Any, line: int, first: int):
        self.key, self.line, self.first = key, line, first
        super().__init__(f"key {key!r} on line {line} duplicates line {first}")


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: plain YAML keeps the last one
    silently (a metric listed twice would run with its second entry alone). A key overriding one
    merged in with ``<<`` is not a duplicate."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKey(key, line, seen[key])
                seen[key] = line
            except TypeError:  # an unhashable key: the base loader says so
                continue
        return super().construct_mapping(node, deep)


def load_yaml(path: Path) -> Any:
    """A YAML file's data, read by :class:`UniqueKeyLoader`: SpecError naming the file, the key and
    its lines for a duplicate key, or the parser's message for YAML that does not parse."""
    try:
        return yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except DuplicateKey as e:
        raise SpecError(
            f"{path}: line {e.line}: key {e.key!r} is given twice in one mapping (first on line {e.first}); "
            "YAML would keep only the last: remove one, or merge them"
        ) from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {e}") from None


def load_spec(path: str | Path) -> RunSpec:
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{path}: run spec not found")
    data = load_yaml(path)
    return parse_spec(data, str(path), path.parent.resolve())
