#!/usr/bin/env python3
r"""Self-contained mutation-testing harness (standard library only; runs pytest as a subprocess).

Targets are ``path/to/file.py[:name,Class.method,...]`` (paths relative to --root); each target
has its own pytest selection (test files, node ids, ``-k EXPR`` ...), so a mutant only runs the
tests relevant to it. Mutants are generated with ``ast`` (+ ``tokenize`` for exact positions) and
applied one at a time, as a minimal text edit, to the file under --root; the original bytes are
restored after every mutant (and on exit / Ctrl-C / SIGTERM).

Usage
-----
  python mutate.py --root /tmp/mut \
      --target aip_assets/stats.py --tests "aip_assets_tests/test_stats.py -k 'not coverage'" \
      --target aip_assets/gate.py:decide,coverage --tests "aip_assets_tests/test_formulas.py"

  python mutate.py --root /tmp/mut --config targets.json        # [{"target": ..., "tests": ...}, ...]
  python mutate.py ... --list                                   # print the mutants, run nothing
  python mutate.py ... --max-per-target 40                      # evenly spaced sample per target
  python mutate.py ... --jobs 2                                 # 2 mutants at once (2nd in a copy under --workdir)
  python mutate.py ... --skip-done old.json                     # resume / complete a sampled run
  python mutate.py ... --survivors-of old.json                  # re-check survivors with another selection
  python mutate.py ... --out /tmp/aip_mutation/report           # report.json + report.md

``--tests`` is split with shlex. The tests run as
``sys.executable -m pytest -x -q -p no:cacheprovider <selection>`` with cwd = --root and
PYTHONPATH = --root (prepended), so the copy under --root is what gets imported (checked before
running). Per mutant timeout: max(--min-timeout, --timeout-factor x the clean run's time); a mutant that
times out is re-run once with twice that (a loaded machine must not turn survivors into kills).
A mutant is *killed* when pytest exits non-zero (a failing test, or an error) or times out, and
*survives* when the selection passes. Mutants that do not compile are dropped ("invalid").

By default the tests the clean run passed are re-run fastest first (node ids ordered by the clean
run's junit timings; --order file keeps pytest's order), so ``-x`` stops at the cheapest kill.

Mutation operators
------------------
  cmp     < <=, > >=, == !=  swapped to their neighbour (< -> <=, <= -> <, > -> >=, >= -> >, == <-> !=)
  arith   + <-> -, * <-> /  (binary and augmented assignment; skipped when an operand is a string)
  num     0 -> 1, 1 -> 0, n -> n+1 (ints); 0.0 -> 1.0, 1.0 -> 0.0, x -> x+0.1 (|x| >= 0.1), x -> 2x (smaller)
  bool    True <-> False
  boolop  and <-> or (every operator of one chain)
  not     ``not x`` -> ``x``
  minmax  min( <-> max(
  return  ``return <expr>`` -> ``return None`` (expr not already None)
  neg     ``-x`` -> ``x`` (unary minus removed)
Lines carrying ``# pragma: no mutate`` are skipped, as are f-string internals, annotations and
docstrings.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# mutant generation


@dataclass
class Edit:
    start: tuple[int, int]  # (line 1-based, col 0-based, in characters) inclusive
    end: tuple[int, int]  # exclusive
    text: str


@dataclass
class Mutant:
    id: str
    file: str
    line: int
    op: str
    description: str
    scope: str
    edits: list[Edit]
    original_line: str = ""
    mutated_line: str = ""


CMP_SWAP = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
}
ARITH_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*")}


def _num_mutation(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return 1 if v == 0 else 0 if v == 1 else v + 1
    if isinstance(v, float):
        if v == 0.0:
            return 1.0
        if v == 1.0:
            return 0.0
        if abs(v) >= 0.1:
            return round(v + 0.1, 12)
        return v * 2
    return None


def _num_repr(v) -> str:
    if isinstance(v, float):
        r = repr(v)
        return r if ("e" in r or "." in r or "inf" in r or "nan" in r) else r + ".0"
    return repr(v)


class _Tokens:
    """The file's tokens with (line, col) positions, for locating operators exactly."""

    def __init__(self, source: str):
        self.toks = [
            t
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type
            not in (
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.COMMENT,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENCODING,
                tokenize.ENDMARKER,
            )
        ]

    def between(self, start: tuple[int, int], end: tuple[int, int]):
        return [t for t in self.toks if t.start >= start and t.end <= end]

    def first_at(self, pos: tuple[int, int]):
        for t in self.toks:
            if t.start >= pos:
                return t
        return None

    def next_after(self, tok):
        for t in self.toks:
            if t.start >= tok.end:
                return t
        return None


def _start(n: ast.AST) -> tuple[int, int]:
    return (n.lineno, n.col_offset)


def _end(n: ast.AST) -> tuple[int, int]:
    return (n.end_lineno, n.end_col_offset)


def _byte_to_char_cols(source_lines: list[str]):
    """ast col offsets are UTF-8 byte offsets; convert to character offsets per line."""

    def conv(pos: tuple[int, int]) -> tuple[int, int]:
        line, col = pos
        text = source_lines[line - 1]
        return (line, len(text.encode("utf-8")[:col].decode("utf-8", errors="ignore")))

    return conv


def _qualnames(tree: ast.Module):
    """(qualified name, node) for every function and class, nested names joined with dots."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}{child.name}"
                out.append((q, child))
                visit(child, q + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _excluded_nodes(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: f-string internals, annotations, docstrings."""
    skip: set[int] = set()

    def mark(n):
        for x in ast.walk(n):
            skip.add(id(x))

    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            mark(n)
        elif isinstance(n, ast.arg) and n.annotation is not None:
            mark(n.annotation)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if n.returns is not None:
                mark(n.returns)
        elif isinstance(n, ast.AnnAssign):
            mark(n.annotation)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                mark(first)
    return skip


def _is_str(n: ast.AST) -> bool:
    return isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)))


def generate_mutants(root: Path, target: str) -> list[Mutant]:
    rel, _, names = target.partition(":")
    path = root / rel
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    toks = _Tokens(source)
    conv = _byte_to_char_cols([ln.rstrip("\r\n") for ln in lines] + [""])
    skip = _excluded_nodes(tree)

    # scopes: (name, first line, last line) to mutate
    defs = _qualnames(tree)
    if names:
        wanted = [s.strip() for s in names.split(",") if s.strip()]
        by_name = dict(defs)
        scopes = []
        for w in wanted:
            if w not in by_name:
                raise SystemExit(f"{rel}: no function or class {w!r} (have: {', '.join(q for q, _ in defs)})")
            n = by_name[w]
            scopes.append((w, n.lineno, n.end_lineno))
    else:
        scopes = [("<module>", 1, len(lines))]

    def scope_of(line: int) -> str | None:
        hits = [s for s in scopes if s[1] <= line <= s[2]]
        if not hits:
            return None
        if hits[0][0] == "<module>":  # name the innermost def for readability
            inner = [(q, n) for q, n in defs if n.lineno <= line <= n.end_lineno]
            return inner[-1][0] if inner else "<module>"
        return hits[0][0]

    raw: list[tuple[int, str, str, list[Edit]]] = []  # (line, op, description, edits)

    def add(node, op, desc, edits):
        if id(node) in skip:
            return
        line = edits[0].start[0]
        if "pragma: no mutate" in lines[line - 1]:
            return
        if scope_of(line) is None:
            return
        raw.append((line, op, desc, edits))

    def tok_edit(tok, text):
        return Edit(tok.start, tok.end, text)

    def op_token_between(a_end, b_start, symbols):
        for t in toks.between(conv(a_end), conv(b_start)):
            if t.type == tokenize.OP and t.string in symbols:
                return t
            if t.type == tokenize.NAME and t.string in symbols:
                return t
        return None

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                if type(op) in CMP_SWAP:
                    a, b = CMP_SWAP[type(op)]
                    t = op_token_between(_end(left), _start(right), {a})
                    if t is not None:
                        add(node, "cmp", f"{a} -> {b}", [tok_edit(t, b)])
                left = right
        elif isinstance(node, ast.BinOp) and type(node.op) in ARITH_SWAP:
            if _is_str(node.left) or _is_str(node.right):
                continue
            a, b = ARITH_SWAP[type(node.op)]
            t = op_token_between(_end(node.left), _start(node.right), {a})
            if t is not None:
                add(node, "arith", f"{a} -> {b}", [tok_edit(t, b)])
        elif isinstance(node, ast.AugAssign) and type(node.op) in ARITH_SWAP:
            if _is_str(node.value):
                continue
            a, b = ARITH_SWAP[type(node.op)]
            t = op_token_between(_end(node.target), _start(node.value), {a + "="})
            if t is not None:
                add(node, "arith", f"{a}= -> {b}=", [tok_edit(t, b + "=")])
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                s, e = conv(_start(node)), conv(_end(node))
                add(node, "bool", f"{v} -> {not v}", [Edit(s, e, str(not v))])
            elif isinstance(v, (int, float)):
                new = _num_mutation(v)
                if new is not None:
                    s, e = conv(_start(node)), conv(_end(node))
                    add(node, "num", f"{_num_repr(v)} -> {_num_repr(new)}", [Edit(s, e, _num_repr(new))])
        elif isinstance(node, ast.BoolOp):
            a, b = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            edits = []
            for x, y in zip(node.values, node.values[1:]):
                t = op_token_between(_end(x), _start(y), {a})
                if t is None:
                    edits = []
                    break
                edits.append(tok_edit(t, b))
            if edits:
                add(node, "boolop", f"{a} -> {b}", edits)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            t = toks.first_at(conv(_start(node)))
            want = "not" if isinstance(node.op, ast.Not) else "-"
            if t is not None and t.string == want:
                nxt = toks.next_after(t)
                if nxt is not None:  # delete the operator token and the space after it
                    add(node, "not" if want == "not" else "neg", f"remove {want}", [Edit(t.start, nxt.start, "")])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            a = node.func.id
            b = "max" if a == "min" else "min"
            add(node, "minmax", f"{a} -> {b}", [Edit(conv(_start(node.func)), conv(_end(node.func)), b)])
        elif isinstance(node, ast.Return) and node.value is not None:
            if isinstance(node.value, ast.Constant) and node.value.value is None:
                continue
            add(
                node,
                "return",
                "return ... -> return None",
                [Edit(conv(_start(node.value)), conv(_end(node.value)), "None")],
            )

    raw.sort(key=lambda r: (r[0], r[3][0].start[1], r[1], r[2]))
    mutants = []
    for i, (line, op, desc, edits) in enumerate(raw):
        m = Mutant(
            id=f"{rel}#{i + 1}", file=rel, line=line, op=op, description=desc, scope=scope_of(line) or "", edits=edits
        )
        new_source = apply_edits(source, edits)
        m.original_line = _span_text(source, edits)
        m.mutated_line = _span_text(new_source, edits, shifted=True, old_source=source)
        mutants.append(m)
    return mutants


def apply_edits(source: str, edits: list[Edit]) -> str:
    lines = source.splitlines(keepends=True)
    # apply right-to-left so earlier positions stay valid
    for e in sorted(edits, key=lambda e: e.start, reverse=True):
        (l1, c1), (l2, c2) = e.start, e.end
        before = lines[l1 - 1][:c1]
        after = lines[l2 - 1][c2:]
        lines[l1 - 1 : l2] = [before + e.text + after]
    return "".join(lines)


def _span_text(source: str, edits: list[Edit], shifted: bool = False, old_source: str | None = None) -> str:
    """The (stripped) source lines the edits touch, joined with ' / ' when several."""
    first = min(e.start[0] for e in edits)
    last = max(e.end[0] for e in edits)
    lines = source.splitlines()
    if shifted and old_source is not None:
        # multi-line spans collapse into one line when an edit spans lines
        removed = sum(e.end[0] - e.start[0] for e in edits)
        last -= removed
    return " / ".join(ln.strip() for ln in lines[first - 1 : last])


# ---------------------------------------------------------------------------------------------
# running


@dataclass
class Target:
    spec: str
    tests: list[str]
    timeout: float = 0.0
    clean_seconds: float = 0.0
    ordered: list[str] = field(default_factory=list)  # node ids, fastest first (empty: use tests)


class FileGuard:
    """Holds a file's original bytes; restores them (and drops stale bytecode) on demand or exit."""

    def __init__(self, path: Path):
        self.path = path
        self.original = path.read_bytes()

    def write(self, text: str) -> None:
        self._drop_pyc()
        self.path.write_text(text, encoding="utf-8")
        st = self.path.stat()  # make sure mtime moves even within the same second
        os.utime(self.path, ns=(st.st_atime_ns, max(st.st_mtime_ns, time.time_ns()) + 1_000_000_000))

    def restore(self) -> None:
        if self.path.read_bytes() != self.original:
            self.path.write_bytes(self.original)
            st = self.path.stat()
            os.utime(self.path, ns=(st.st_atime_ns, time.time_ns() + 2_000_000_000))
        self._drop_pyc()

    def _drop_pyc(self) -> None:
        cache = self.path.parent / "__pycache__"
        if cache.is_dir():
            for p in cache.glob(self.path.stem + ".*.pyc"):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass


_RUNNING: set = set()
_STOP = threading.Event()


class Stopped(Exception):
    pass


def run_pytest(
    root: Path,
    args: list[str],
    timeout: float,
    extra_env: dict[str, str] | None = None,
    junit: Path | None = None,
    basetemp: Path | None = None,
) -> tuple[str, int | None, float, str]:
    """-> (outcome, returncode, seconds, output tail). outcome: passed | failed | timeout."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    if basetemp is not None:
        cmd += [f"--basetemp={basetemp}"]
    if junit is not None:
        cmd += [f"--junitxml={junit}"]
    cmd += args
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra_env or {})
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        if _STOP.is_set():
            raise Stopped
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        _RUNNING.add(proc)
        try:
            rc = proc.wait(timeout=timeout)
            outcome = "passed" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, outcome = None, "timeout"
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            _RUNNING.discard(proc)
        if _STOP.is_set():
            raise Stopped
        secs = time.monotonic() - t0
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
    return outcome, rc, secs, text


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group of a pytest run this harness started (its own session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def first_failure(output: str) -> str:
    for ln in output.splitlines():
        if ln.startswith(("FAILED ", "ERROR ")):
            return ln[:300]
    for ln in output.splitlines():
        if "Error" in ln or "error" in ln:
            return ln.strip()[:300]
    return output.strip().splitlines()[-1][:300] if output.strip() else ""


def junit_nodeids(junit: Path, root: Path) -> list[tuple[str, float]]:
    """(node id, seconds) of the passed tests of a junit xml, in file order."""
    out = []
    for tc in ET.parse(junit).getroot().iter("testcase"):
        if any(child.tag in ("skipped", "failure", "error") for child in tc):
            continue
        classname, name = tc.get("classname", ""), tc.get("name", "")
        parts = classname.split(".")
        # the module path is the longest prefix that is a file
        nodeid = None
        for i in range(len(parts), 0, -1):
            f = root.joinpath(*parts[:i]).with_suffix(".py")
            if f.is_file():
                nodeid = "::".join([f.relative_to(root).as_posix(), *parts[i:], name])
                break
        if nodeid is None:
            return []  # could not map: fall back to the selection as given
        out.append((nodeid, float(tc.get("time", "0") or 0)))
    return out


def verify_import(root: Path, module: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run(
        [sys.executable, "-c", f"import {module}; print({module}.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    where = r.stdout.strip()
    if r.returncode != 0 or not Path(where).resolve().is_relative_to(root.resolve()):
        raise SystemExit(
            f"importing {module} with PYTHONPATH={root} gives {where or r.stderr.strip()!r}, not a file under {root}"
        )
    return where


def even_sample(items: list, k: int) -> list:
    if k <= 0 or k >= len(items):
        return list(items)
    return [items[int(i * len(items) / k)] for i in range(k)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, type=Path, help="the copy of the project to mutate (cwd of pytest)")
    ap.add_argument("--target", action="append", default=[], help="path.py[:name,Class.method]; pair with --tests")
    ap.add_argument("--tests", action="append", default=[], help="pytest selection for the preceding --target")
    ap.add_argument("--config", type=Path, help='JSON list of {"target": ..., "tests": "..." or [...]}')
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(tempfile.gettempdir()) / "aip_mutation" / "report",
        help="report prefix (.json, .md)",
    )
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--max-per-target", type=int, default=0, help="evenly spaced sample of at most N per target")
    ap.add_argument("--timeout-factor", type=float, default=3.0)
    ap.add_argument("--min-timeout", type=float, default=60.0)
    ap.add_argument("--order", choices=("fast-first", "file"), default="fast-first")
    ap.add_argument(
        "--no-confirm-timeouts",
        dest="confirm_timeouts",
        action="store_false",
        help="count a first timeout as a kill (default: re-run it once with twice the timeout)",
    )
    ap.add_argument(
        "--import-check",
        default=None,
        help="module that must import from --root (default: the first target's top-level package)",
    )
    ap.add_argument("--only", action="append", default=[], help="run only mutants with these ids")
    ap.add_argument(
        "--skip-done",
        type=Path,
        action="append",
        default=[],
        help="skip mutants already run in this report (resume, or complete a sampled run)",
    )
    ap.add_argument(
        "--survivors-of",
        type=Path,
        action="append",
        default=[],
        help="run only the survivors recorded in this report (re-check them with another selection)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="parallel mutants; workers > 1 run in copies of --root "
        "under --workdir (default 1: only --root is touched)",
    )
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "aip_mutation" / "work")
    a = ap.parse_args(argv)
    root = a.root.resolve()

    targets: list[Target] = []
    if a.config:
        for item in json.loads(a.config.read_text()):
            t = item["tests"]
            targets.append(Target(item["target"], shlex.split(t) if isinstance(t, str) else list(t)))
    if len(a.target) != len(a.tests):
        ap.error("give one --tests per --target")
    targets += [Target(t, shlex.split(s)) for t, s in zip(a.target, a.tests)]
    if not targets:
        ap.error("no targets")

    plan: list[tuple[Target, list[Mutant], int]] = []
    for t in targets:
        ms = generate_mutants(root, t.spec)
        total = len(ms)
        if a.only or a.survivors_of:
            keep = set(a.only)
            for rp in a.survivors_of:
                for rt in json.loads(rp.read_text())["targets"]:
                    keep |= {
                        m["id"]
                        for m in rt.get("mutants", [])
                        if m["status"] == "survived" and rt["target"].split(":")[0] == t.spec.split(":")[0]
                    }
            ms = [m for m in ms if m.id in keep]
        done_ids = set()
        for rp in a.skip_done:
            for rt in json.loads(rp.read_text())["targets"]:
                done_ids |= {m["id"] for m in rt.get("mutants", []) if m["status"] != "invalid"}
        ms = [m for m in ms if m.id not in done_ids]
        ms = even_sample(ms, a.max_per_target)
        plan.append((t, ms, total))
    if a.list:
        for t, ms, total in plan:
            print(f"## {t.spec}  ({len(ms)} of {total} mutants)  tests: {shlex.join(t.tests)}")
            for m in ms:
                print(
                    f"  {m.id:40s} {m.file}:{m.line:<4d} {m.op:7s} {m.description:28s} | {m.original_line}"
                    f"  ==>  {m.mutated_line}"
                )
        return 0

    module = a.import_check or targets[0].spec.split(":")[0].split("/")[0]
    if module.endswith(".py"):
        module = module[:-3]
    workers = [root]
    for k in range(1, max(1, a.jobs)):
        w = (a.workdir / f"w{k}").resolve()
        if w.exists():
            shutil.rmtree(w)
        shutil.copytree(root, w, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(w)],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        workers.append(w)
    a.workdir.mkdir(parents=True, exist_ok=True)  # pytest's --basetemp needs its parent (also with --jobs 1)
    basetemps = {w: (a.workdir / f"basetemp{k}").resolve() for k, w in enumerate(workers)}
    for w in workers:
        print(f"import check: {module} -> {verify_import(w, module)}", flush=True)

    a.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "root": str(root),
        "python": sys.executable,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "settings": {
            "timeout_factor": a.timeout_factor,
            "min_timeout": a.min_timeout,
            "max_per_target": a.max_per_target,
            "order": a.order,
        },
        "targets": [],
    }
    guards: dict[Path, FileGuard] = {}

    def restore_all(*_):
        for g in guards.values():
            g.restore()

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    no_bytecode = {"PYTHONDONTWRITEBYTECODE": "1"}
    try:
        for t, ms, total in plan:
            rel = t.spec.split(":")[0]
            path = root / rel
            guard = guards.setdefault(path, FileGuard(path))
            guard.restore()
            with tempfile.TemporaryDirectory() as td:
                junit = Path(td) / "clean.xml"
                outcome, rc, secs, text = run_pytest(root, t.tests, timeout=3600, junit=junit, basetemp=basetemps[root])
                if outcome != "passed":
                    print(
                        f"!! clean run of {t.spec} did not pass ({outcome}, rc={rc}); skipping target\n" + text[-3000:],
                        flush=True,
                    )
                    report["targets"].append(
                        {"target": t.spec, "tests": t.tests, "error": "clean run failed", "output_tail": text[-3000:]}
                    )
                    continue
                timings = junit_nodeids(junit, root) if junit.exists() else []
            t.clean_seconds = secs
            t.timeout = max(a.min_timeout, a.timeout_factor * secs)
            if a.order == "fast-first" and timings:
                t.ordered = [n for n, _ in sorted(timings, key=lambda x: x[1])]
            args = t.ordered or t.tests
            print(
                f"== {t.spec}: {len(ms)} of {total} mutants; clean run {secs:.1f}s "
                f"({len(timings)} tests); timeout {t.timeout:.0f}s",
                flush=True,
            )
            source = guard.original.decode("utf-8")
            t_start = time.monotonic()
            free: queue.Queue[Path] = queue.Queue()
            for w in workers:
                free.put(w)
            done = [0]
            lock = threading.Lock()

            def one(m: Mutant) -> dict | None:
                if _STOP.is_set():
                    return None
                new = apply_edits(source, m.edits)
                try:
                    compile(new, str(path), "exec")
                except SyntaxError as e:
                    return {**_mdict(m), "status": "invalid", "detail": str(e)}
                w = free.get()
                try:
                    if _STOP.is_set():
                        return None
                    g = guards.setdefault(w / rel, FileGuard(w / rel))
                    g.write(new)
                    try:
                        wargs = args if w == root else [x.replace(str(root), str(w)) for x in args]
                        outcome, rc, s, text = run_pytest(
                            w, wargs, timeout=t.timeout, extra_env=no_bytecode, basetemp=basetemps[w]
                        )
                        if outcome == "timeout" and a.confirm_timeouts:
                            # a loaded machine can make a surviving mutant look hung: retry once, longer
                            outcome, rc, s2, text = run_pytest(
                                w, wargs, timeout=2 * t.timeout, extra_env=no_bytecode, basetemp=basetemps[w]
                            )
                            s += s2
                    finally:
                        g.restore()
                finally:
                    free.put(w)
                status = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[outcome]
                detail = "" if outcome != "failed" else first_failure(text)
                if outcome == "failed" and rc in (2, 3, 4, 5):
                    detail = f"pytest rc={rc}: {detail}"
                mark = {"survived": "SURVIVED", "killed": "killed", "timeout": "TIMEOUT"}[status]
                with lock:
                    done[0] += 1
                    print(
                        f"  [{done[0]}/{len(ms)}] {m.file}:{m.line} {m.description:26s} {mark:8s} {s:6.1f}s  "
                        f"{m.mutated_line[:90]}",
                        flush=True,
                    )
                return {**_mdict(m), "status": status, "returncode": rc, "seconds": round(s, 2), "detail": detail}

            results = []
            with ThreadPoolExecutor(max_workers=len(workers)) as ex:
                futs = [ex.submit(one, m) for m in ms]
                try:
                    for f in futs:
                        try:
                            r = f.result()
                        except Stopped:
                            r = None
                        if r is not None:
                            results.append(r)
                except KeyboardInterrupt:
                    _STOP.set()
                    for f in futs:
                        f.cancel()
                    for p in list(_RUNNING):
                        _kill_group(p)
                    results += [
                        f.result()
                        for f in futs
                        if f.done()
                        and not f.cancelled()
                        and f.exception() is None
                        and f.result() is not None
                        and f.result() not in results
                    ]
                    report["targets"].append(
                        {"target": t.spec, "tests": t.tests, "partial": True, **_summary(results), "mutants": results}
                    )
                    raise
            wall = time.monotonic() - t_start
            summ = _summary(results)
            report["targets"].append(
                {
                    "target": t.spec,
                    "tests": t.tests,
                    "mutants_generated": total,
                    "mutants_run": len(ms),
                    "sampled": len(ms) < total,
                    "clean_seconds": round(t.clean_seconds, 2),
                    "timeout": round(t.timeout, 1),
                    "wall_seconds": round(wall, 1),
                    **summ,
                    "mutants": results,
                }
            )
            _write_reports(a.out, report)
            print(f"   -> {summ}  wall {wall:.0f}s", flush=True)
    except KeyboardInterrupt:
        _STOP.set()
        for p in list(_RUNNING):
            _kill_group(p)
        print("interrupted; restoring files", flush=True)
        report["interrupted"] = True
    finally:
        restore_all()
        report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        _write_reports(a.out, report)
    print(f"report: {a.out}.json, {a.out}.md")
    return 0


def _mdict(m: Mutant) -> dict:
    d = asdict(m)
    d["edits"] = [{"start": e["start"], "end": e["end"], "text": e["text"]} for e in d["edits"]]
    return d


def _summary(results: list[dict]) -> dict:
    c = {k: sum(r["status"] == k for r in results) for k in ("killed", "timeout", "survived", "invalid")}
    tried = c["killed"] + c["timeout"] + c["survived"]
    c["tried"] = tried
    c["score"] = round((c["killed"] + c["timeout"]) / tried, 3) if tried else None
    return c


def _write_reports(out: Path, report: dict) -> None:
    Path(str(out) + ".json").write_text(json.dumps(report, indent=1))
    rows = [
        "# Mutation report",
        "",
        f"root `{report['root']}`, started {report['started']}",
        "",
        "| target | generated | tried | killed | timeout | survived | invalid | score | clean s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in report["targets"]:
        if "error" in t:
            rows.append(f"| `{t['target']}` | error: {t['error']} |||||||||")
            continue
        g = lambda k: t.get(k, "")  # noqa: E731
        rows.append(
            f"| `{t['target']}`{' (partial)' if t.get('partial') else ''} | {g('mutants_generated')} | "
            f"{g('tried')} | {g('killed')} | {g('timeout')} | {g('survived')} | {g('invalid')} | {g('score')} | "
            f"{g('clean_seconds')} | {g('wall_seconds')} |"
        )
    rows += ["", "## Survivors", "", "| id | file:line | scope | op | original | mutant |", "|---|---|---|---|---|---|"]
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    for t in report["targets"]:
        for m in t.get("mutants", []):
            if m["status"] == "survived":
                rows.append(
                    f"| {m['id']} | {m['file']}:{m['line']} | {m['scope']} | {m['description']} | "
                    f"`{esc(m['original_line'])}` | `{esc(m['mutated_line'])}` |"
                )
    Path(str(out) + ".md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    sys.exit(main())
