import json

import pytest
import yaml

from aip_assets.errors import SpecError
from aip_assets.runspec import load_spec, parse_spec

from .conftest import make_spec, write_dataset


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("num_pairs_per_dimension", 17, "num_pairs_per_dimension"),
        ("pool_size_per_dimension", 0, "pool_size_per_dimension"),
        ("sut_temperature", 2.5, "sut_temperature"),
        ("timeout_seconds", 0, "timeout_seconds"),
        ("language", "fr", "language"),
        ("dimensions", ["age"], "dimensions"),
        ("no_such_field", 1, "no_such_field: unknown field"),
    ],
)
def test_bad_metric_config_names_the_field(tmp_path, field, value, needle):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    with pytest.raises(SpecError) as e:
        make_spec(ds, config={field: value})
    assert f"metrics.llm.decision_flip.config.{needle}" in str(e.value)


def test_spec_file_errors(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "dataset": "d.jsonl", "metrics": {"llm.nope": {}}}))
    with pytest.raises(SpecError, match=r"(?s)s.yaml.*unknown metric"):
        load_spec(p)
    p.write_text(yaml.safe_dump({"name": "x", "dataset": "missing.jsonl", "metrics": {"llm.decision_flip": {}}}))
    with pytest.raises(SpecError, match="dataset: file not found"):
        load_spec(p)
    p.write_text(yaml.safe_dump({"name": "x", "dataset": "d.jsonl", "metrics": {"llm.decision_flip": {}}, "sedd": 1}))
    with pytest.raises(SpecError, match="sedd: unknown field"):
        load_spec(p)
    p.write_text(yaml.safe_dump({"name": "x", "dataset": "d.jsonl", "metrics": {"llm.decision_flip": {}}}))
    assert load_spec(p).dataset == str(ds.resolve())


def test_secrets_never_in_resolved_spec(tmp_path, monkeypatch):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    spec = make_spec(
        ds,
        sut={
            "provider": "openai",
            "base_url": "http://127.0.0.1:1/v1",
            "model": "m",
            "api_key_env": "MY_KEY",
            "header_env": {"X-Org-Token": "MY_KEY"},
            "headers": {"X-Team": "fairness"},
        },
    )
    text = json.dumps(spec.resolved())
    assert "sk-very-secret" not in text and "MY_KEY" in text and "fairness" in text
    with pytest.raises(SpecError, match="look secret"):
        make_spec(ds, sut={"provider": "openai", "base_url": "http://x/v1", "headers": {"Authorization": "Bearer x"}})


def test_persona_pairs_validation(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    with pytest.raises(SpecError, match=r"persona_pairs.*'persona_b' is required"):
        make_spec(ds, config={"persona_pairs": [{"persona_a": "I am a woman."}]})


def test_decision_flip_synthesis_temperature_is_refused_not_ignored(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    make_spec(ds, config={"synthesis_temperature": 0.0})
    with pytest.raises(SpecError, match="synthesis_temperature has no effect"):
        make_spec(ds, config={"synthesis_temperature": 0.5})


def test_a_misspelled_metric_gets_a_did_you_mean():
    """Issue 38: the metric meant is named beside the registered ones."""
    with pytest.raises(SpecError, match=r"did you mean 'llm\.decision_flip' for 'llm\.decison_flip'\?"):
        parse_spec({"name": "x", "dataset": "d.csv", "metrics": {"llm.decison_flip": {}}})
