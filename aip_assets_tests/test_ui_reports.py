"""`aip-eval ui` starts the report server beside Dagster: after its setup (``start_report_server``,
what `ui` runs before it becomes `dagster dev`) the metadata's report URL answers, and the server
ends with the process that started it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from aip_assets.cli import start_report_server
from aip_assets.report import default_out, report_url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int, patience_s: float = 60) -> bool:
    """Whether the process ``pid`` ended within a patient bound (a busy machine is slow)."""
    end = time.monotonic() + patience_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # our own child: reap it
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.2)
    return False


def test_ui_setup_serves_the_report_url(tmp_path):
    port = _free_port()
    report = default_out("r1")
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("<html>the report of r1</html>")
    child, line = start_report_server("127.0.0.1", port)
    try:
        assert child is not None and line.startswith(f"reports: http://127.0.0.1:{port}/")
        with urllib.request.urlopen(report_url(report, port), timeout=30) as r:
            assert r.status == 200 and r.read() == b"<html>the report of r1</html>"
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=30)


def test_a_taken_port_is_said_and_the_ui_goes_on(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        child, line = start_report_server("127.0.0.1", port)
    assert child is None and f"no report server started on 127.0.0.1:{port}" in line and "AIP_REPORT_PORT" in line


def test_the_report_server_ends_with_the_ui(tmp_path):
    """The process that started it (the UI, as `dagster dev` after exec) ends: so does the server."""
    port = _free_port()
    code = (
        "import json, sys; from aip_assets.cli import start_report_server; "
        f"child, _ = start_report_server('127.0.0.1', {port}); print(json.dumps(child.pid), flush=True)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    pid = json.loads(out.stdout.strip().splitlines()[-1])
    assert _gone(pid), f"the report server {pid} outlived the process that started it"
    with socket.socket() as s:  # and its port is free again
        s.bind(("127.0.0.1", port))
