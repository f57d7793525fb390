"""The Dagster UI, driven in headless Chromium: the asset graph, a partition materialised from the
UI, and the asset-check results.

The test uses a small project folder in tmp_path (a workspace.yaml, the repo's dagster.yaml, a
4-row dataset and a spec with one metric). `aip-eval run` registers a run and materialises it once,
so the UI has its `run|metric` partition to offer (a run adds one key per configured metric). Then `dagster dev` serves that folder, and
Playwright drives Debian's Chromium (`/usr/bin/chromium`; `.ci/run` installs it) through the UI:

1. dismiss the first-run "Join the Dagster community" dialog; the Overview's timeline shows the
   CLI's run (screenshot `0_overview_timeline.png`);
2. the `evaluation` group's lineage shows the five stages (screenshot `1_asset_graph.png`);
3. on the `evaluate` job's page, "Materialize all…" → choose the run's `<run>|llm.decision_flip`
   partition → "Launch 1 run" (the run is the evaluate job's, as the CLI's are)
   (screenshot `2_launch_dialog.png`);
4. once the instance has it finished, the Runs page, filtered to the new run, shows it as Success
   (screenshot `3_run.png`); the
   instance agrees: one new run, SUCCESS, tagged as launched from the UI, for that partition, with
   every asset check passed;
5. the `ingest` and `aggregation` assets' Checks tabs show `dataset_quality` and `threshold` as
   passed, with one execution from the CLI run and one from the UI run in each check's history
   (screenshots `4_checks_ingest*.png`, `5_checks_aggregation*.png`; then `6_asset_graph_after.png`);
   the `gate` check's overview names the partition of its latest execution and plots its numbers
   under names of the metric (`decision_flip score`).

Screenshots are written to tmp_path/screenshots and copied to $AIP_TEST_ARTIFACTS (default
aip_assets_tests/artifacts/), also when the test fails (then with a `failure.png` of the page).
Skipped when Chromium or the `playwright` package is missing. `dagster dev` runs in its own process
group, which is stopped as a whole at the end: its children (webserver, daemon, code servers, run
workers) outlive a signal sent to the parent alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from aip_assets_tests.conftest import write_dataset

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("AIP_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(os.environ.get("AIP_TEST_ARTIFACTS", REPO / "aip_assets_tests" / "artifacts"))
# Flags for a container without a GPU, a user namespace sandbox or a network: no sandbox, no GPU
# process, no background calls home (updates, sync, component downloads), no first-run wizard.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STAGES = ["ingest", "synthesis", "sut_sampling", "judging", "aggregation"]
METRIC = "llm.decision_flip"
# The group page's URL: repository `__repository__` (a bare Definitions object) in the code
# location `aip_assets.definitions` (the module workspace.yaml loads).
GROUP_PATH = "/locations/__repository__@aip_assets.definitions/asset-groups/evaluation"
JOB_PATH = "/locations/__repository__@aip_assets.definitions/jobs/evaluate"  # the evaluate job's page
STARTUP_TIMEOUT_S = 90
# patience for the UI's run: the queued-run daemon's pickup (it polls every second here; a loaded
# machine is slower) plus a generous multiple of the same partition's CLI time, measured first
QUEUE_PICKUP_S = 60
RUN_TIME_FACTOR = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `python -m dagster ARGS`, with SIGTERM and SIGINT back at their default action first. A parent
# started without job control (`cmd &`, nohup, some CI runners) may ignore them, and ignored signals
# are inherited across exec: stopping `dagster dev` with SIGTERM would then do nothing until the
# SIGKILL fallback. (An exec wrapper rather than Popen's preexec_fn, which is unsafe with threads.)
_RESET_SIGNALS_AND_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_DFL); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'dagster', *sys.argv[1:]])"
)
DAGSTER_CMD = [sys.executable, "-c", _RESET_SIGNALS_AND_EXEC]


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies awaiting their parent don't count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields after "(comm)": state, ppid, pgrp, ...
            return True
    return False


def _stop_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the whole process group, wait for it, then SIGKILL whatever is left."""
    pgid = proc.pid  # start_new_session=True: the child leads its own session and process group
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.2)
    proc.wait(timeout=5)


@contextmanager
def dagster_dev(cwd: Path, log_path: Path) -> Iterator[str]:
    """`dagster dev` on a free loopback port in `cwd`; yields its base URL once /server_info answers."""
    port = _free_port()
    env = dict(os.environ)  # AIP_WAREHOUSE is set by the autouse fixture; DAGSTER_HOME by the CLI's run
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*DAGSTER_CMD, "dev", "-p", str(port), "-h", "127.0.0.1"],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"dagster dev did not answer within {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield url
    finally:
        _stop_group(proc)


def _project(tmp_path: Path) -> Path:
    """A project folder like the repo root: workspace.yaml, dagster.yaml, a dataset and a spec."""
    (tmp_path / "workspace.yaml").write_text(
        yaml.safe_dump({"load_from": [{"python_module": "aip_assets.definitions"}]})
    )
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    dataset = write_dataset(tmp_path / "data" / "datasets" / "ui.jsonl", 4)
    spec = {
        "name": "ui",
        "dataset": str(dataset),
        "seed": 3,
        "sut": {"provider": "builtin"},
        "judge": {"provider": "builtin"},
        "metrics": {METRIC: {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}},
    }
    path = tmp_path / "data" / "runs" / "ui.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return path


def test_dagster_ui_graph_materialise_and_checks(tmp_path, capsys, monkeypatch):
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's `chromium` package; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the `playwright` package is not installed")
    expect = sync_api.expect

    from dagster import DagsterEventType, DagsterRunStatus

    from aip_assets.cli import main
    from aip_assets.dagster_home import get_instance

    started = time.monotonic()
    spec = _project(tmp_path)
    # the instance the CLI prepares (data/dagster_home, the DAGSTER_HOME `dagster dev` inherits) has
    # its queue's daemon look for queued runs every second, not Dagster's 5 s
    monkeypatch.setenv("AIP_DEQUEUE_INTERVAL_SECONDS", "1")

    # A registered run, materialised once from the CLI into the same Dagster storage the UI will use
    # (data/dagster_home under the cwd): its run id is a key of the dynamic `run` partition dimension.
    t0 = time.monotonic()
    assert main(["run", str(spec), "--quiet", "--json"]) == 0
    cli_s = time.monotonic() - t0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    instance = get_instance()
    runs_before = {r.run_id for r in instance.get_runs()}
    assert len(runs_before) == 1

    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        with dagster_dev(tmp_path, tmp_path / "dagster_dev.log") as url, sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)  # headless
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(30_000)
            expect.set_options(timeout=30_000)
            try:
                timings = _drive_ui(
                    page,
                    sync_api,
                    expect,
                    url,
                    run_id,
                    shots,
                    instance,
                    runs_before,
                    DagsterRunStatus,
                    DagsterEventType,
                    cli_s,
                )
            except BaseException:
                try:  # the page as it was when the test failed; never mask the failure itself
                    page.screenshot(path=str(shots / "failure.png"), full_page=True)
                except Exception as e:  # noqa: BLE001
                    print(f"no failure screenshot: {e}")
                raise
            finally:
                browser.close()
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "failure.png").unlink(missing_ok=True)  # from an earlier failed run
        for png in shots.glob("*.png"):
            shutil.copy(png, ARTIFACTS / png.name)
        print(f"\nUI test: screenshots in {ARTIFACTS}, {time.monotonic() - started:.0f} s")
    # recorded, not asserted (a shared machine's wall clock proves nothing): the UI's run of one
    # partition against the CLI's run of the same partition (the CLI's includes registering the run)
    (ARTIFACTS / "timings.json").write_text(json.dumps(timings, indent=1))
    print(
        f"UI run {timings['ui_run_s']:.1f} s (start to end), CLI {timings['cli_s']:.1f} s, ratio "
        f"{timings['ui_run_s'] / timings['cli_s']:.2f}"
    )


def _drive_ui(
    page, sync_api, expect, url, run_id, shots, instance, runs_before, DagsterRunStatus, DagsterEventType, cli_s: float
) -> dict:
    # 1. First-run dialog. `dagster dev` shows "Join the Dagster community" once per instance (then it
    # records it as seen in its temporary DAGSTER_HOME), over whichever page is opened first; it
    # appears once the page's first queries answer. Dismiss it with "Skip" before anything else, and
    # keep a locator handler as a safety net should it show up again before a later action.
    nux = page.get_by_role("dialog").filter(has_text="Join the Dagster community")
    page.goto(url + "/", wait_until="domcontentloaded")
    try:
        nux.wait_for(state="visible", timeout=20_000)
    except sync_api.TimeoutError:
        pass  # not shown: this instance has seen it already
    else:
        nux.get_by_role("button", name="Skip").click()
    expect(nux).to_have_count(0)
    page.add_locator_handler(nux, lambda dialog: dialog.get_by_role("button", name="Skip").click())

    # 1b. The Overview's timeline shows the CLI's evaluate run (issue 38.7: it said "No runs" while the
    # runs had no code location; it groups runs by the code location and job that hold them).
    page.goto(url + "/overview/activity/timeline", wait_until="domcontentloaded")
    expect(page.get_by_text("evaluate", exact=True).first).to_be_visible()  # the job's row
    expect(page.get_by_text(re.compile(r"^No runs"))).to_have_count(0)  # "No runs or scheduled ticks in …"
    page.screenshot(path=str(shots / "0_overview_timeline.png"), full_page=True)

    # 2. The asset graph: the `evaluation` group's lineage view draws one node per stage.
    page.goto(url + GROUP_PATH, wait_until="domcontentloaded")
    for stage in STAGES:
        expect(page.get_by_text(stage, exact=True)).to_be_visible()
    page.wait_for_timeout(1000)  # let the graph finish its zoom-to-fit before the screenshot
    page.screenshot(path=str(shots / "1_asset_graph.png"), full_page=True)

    # 3. Materialise one partition from the UI: "Materialize all…" opens the launch dialog with a
    # partition selector. It opens a popover with a "Filter partitions" box and one menu item per
    # key: the run's keys, one per configured metric, and nothing else.
    # Launched from the evaluate job's page, the run is one of that job's (from the asset graph it
    # would be Dagster's implicit `__ASSET_JOB`).
    page.goto(url + JOB_PATH, wait_until="domcontentloaded")
    page.get_by_role("button", name="Materialize all").click()
    launch = page.get_by_role("dialog").filter(has_text="Launch runs to materialize")
    expect(launch).to_be_visible()
    key = f"{run_id}|{METRIC}"
    launch.get_by_text("Select a partition or create one").first.click()
    popover = page.get_by_role("dialog").filter(has=page.get_by_placeholder("Filter partitions"))
    expect(popover.get_by_role("menuitem", name=key)).to_be_visible()
    expect(
        popover.get_by_text("Select all (1)", exact=True)
    ).to_be_visible()  # one configured metric: one key, not seven
    popover.get_by_placeholder("Filter partitions").fill(key)
    popover.get_by_role("menuitem", name=key).click()
    page.keyboard.press("Escape")  # closes the popover only
    expect(popover).to_have_count(0)
    expect(launch.get_by_text("1 partition", exact=True)).to_be_visible()
    launch_button = launch.get_by_role("button", name="Launch 1 run")
    expect(launch_button).to_be_enabled()
    page.screenshot(path=str(shots / "2_launch_dialog.png"), full_page=True)
    launch_button.click()
    toast = page.get_by_text(re.compile(r"^Launched run [0-9a-f]{8}$"))
    expect(toast).to_be_visible()
    short_id = toast.inner_text().split()[-1]

    # The instance sees the new run at once (queued); its full id opens it in the Runs page.
    new = [r for r in instance.get_runs() if r.run_id not in runs_before]
    assert len(new) == 1, new
    dagster_run_id = new[0].run_id
    assert dagster_run_id.startswith(short_id)

    # 4. The Runs page, filtered to that run ("Run id is …"), shows it; once the instance has it
    # finished (polled here: reloading the page every few seconds to see would cost the webserver and
    # the browser a full page each time), the page, loaded again, reads Success.
    page.goto(f"{url}/runs?q%5B0%5D=id%3A{dagster_run_id}", wait_until="domcontentloaded")
    expect(page.get_by_text(short_id, exact=True)).to_be_visible()
    patience = QUEUE_PICKUP_S + RUN_TIME_FACTOR * cli_s
    deadline = time.monotonic() + patience
    while not instance.get_run_by_id(dagster_run_id).is_finished:
        assert time.monotonic() < deadline, (
            f"run {dagster_run_id} not finished within {patience:.0f} s "
            f"({QUEUE_PICKUP_S} s + {RUN_TIME_FACTOR} x the CLI's {cli_s:.1f} s)"
        )
        time.sleep(0.25)
    page.reload(wait_until="domcontentloaded")
    expect(page.get_by_text(short_id, exact=True)).to_be_visible()
    assert not page.get_by_text(re.compile(r"^(Failure|Canceled)$")).is_visible(), (
        f"run {dagster_run_id} did not succeed (see {url}/runs/{dagster_run_id})"
    )
    expect(page.get_by_text("Success", exact=True)).to_be_visible()
    page.screenshot(path=str(shots / "3_run.png"), full_page=True)

    run = instance.get_run_by_id(dagster_run_id)
    assert run.status == DagsterRunStatus.SUCCESS
    stats = instance.get_run_stats(dagster_run_id)
    timings = {
        "cli_s": round(cli_s, 2),
        "ui_run_s": round(stats.end_time - stats.start_time, 2),
        "ui_queued_to_end_s": round(stats.end_time - (stats.enqueued_time or stats.start_time), 2),
    }
    assert run.tags.get("dagster/from_ui") == "true" and run.job_name == "evaluate"
    assert run.tags["dagster/partition"] == f"{run_id}|{METRIC}"
    evaluations = [
        e.dagster_event.event_specific_data
        for e in instance.all_logs(dagster_run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    ]
    assert sorted(e.check_name for e in evaluations) == [
        "coverage",
        "dataset_quality",
        "differential_refusal",
        "gate",
        "judge_completeness",
        "judge_position_bias",
        "regression",
        "sut_completeness",
        "threshold",
    ]
    assert all(e.passed for e in evaluations)

    # 5. The check results: each asset's Checks tab lists its check with the latest result, and the
    # check's execution history has one row per evaluation: the CLI run's and the UI run's.
    for n, asset, check, count in ((4, "ingest", "dataset_quality", 1), (5, "aggregation", "threshold", 6)):
        page.goto(f"{url}/assets/{asset}?view=checks", wait_until="domcontentloaded")
        expect(page.get_by_text(f"Checks ({count})", exact=True)).to_be_visible()
        expect(page.get_by_text(check, exact=True).first).to_be_visible()
        expect(page.get_by_text("Succeeded", exact=True)).to_have_count(count)  # each check's status line
        expect(page.get_by_text("Passed", exact=True).first).to_be_visible()  # "Latest execution: Passed"
        page.screenshot(path=str(shots / f"{n}_checks_{asset}.png"), full_page=True)
        page.get_by_text(check, exact=True).first.click()  # that check's page (the list opens on the first)
        page.get_by_role("tab", name="Execution history").click()
        expect(page.get_by_text("Passed", exact=True)).to_have_count(2)
        # partitioned checks: each evaluation in the history names its run × metric partition
        expect(page.get_by_text(f"{run_id}|{METRIC}", exact=True)).to_have_count(2)
        page.screenshot(path=str(shots / f"{n}_checks_{asset}_history.png"), full_page=True)

    # The gate check's overview: its latest execution says whose partition it was (issue 38.5: the
    # list shows the worst of the check's partitions, the overview the latest execution, any
    # partition's), and its plots are named by the metric (one metric per plot, not seven).
    page.goto(f"{url}/assets/aggregation?view=checks&checkDetail=gate", wait_until="domcontentloaded")
    expect(page.get_by_text(f"llm.decision_flip (run {run_id}):").first).to_be_visible()
    expect(page.get_by_text("decision_flip score", exact=True).first).to_be_visible()
    page.screenshot(path=str(shots / "5_checks_aggregation_gate.png"), full_page=True)

    # 6. From the score to its evidence: the aggregation's latest materialisation reads score,
    # interval, threshold and passed as typed entries; the judgements table asset previews the pairs.
    page.goto(f"{url}/assets/aggregation?view=events", wait_until="domcontentloaded")
    for entry in (
        "headline",
        "decision_flip score",
        "decision_flip ci_low",
        "decision_flip ci_high",
        "decision_flip threshold",
        "passed",
    ):
        expect(page.get_by_text(entry, exact=True).first).to_be_visible()
    page.screenshot(path=str(shots / "7_aggregation_metadata.png"), full_page=True)
    page.goto(f"{url}/assets/warehouse/judgements?view=events", wait_until="domcontentloaded")
    for entry in ("preview", "dagster/row_count", "query"):
        expect(page.get_by_text(entry, exact=True).first).to_be_visible()
    page.get_by_text("[Show Markdown]").first.click()  # the preview: pairs, both answers, the judge's reasoning
    dialog = page.get_by_role("dialog")
    for column in ("value_a", "value_b", "response_a", "response_b", "reasoning"):
        expect(dialog.get_by_text(column, exact=True).first).to_be_visible()
    page.screenshot(path=str(shots / "8_judgements_preview.png"), full_page=True)
    page.keyboard.press("Escape")

    # The graph again: every stage's node now shows its latest materialisation and checks passed.
    page.goto(url + GROUP_PATH, wait_until="domcontentloaded")
    for stage in STAGES:
        expect(page.get_by_text(stage, exact=True)).to_be_visible()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(shots / "6_asset_graph_after.png"), full_page=True)
    return timings
