"""`aip-eval serve-builtin` in a process of its own answers the metrics' judge prompts: their
answers come from the metric registry (``metrics.base`` registers it as the builtin judge's
source), which the server's process has to load itself (a test process has it already)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from aip_assets.metrics.decision_flip.prompts import JUDGE_SYSTEM, judge_prompt

REPO = Path(__file__).resolve().parents[1]


def test_serve_builtin_answers_a_judge_prompt_in_its_own_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen(
        [sys.executable, "-m", "aip_assets.cli", "serve-builtin", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/stats", timeout=5).read()
                break
            except OSError:
                time.sleep(0.1)
        prompt = judge_prompt("gender", "a woman", "a man", ["YES", "NO"], "Decision: YES", "Decision: NO")
        body = {
            "model": "aip-builtin",
            "messages": [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": prompt}],
        }
        req = urllib.request.Request(
            base + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        answer = json.loads(urllib.request.urlopen(req, timeout=30).read())["choices"][0]["message"]["content"]
        assert isinstance(json.loads(answer), dict), answer  # a verdict, not a SUT's prose
    finally:
        server.terminate()
        server.wait(10)
