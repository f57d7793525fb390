"""What both benchmarks record beside their figures: the machine and the code measured."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from datetime import datetime, timezone
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
    return {"nproc": nproc, "cpu": cpu, "python": platform.python_version(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def code_fingerprint() -> str:
    """sha256 (12 hex) over aip_assets/**/*.py and the newest mtime: ties a result to the code it measured."""
    pkg = Path(__file__).resolve().parents[1] / "aip_assets"
    h, newest = hashlib.sha256(), 0.0
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
        newest = max(newest, f.stat().st_mtime)
    when = datetime.fromtimestamp(newest, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"aip_assets sources sha256 {h.hexdigest()[:12]} (newest file {when})"
