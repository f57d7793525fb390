"""Against promptfoo and Inspect AI (issue 39): the same SUT requests, end to end, interleaved rounds.

The SUT is ``python -m aip_assets.cli serve-builtin --latency-ms L`` (the demo's profile) in its own
process; our judge is a second ``serve-builtin`` (so that the SUT server counts SUT requests only).
Our small run is the demo spec restricted to decision flip, ``sub_call_concurrency_limit`` and
``max_connections`` at ``--concurrency`` (64), run as a user runs it, twice per round: in a fresh data
folder (``ours``: a project's first run) and in the first run's folder (``ours_warm``: a project that
has run before, its warehouse and Dagster storage made; every round still sends every request, the
journal answers only a run's own calls; promptfoo, too, keeps its database across rounds), and a
third time with the builtin judge in its own process (``ours_local_judge``, a fresh folder: the same
SUT requests and the same judgements, none of them a request; the peers make no judge requests
either, they read the answers in their own process), so the comparison is there both ways:

    python -m aip_assets.cli run spec.yaml --json --quiet

A first run (not timed) gives the requests: its SUT calls, read from its warehouse
(``llm_calls``, role ``sut``). The same requests (messages and parameters, the same count) are
then sent by

- promptfoo: ``promptfoo eval -c promptfooconfig.yaml --no-cache -j 64 --no-progress-bar --no-table
  -o results.json``, an ``openai:chat`` provider at the server (``omitDefaults``: no ``max_tokens``
  added), one prompt per parameter set (``{{ messages }}``, the request's messages as JSON) and
  one test per request;
- Inspect AI: ``inspect eval replay_task.py --model openai-api/replay/aip-builtin
  --max-connections 64 --display none --log-dir DIR``, a task with one sample per request and a
  solver that generates with the request's parameters, no scorer (its log is written).

Before the timed rounds each peer runs once against a recording endpoint in this process (same
latency and answers): every request body it sent must equal one of ours (as parsed JSON), the
multisets equal. Then ``--rounds`` interleaved rounds (ours, promptfoo, Inspect, ours, ...), each
tool timed from process start to exit; reported: each tool's wall times and median, its ratio to
ours (a peer's median / ours: above 1, ours is faster), the SUT server's requests per run (they
must match), the CPU time of the tool's processes, and the load average.

Install the peers outside the repository and the project's environment (defaults under
``$AIP_BENCH_PEERS``, else /work/peers):

    mkdir -p /work/peers/promptfoo && cd /work/peers/promptfoo && npm init -y && npm install promptfoo
    python -m venv /work/peers/inspect-venv && /work/peers/inspect-venv/bin/pip install inspect-ai openai

    python benchmarks/bench_peers.py [--rounds 5] [--latency-ms 100] [--concurrency 64]
        [--promptfoo-dir DIR] [--inspect-venv DIR] [--tools ours,promptfoo,inspect] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import yaml

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
from _common import run_header, write_results  # noqa: E402
from _rig import free_port  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = Path(os.environ.get("AIP_BENCH_PEERS", "/work/peers"))
INSTALL = {
    "promptfoo": "mkdir -p {dir} && cd {dir} && npm init -y && npm install promptfoo",
    "inspect": "python -m venv {dir} && {dir}/bin/pip install inspect-ai openai",
}
TOOLS = ("ours", "ours_warm", "ours_local_judge", "promptfoo", "inspect")
OURS = ("ours", "ours_warm", "ours_local_judge")

INSPECT_TASK = '''"""The SUT requests of an aip-eval run as an Inspect task: one sample per request, sent as recorded."""

import json
import os

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser
from inspect_ai.solver import Generate, TaskState, solver

ROLES = {"user": ChatMessageUser, "assistant": ChatMessageAssistant, "system": ChatMessageSystem}


@solver
def send_as_recorded():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        return await generate(state, **state.metadata["params"])

    return solve


@task
def replay():
    samples = []
    with open(os.environ["AIP_REPLAY_REQUESTS"]) as f:
        for i, line in enumerate(f):
            body = json.loads(line)
            params = {k: v for k, v in body.items() if k not in ("messages", "model")}
            msgs = [ROLES[m["role"]](content=m["content"]) for m in body["messages"]]
            samples.append(Sample(id=i, input=msgs, metadata={"params": params}))
    return Task(dataset=samples, solver=send_as_recorded())
'''


# PYTHONDONTWRITEBYTECODE (set on some machines) would have every run compile this checkout's ~100
# modules from source again (0.4-2.5 s): a user's installed or already-run copy has its bytecode
DROPPED = ("DAGSTER_HOME", "AIP_WAREHOUSE", "AIP_DATA_DIR", "PYTHONDONTWRITEBYTECODE")


def child_env() -> dict[str, str]:
    """This checkout's code first, its bytecode written; no Dagster home, warehouse or data folder of the caller's."""
    e = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith("AIP_SHARED")}
    e["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return e


def stats(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats", timeout=10) as r:
        return json.loads(r.read())


def start_server(profile: dict | None, latency_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "aip_assets.cli", "serve-builtin", "--port", str(port)]
    cmd += ["--latency-ms", str(latency_ms)]
    if profile:
        cmd += ["--profile", json.dumps(profile)]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(300):
        try:
            stats(url)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"serve-builtin did not start at {url}")


def proc_cpu(pid: int) -> float:
    """user + system CPU seconds of a live process (its /proc stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def small_spec(sut_url: str, judge_url: str | None, concurrency: int) -> dict:
    """The demo spec, decision flip alone, SUT and judge at the servers, ``concurrency`` in flight
    (``judge_url`` None: the builtin judge, in the run's own process)."""
    demo = yaml.safe_load((CHECKOUT / "data" / "runs" / "demo.yaml").read_text())
    metric = dict(demo["metrics"]["llm.decision_flip"])
    metric["config"] = dict(metric.get("config") or {}, sub_call_concurrency_limit=concurrency)

    def conn(url: str) -> dict:
        return {"provider": "openai", "base_url": url, "model": "aip-builtin", "max_connections": concurrency}

    return dict(
        demo,
        dataset=str((CHECKOUT / "data" / "runs" / demo["dataset"]).resolve()),
        sut=conn(sut_url),
        judge=conn(judge_url) if judge_url else {"provider": "builtin"},
        metrics={"llm.decision_flip": metric},
    )


def export_requests(data: Path) -> list[dict]:
    """The SUT requests the run in ``data`` sent, as request bodies, in the order they were journaled."""
    import duckdb

    con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT request FROM llm_calls WHERE role = 'sut' AND source = 'network' ORDER BY created_at, call_key"
        ).fetchall()
    finally:
        con.close()
    return [json.loads(r[0]) for r in rows]


def canonical(body: dict) -> str:
    return json.dumps({k: v for k, v in body.items() if v is not None}, sort_keys=True, ensure_ascii=False)


def write_promptfoo(work: Path, requests: list[dict], url: str, concurrency: int) -> Path:
    """A promptfoo config sending ``requests``: one prompt per parameter set, one test per request."""
    models = {b["model"] for b in requests}
    if len(models) != 1:
        raise SystemExit(f"the requests name several models: {sorted(models)}")
    params: dict[str, str] = {}  # canonical params -> prompt label
    prompts, tests = [], []
    for i, body in enumerate(requests):
        p = {k: v for k, v in body.items() if k not in ("messages", "model")}
        key = canonical(p)
        if key not in params:
            params[key] = f"params-{len(params)}"
            prompts.append({"id": params[key], "label": params[key], "raw": "{{ messages }}", "config": p})
        tests.append(
            {
                "description": f"request {i}",
                "vars": {"messages": json.dumps(body["messages"], ensure_ascii=False)},
                "prompts": [params[key]],
            }
        )
    config = {
        "description": "aip-eval's SUT requests, replayed",
        "prompts": prompts,
        "providers": [
            {
                "id": f"openai:chat:{models.pop()}",
                "config": {"apiBaseUrl": url, "apiKey": "none", "omitDefaults": True},
            }
        ],
        "tests": tests,
        "evaluateOptions": {"maxConcurrency": concurrency, "cache": False},
    }
    path = work / "promptfoo" / "promptfooconfig.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return path


def promptfoo_cmd(pf_dir: Path, config: Path, concurrency: int, out: Path) -> list[str]:
    return [
        str(pf_dir / "node_modules" / ".bin" / "promptfoo"),
        "eval",
        "-c",
        str(config),
        "--no-cache",
        "-j",
        str(concurrency),
        "--no-progress-bar",
        "--no-table",
        "-o",
        str(out),
    ]


def peer_env() -> dict[str, str]:
    """The caller's environment, bytecode written (``DROPPED``)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def promptfoo_env(work: Path) -> dict[str, str]:
    return {
        **peer_env(),
        "PROMPTFOO_CONFIG_DIR": str(work / "promptfoo" / "home"),  # its database, not the user's
        "PROMPTFOO_DISABLE_TELEMETRY": "1",
        "PROMPTFOO_DISABLE_UPDATE": "1",
        "OPENAI_API_KEY": "none",
    }


def promptfoo_check(out: Path, n: int) -> str | None:
    """None when promptfoo's results hold ``n`` answers and no error, else what is wrong."""
    try:
        res = json.loads(out.read_text())["results"]
    except (OSError, ValueError, KeyError) as e:
        return f"no results file ({e})"
    st = res.get("stats", {})
    got = len(res.get("results", []))
    if got != n or st.get("errors"):
        return f"{got} results of {n}, {st.get('errors')} errors"
    return None


def write_inspect(work: Path, requests: list[dict]) -> tuple[Path, Path]:
    d = work / "inspect"
    d.mkdir(parents=True, exist_ok=True)
    task = d / "replay_task.py"
    task.write_text(INSPECT_TASK)
    reqs = d / "requests.jsonl"
    reqs.write_text("".join(json.dumps(b, ensure_ascii=False) + "\n" for b in requests))
    return task, reqs


def inspect_cmd(venv: Path, task: Path, concurrency: int, log_dir: Path) -> list[str]:
    return [
        str(venv / "bin" / "inspect"),
        "eval",
        f"{task}@replay",
        "--model",
        "openai-api/replay/aip-builtin",
        "--max-connections",
        str(concurrency),
        "--display",
        "none",
        "--log-dir",
        str(log_dir),
    ]


def inspect_env(url: str, reqs: Path) -> dict[str, str]:
    return {**peer_env(), "REPLAY_BASE_URL": url, "REPLAY_API_KEY": "none", "AIP_REPLAY_REQUESTS": str(reqs)}


def timed(cmd: list[str], env: dict, cwd: Path) -> dict:
    """Run ``cmd`` to its exit: wall seconds, CPU seconds of it and its children, exit code, output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "rc": out.returncode,
        "stdout": out.stdout,
        "stderr": out.stderr,
        "load1": load,
    }


class Recorder:
    """An endpoint in this process that answers as the builtin SUT (same latency) and keeps each body."""

    def __init__(self, profile: dict, latency_ms: float):
        from aiohttp import web

        from aip_assets.connections import BuiltinProfile
        from aip_assets.models.builtin import handle_chat, start_app_in_thread

        prof = BuiltinProfile.model_validate(profile)
        self.bodies: list[dict] = []

        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            self.bodies.append(body)
            await asyncio.sleep(latency_ms / 1000)
            return web.json_response(handle_chat(body, prof))

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        self.url, self.stop = start_app_in_thread(app)

    def compare(self, requests: list[dict]) -> dict:
        want = Counter(canonical(b) for b in requests)
        got = Counter(canonical(b) for b in self.bodies)
        missing, extra = want - got, got - want
        example = None
        if extra:
            example = {"sent": next(iter(extra))[:600], "nearest wanted": next(iter(missing), "")[:600]}
        return {
            "sent": len(self.bodies),
            "same": not missing and not extra,
            "missing": sum(missing.values()),
            "extra": sum(extra.values()),
            "example": example,
        }


def versions(pf_dir: Path, venv: Path) -> dict[str, str]:
    v: dict[str, str] = {}
    try:
        v["promptfoo"] = json.loads((pf_dir / "node_modules" / "promptfoo" / "package.json").read_text())["version"]
        v["node"] = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    except (OSError, ValueError):
        pass
    if (venv / "bin" / "python").exists():
        code = "from importlib.metadata import version as v; print(v('inspect-ai'), v('openai'))"
        got = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True).stdout.split()
        if len(got) == 2:
            v["inspect-ai"], v["openai (Inspect's client)"] = got
    return v


def short(commit: str) -> str:
    return commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--promptfoo-dir", type=Path, default=PEERS / "promptfoo")
    ap.add_argument("--inspect-venv", type=Path, default=PEERS / "inspect-venv")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"which of {','.join(TOOLS)} to time")
    ap.add_argument("--no-verify", action="store_true", help="skip the peers' check against the recording endpoint")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--out", help="the Markdown table (JSON beside it); default benchmarks/results/peers-<commit>.md")
    args = ap.parse_args()
    tools = [t for t in args.tools.split(",") if t]
    if unknown := set(tools) - set(TOOLS):
        raise SystemExit(f"unknown tools {sorted(unknown)} (of {', '.join(TOOLS)})")
    missing = []
    if "promptfoo" in tools and not (args.promptfoo_dir / "node_modules" / ".bin" / "promptfoo").exists():
        missing.append(
            f"promptfoo is not in {args.promptfoo_dir}: {INSTALL['promptfoo'].format(dir=args.promptfoo_dir)}"
        )
    if "inspect" in tools and not (args.inspect_venv / "bin" / "inspect").exists():
        missing.append(f"Inspect AI is not in {args.inspect_venv}: {INSTALL['inspect'].format(dir=args.inspect_venv)}")
    if missing:
        raise SystemExit(
            "\n".join(missing) + "\n(or give --promptfoo-dir / --inspect-venv, or leave the tool out of --tools)"
        )
    header = run_header()
    vers = versions(args.promptfoo_dir, args.inspect_venv)
    print(f"peers: {vers}", file=sys.stderr, flush=True)
    profile = yaml.safe_load((CHECKOUT / "data" / "runs" / "demo.yaml").read_text())["sut"]["profile"]
    work = Path(tempfile.mkdtemp(prefix="aip-bench-peers-"))
    sut, sut_url = start_server(profile, args.latency_ms)
    judge, judge_url = start_server(None, args.latency_ms)
    cpu0 = {"sut": proc_cpu(sut.pid)}
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    verified: dict[str, dict] = {}
    try:
        spec_path = work / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(small_spec(sut_url, judge_url, args.concurrency), sort_keys=False))
        local_spec = work / "spec-local-judge.yaml"
        local_spec.write_text(yaml.safe_dump(small_spec(sut_url, None, args.concurrency), sort_keys=False))

        def ours(data: Path, spec: Path = spec_path) -> dict:
            ours_cmd = [sys.executable, "-m", "aip_assets.cli", "run", str(spec), "--json", "--quiet"]
            r = timed(ours_cmd, {**child_env(), "AIP_DATA_DIR": str(data)}, work)
            if r["rc"] not in (0, 1):  # 1: the demo's gate fails on purpose
                print(r["stderr"][-3000:], file=sys.stderr)
                raise SystemExit(f"aip-eval run: exit {r['rc']}")
            r["score"] = json.loads(r["stdout"])["metrics"]["llm.decision_flip"]["score"]
            return r

        # the requests: a first run of ours (not timed; it warms the file cache too)
        before = stats(sut_url).get("requests", 0)
        first = ours(work / "data-first")
        first_requests = stats(sut_url).get("requests", 0) - before
        requests = export_requests(work / "data-first")
        n = len(requests)
        print(
            f"first run: {first['wall_s']:.1f} s, {n} SUT requests journaled, {first_requests} at the SUT server "
            f"({first_requests - n} endpoint checks)",
            file=sys.stderr,
            flush=True,
        )
        pf_config = write_promptfoo(work, requests, sut_url, args.concurrency)
        task, reqs = write_inspect(work, requests)
        pf_out = work / "promptfoo" / "results.json"

        def promptfoo(url: str) -> dict:
            config = pf_config if url == sut_url else write_promptfoo(work / "verify", requests, url, args.concurrency)
            pf_out.unlink(missing_ok=True)
            r = timed(promptfoo_cmd(args.promptfoo_dir, config, args.concurrency, pf_out), promptfoo_env(work), work)
            bad = promptfoo_check(pf_out, n)
            if r["rc"] not in (0, 100) or bad:  # 100: some assertion failed (there are none)
                print(r["stdout"][-2000:], r["stderr"][-3000:], file=sys.stderr)
                raise SystemExit(f"promptfoo: exit {r['rc']}; {bad}")
            return r

        def inspect(url: str) -> dict:
            logs = work / "inspect" / "logs"
            r = timed(inspect_cmd(args.inspect_venv, task, args.concurrency, logs), inspect_env(url, reqs), work)
            if r["rc"] != 0:
                print(r["stdout"][-2000:], r["stderr"][-3000:], file=sys.stderr)
                raise SystemExit(f"inspect: exit {r['rc']}")
            return r

        peers = {"promptfoo": promptfoo, "inspect": inspect}
        # each peer once at a recording endpoint: the same requests? (also its warm-up)
        for t in tools:
            if t in OURS or args.no_verify:
                continue
            rec = Recorder(profile, args.latency_ms)
            try:
                w = peers[t](rec.url)
            finally:
                rec.stop()
            verified[t] = {**rec.compare(requests), "wall_s": w["wall_s"]}
            print(f"{t} at the recorder: {verified[t]}", file=sys.stderr, flush=True)
        for r in range(args.rounds):
            for t in tools:
                before = stats(sut_url).get("requests", 0)
                if t == "ours":  # a fresh data folder: the project's first run
                    res = ours(work / f"data-{r}")
                elif t == "ours_warm":  # the folder of the first run: a project that has run before
                    res = ours(work / "data-first")
                elif t == "ours_local_judge":  # a fresh folder, the builtin judge in the run's process
                    res = ours(work / f"data-local-{r}", local_spec)
                else:
                    res = peers[t](sut_url)
                res["sut_requests"] = stats(sut_url).get("requests", 0) - before
                for k in ("stdout", "stderr"):
                    res.pop(k)
                runs[t].append(res)
                print(
                    f"round {r + 1} {t}: {res['wall_s']:.2f} s, CPU {res['cpu_s']:.2f} s, "
                    f"{res['sut_requests']} SUT requests, load {res['load1']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
        cpu_sut = proc_cpu(sut.pid) - cpu0["sut"]
    finally:
        for p in (sut, judge):
            p.terminate()
            p.wait(10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    med = {t: statistics.median(x["wall_s"] for x in runs[t]) for t in tools}
    base, warm = med.get("ours"), med.get("ours_warm")
    summary = {
        t: {
            "wall_s": [x["wall_s"] for x in runs[t]],
            "median_s": med[t],
            "ratio_to_ours": med[t] / base if base else None,
            "ratio_to_ours_warm": med[t] / warm if warm else None,
            "cpu_s": [x["cpu_s"] for x in runs[t]],
            "sut_requests": [x["sut_requests"] for x in runs[t]],
            "load1": [x["load1"] for x in runs[t]],
            **({"scores": [x["score"] for x in runs[t]]} if t in OURS else {}),
        }
        for t in tools
    }
    # ours: its n calls and the SUT's endpoint check before the run (its sampling takes it as its own), as in its first run
    want = {t: first_requests if t in OURS else n for t in tools}
    same_count = all(c == want[t] for t in tools for c in summary[t]["sut_requests"])
    info = {
        **header,
        "benchmark": "bench_peers",
        "latency_ms": args.latency_ms,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "requests": n,
        "versions": vers,
        "verified": verified,
        "tools": summary,
        "same_request_count": same_count,
        "ours_endpoint_checks": first_requests - n,
        "sut_server_cpu_s": cpu_sut,
    }
    names = {
        "ours": "aip-eval (a new data folder)",
        "ours_warm": "aip-eval (a data folder that has runs)",
        "ours_local_judge": "aip-eval (a new data folder, the builtin judge in process: no judge requests)",
        "promptfoo": "promptfoo",
        "inspect": "Inspect AI",
    }
    lines = [
        f"# Against promptfoo and Inspect AI: {n} SUT requests at {args.latency_ms:g} ms, {args.concurrency} in flight",
        "",
        f"- date: {info['date']}; machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
        f"- aip_assets {info['version']} at commit {info['commit']}; code: {info['code']}",
        "- peers: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
        f"- {args.rounds} interleaved rounds; each tool from process start to exit; the SUT is `serve-builtin "
        f"--latency-ms {args.latency_ms:g}` (demo profile), aip-eval's judge a second one (in the row "
        "that says so, the builtin judge in aip-eval's process)",
        "",
        "| tool | wall s (each round) | median s | ÷ aip-eval (new folder) | ÷ aip-eval (folder with runs) "
        "| CPU s (median) | SUT requests |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for t in tools:
        s = summary[t]
        ratio = f"{s['ratio_to_ours']:.2f}" if s["ratio_to_ours"] else "–"
        ratio_warm = f"{s['ratio_to_ours_warm']:.2f}" if s["ratio_to_ours_warm"] else "–"
        lines.append(
            f"| {names[t]} | {', '.join(f'{w:.2f}' for w in s['wall_s'])} | {s['median_s']:.2f} | {ratio} | "
            f"{ratio_warm} | "
            f"{statistics.median(s['cpu_s']):.2f} | {', '.join(map(str, sorted(set(s['sut_requests']))))} |"
        )
    lines += [
        "",
        f"Every run sent the {n} SUT requests (aip-eval: and its {first_requests - n} endpoint checks): {same_count}. "
        + "; ".join(
            f"{names[t]}'s requests equal ours (as JSON): {v['same']} ({v['sent']} sent)" for t, v in verified.items()
        ),
        *(
            [
                "With the judge in aip-eval's own process, as the peers read their answers in theirs: "
                + "; ".join(f"{names[t]} ÷ it {med[t] / med['ours_local_judge']:.2f}" for t in tools if t not in OURS)
                + "."
            ]
            if "ours_local_judge" in tools
            else []
        ),
        f"Load average (1 min) during the rounds: {min(x for t in tools for x in summary[t]['load1']):.1f}"
        f"–{max(x for t in tools for x in summary[t]['load1']):.1f}.",
    ]
    out = Path(args.out) if args.out else RESULTS / f"peers-{short(header['commit'])}.md"
    write_results(out, lines, info)
    ok = same_count and all(v["same"] for v in verified.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
