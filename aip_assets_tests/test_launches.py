"""Launches as an operator sees them (issue 38): the launchpad's default run id, a failed gate read
as a verdict (no stack trace), check metadata that plots one metric, and the CLI's runs on
Dagster's Overview."""

from __future__ import annotations

import yaml

from aip_assets.dagster_home import get_instance
from aip_assets.definitions import defs

from .conftest import write_dataset

FLIP = {"name": "flip", "value": "woman", "axis": "gender", "p": 1.0}


def _spec(tmp_path, name="gated", threshold: float | None = None):
    ds = write_dataset(tmp_path / "d.jsonl", 4)
    path = tmp_path / "data" / "runs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    metric: dict = {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}
    if threshold is not None:
        metric["threshold"] = threshold
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": str(ds),
                "seed": 1,
                "sut": {"provider": "builtin", "profile": FLIP},
                "metrics": {"llm.decision_flip": metric},
            }
        )
    )
    return path


def _launch(path, run_id: str | None = None):
    config = {"spec_path": str(path), **({"run_id": run_id} if run_id is not None else {})}
    return defs.resolve_job_def("aip_launch").execute_in_process(
        run_config={"ops": {"register_and_evaluate": {"config": config}}},
        instance=get_instance(),
        raise_on_error=False,
    )


def _registered() -> list[str]:
    from aip_assets import warehouse as wh

    return wh.query("SELECT run_id FROM eval_runs ORDER BY run_id", read_only=False).run_id.tolist()


def test_each_launch_from_the_launchpad_evaluates_a_new_run_and_a_named_run_resumes(tmp_path):
    """Fault 3: the launchpad's default run id is empty, and each launch with it registers a new run
    (named from the spec and the time, ``-2`` when that name is taken), kept as the launch's
    ``aip/run_id`` tag; a launch that names a registered run resumes it and registers none."""
    from aip_assets.automation import LaunchConfig

    assert LaunchConfig().run_id == ""
    path = _spec(tmp_path, name="pad")
    instance = get_instance()
    first, second = _launch(path), _launch(path)
    assert first.success and second.success
    ids = [instance.get_run_by_id(r.run_id).tags["aip/run_id"] for r in (first, second)]
    assert ids[0] != ids[1] and all(i.startswith("pad-") for i in ids)
    assert _registered() == sorted(ids)
    evaluated = sorted(r.tags["aip/run_id"] for r in instance.get_runs() if r.job_name == "evaluate")
    assert evaluated == sorted(ids)  # each launch evaluated its own run
    again = _launch(path, run_id=ids[0])
    assert again.success and _registered() == sorted(ids)
    logs = [e.user_message for e in instance.all_logs(again.run_id)]
    assert any(f"run {ids[0]} is registered: resuming it" in m for m in logs)
