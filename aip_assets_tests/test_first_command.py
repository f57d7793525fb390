"""The README's first command installs what the demo needs and no more; the test command brings
the development tools (issue 38, fault 8: the first command installed the `dev` extra, 97
packages, before the demo could run).

The demo's needs are checked without installing anything: every module of a distribution that
only the `dev` extra brings (pytest, Playwright, moto, mypy, scipy...: the requirements' closure
read from the installed metadata) is made unimportable, and a run of every metric the demo
configures, its report included, still goes through."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def _first_block(text: str) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "no command block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_first_command_installs_the_package_alone_and_the_test_command_the_dev_tools():
    for page in ("README.md", "docs/index.md"):
        first, tests = _first_block((REPO / page).read_text())[:2]
        assert first == "pip install -e . && aip-eval run data/runs/demo.yaml", page
        assert tests == 'pip install -e ".[dev]" && pytest', page
    ci = (REPO / ".ci" / "run").read_text()  # CI runs the README's test command
    assert re.search(r'pip install .*-e "\.\[dev\]"', ci) and re.search(r"^python -m pytest", ci, re.M)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(reqs: list[Requirement]) -> set[str]:
    """The distributions ``reqs`` bring, as installed here (each one's requirements, extras followed)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    stack = list(reqs)
    while stack:
        r = stack.pop()
        key = (_norm(r.name), tuple(sorted(r.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(r.name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            q = Requirement(text)
            if q.marker and not any(q.marker.evaluate({"extra": e}) for e in ("", *r.extras)):
                continue
            stack.append(q)
    return {name for name, _ in seen}


def _dev_only_modules() -> set[str]:
    project = metadata.distribution("aip-assets").requires or []

    def bare(text: str) -> Requirement:
        r = Requirement(text)
        r.marker = None
        return r

    base = _closure([bare(t) for t in project if "extra ==" not in t])
    dev = _closure([bare(t) for t in project if 'extra == "dev"' in t]) - base
    assert {"pytest", "playwright", "moto", "mypy"} <= dev
    by_module = metadata.packages_distributions()
    return {m for m, dists in by_module.items() if {_norm(d) for d in dists} <= dev and not m.startswith("_")}


BLOCKER = """
import importlib.abc, sys
BLOCKED = set({blocked!r})
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (a dev-only package)", name=name)
        return None
sys.meta_path.insert(0, Blocked())
from aip_assets.cli import main
sys.exit(main(["run", {spec!r}, "--run-id", "base-install"]))
"""


def test_the_demo_runs_on_the_base_install_alone(tmp_path):
    blocked = _dev_only_modules()
    assert {"pytest", "playwright", "moto", "mypy"} <= blocked
    # the demo's spec, every metric, on its first three questions (and their perturbed answers)
    demo = yaml.safe_load((REPO / "data" / "runs" / "demo.yaml").read_text())
    rows = (REPO / "data" / "datasets" / "demo_decisions.jsonl").read_text().splitlines()[:3]
    ids = {json.loads(r)["input_id"] for r in rows}
    (tmp_path / "d.jsonl").write_text("\n".join(rows) + "\n")
    answered = [
        line
        for line in (REPO / "data" / "datasets" / "demo_perturbed_answered.jsonl").read_text().splitlines()
        if json.loads(line)["metadata"]["seed_input_id"] in ids
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(answered) + "\n")
    demo["dataset"] = str(tmp_path / "d.jsonl")
    demo["metrics"]["llm.perturbation_robustness_external"]["dataset"] = str(tmp_path / "p.jsonl")
    demo.pop("schedule", None)
    spec = tmp_path / "demo.yaml"
    spec.write_text(yaml.safe_dump(demo))
    code = BLOCKER.format(blocked=sorted(blocked), spec=str(spec))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # passed or a gate failed: it ran
    assert "dev-only" not in done.stderr, done.stderr[-3000:]
    assert len(re.findall(r"^llm\.\w+ +score ", done.stdout, re.M)) == len(demo["metrics"]), done.stdout[-3000:]
    assert done.stdout.rstrip().splitlines()[-1].startswith("Report: ")


def test_the_readme_links_each_metric_to_its_page_not_to_specs_outside_the_repository():
    """The README cited `shared/spec/000`, which a user of the repository does not have (issue 38,
    fault 10): each metric links to its page under docs/metrics/ instead."""
    from aip_assets.metrics import REGISTRY

    readme = (REPO / "README.md").read_text()
    for page in (readme, (REPO / "docs" / "index.md").read_text()):
        assert "shared/spec" not in page
    rows = [line for line in readme.splitlines() if line.startswith("| `llm.")]
    for metric in REGISTRY:
        row = next(r for r in rows if f"`{metric}`" in r)
        link = re.search(r"\]\((docs/metrics/[\w-]+\.md)(#[\w-]+)?\)", row)
        assert link and (REPO / link.group(1)).is_file(), row
