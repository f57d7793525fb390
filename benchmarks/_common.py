"""What the benchmarks share: the machine and the code measured (recorded beside their figures), a
simulation worker's fresh folder, interleaved jobs, and shares with their Wilson intervals."""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        nproc = str(os.cpu_count())
    return {
        "nproc": nproc,
        "cpu": cpu,
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def code_version() -> dict[str, str]:
    """The package version and the git commit of this checkout (with ``-dirty`` when files differ from it)."""
    root = Path(__file__).resolve().parents[1]
    version = "unknown"
    for line in (root / "aip_assets" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            version = line.split("=", 1)[1].strip().strip("\"'")
    commit = "unknown (not a git checkout)"
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            commit = head.stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--", "aip_assets", "benchmarks"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            if dirty:
                commit += "-dirty"
    except (OSError, subprocess.SubprocessError):
        pass
    return {"version": version, "commit": commit}


def run_header() -> dict[str, str]:
    """Everything a result is recorded with: machine, date, interpreter, version, commit, source fingerprint.

    Printed to stderr when a benchmark starts (so a log says what it measured) and stored in its JSON."""
    import sys

    info = {**machine_info(), **code_version(), "code": code_fingerprint(), "interpreter": sys.executable}
    print(
        f"aip_assets {info['version']} at commit {info['commit']}; {info['interpreter']}; "
        f"{info['nproc']} cores ({info['cpu']}); {info['date']}",
        file=sys.stderr,
        flush=True,
    )
    return info


def code_fingerprint() -> str:
    """sha256 (12 hex) over aip_assets/**/*.py and the newest mtime: ties a result to the code it measured."""
    pkg = Path(__file__).resolve().parents[1] / "aip_assets"
    h, newest = hashlib.sha256(), 0.0
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
        newest = max(newest, f.stat().st_mtime)
    when = datetime.fromtimestamp(newest, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"aip_assets sources sha256 {h.hexdigest()[:12]} (newest file {when})"


def write_results(out: Path, lines: list[str], info: dict) -> None:
    """A benchmark's results: the Markdown table at ``out``, everything measured beside it as JSON,
    and the table printed."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(info, indent=2, default=str))
    print("\n".join(lines))


# what a simulation's runs must not inherit from the shell: another Dagster home, shared mode, a lake
PROJECT_ENV = (
    "DAGSTER_HOME",
    "AIP_DAGSTER_HOME_SET",
    "AIP_DATA_DIR_SET",
    "AIP_DAGSTER_STORAGE_URL",
    "AIP_DAGSTER_STORAGE_URL_SET",
    "AIP_SHARED_STATE_URL",
    "AIP_LAKE_DATA_PATH",
    "AIP_S3_ENDPOINT",
    "AIP_S3_CREDENTIAL_CHAIN",
)


def clear_project_env() -> None:
    """Unset ``PROJECT_ENV`` in this process: its runs are local, in folders of their own."""
    for name in PROJECT_ENV:
        os.environ.pop(name, None)


def worker_setup(state: dict, prefix: str) -> dict:
    """A simulation worker, once per process (``state`` is the worker's module-level dict): the
    stages' info lines silenced, ``PROJECT_ENV`` cleared, a temporary root (removed at exit) and a
    counter of the folders made under it."""
    if state:
        return state
    logging.disable(logging.WARNING)  # the stages' info lines; warnings and errors still show
    clear_project_env()
    state["root"] = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, state["root"], True)
    state["n"] = 0
    return state


def interleave(groups: list[list]) -> list:
    """The groups' jobs taken in turn (the first of each, then the second...), so a stopped job has
    some of each."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def share(k: int, n: int) -> dict:
    """k of n with the share and its Wilson 95% interval."""
    from aip_assets.stats import wilson

    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "ci95": [lo, hi]}


def pct(x: dict | None) -> str:
    """A ``share`` as the tables print it: "k/n = rate [low, high]" ("–" for none)."""
    if not x or not x["n"]:
        return "–"
    lo, hi = x["ci95"]
    return f"{x['k']}/{x['n']} = {x['rate']:.3f} [{lo:.3f}, {hi:.3f}]"
