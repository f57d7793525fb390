"""`aip-eval ui` and `aip-eval daemon`: Dagster's own commands on the project's instance and code
location, this process becoming theirs; the report server started beside the UI."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("aip_assets")


def _dagster(what: str, extra: list[str]) -> int:
    """Run a Dagster command on this project's instance (``prepare_home``: Postgres in shared mode,
    with the storage URL in the environment it inherits) and this code location, in this process."""
    from ..dagster_home import configured_storage_url, prepare_home, shared
    from ..run_queue import MODULE, location_name
    from ..shared_state import describe

    home = prepare_home()
    url = configured_storage_url()
    where = f"Postgres {describe(url)}" if shared() and url else f"{home}"
    log.info(f"{what}: Dagster instance {home} (storage: {where}), code location {location_name()}")
    # this module, under the name queued runs give it (beside the temp files: DAGSTER_HOME may be read-only)
    import hashlib
    import tempfile

    text = (
        f"load_from:\n  - python_module:\n      module_name: {MODULE}\n"
        f"      location_name: {json.dumps(location_name())}\n"
    )
    workspace = Path(tempfile.gettempdir()) / f"aip-workspace-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    if not workspace.exists() or workspace.read_text() != text:
        tmp = workspace.with_name(f".{workspace.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, workspace)
    # Dagster's command without its notices about its own API (dagster_cli.py)
    cmd = [sys.executable, "-m", "aip_assets.dagster_cli", *{"daemon": ["daemon", "run"], "ui": ["dev"]}[what]]
    cmd += ["-w", str(workspace)]
    sys.stdout.flush()
    sys.stderr.flush()
    # this process becomes Dagster's: a service manager's SIGTERM or a Ctrl-C reaches it, and no
    # daemon is left behind without its parent
    os.execv(cmd[0], cmd + extra)
    return 0  # not reached


def cmd_daemon(args) -> int:
    return _dagster("daemon", [])


def start_report_server(host: str, port: int | None = None) -> tuple[subprocess.Popen | None, str]:
    """Start the report server beside the UI, in a child process that ends when this process (or
    the program it becomes: `dagster dev`) ends, so the metadata's report and viewer links open.

    Args:
        host: The interface to listen on.
        port: Its port (default ``AIP_REPORT_PORT``).

    Returns:
        (the child process, or None when it could not listen; the line to print about it).
    """
    from ..report import report_port

    port = report_port() if port is None else port
    code = f"from aip_assets.report.server import serve_beside; serve_beside({os.getpid()}, {host!r}, {port})"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert child.stdout is not None
    said = child.stdout.readline().strip()
    child.stdout.close()
    if said.startswith("ready "):
        return child, f"reports: http://{host}:{said.split()[1]}/ (the metadata's report_url and viewer links)"
    child.wait()
    why = said.removeprefix("busy ") or f"it exited with {child.returncode}"
    return None, (
        f"note: no report server started on {host}:{port} ({why}); if another `aip-eval report --serve` "
        "is not serving there, set AIP_REPORT_PORT"
    )


def cmd_ui(args) -> int:
    _, line = start_report_server(args.host)
    print(line, flush=True)
    return _dagster("ui", ["--host", args.host, "--port", str(args.port)])
