"""The report server: `aip-eval report --serve` serves the reports folder over HTTP, read-only (a
browser will not open a file:// link from a web page such as the Dagster UI); in a lake, a report
the folder lacks is served from the lake."""

from __future__ import annotations

import os
from collections.abc import Callable
from html import escape
from pathlib import Path

from .. import warehouse as wh
from ..errors import AipError
from ..warehouse import lake
from . import queries
from .build import default_out, stored_report


def report_port() -> int:
    """The port `aip-eval report --serve` listens on: ``AIP_REPORT_PORT`` (settings.py: 8112 unless set)."""
    from ..settings import current

    return current().report_port


def report_url(report: Path, port: int | None = None) -> str:
    """Where `aip-eval report --serve` serves ``report`` (a browser will not open a file:// link
    from a web page such as the Dagster UI)."""
    from urllib.parse import quote

    return f"http://127.0.0.1:{port or report_port()}/{quote(report.name)}"


class _NotServed(Exception):
    """A request the report server answers with a 404: ``missing`` when nothing is there (a lake
    may have it), else something that is there but is not served (a link, a FIFO, a device)."""

    def __init__(self, missing: bool = False):
        self.missing = missing


def _request_parts(raw: str) -> tuple[list[str], bool]:
    """The names below the reports folder a request's path asks for, and whether it asks for a
    folder (a trailing slash). Only plain names: a path with an empty name (``//``), ``.``, ``..``,
    a backslash or a NUL, once decoded, asks for nothing."""
    from urllib.parse import unquote

    path = raw.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        raise _NotServed()
    names = unquote(path[1:]).split("/")
    folder = names[-1] == ""
    if folder:
        names.pop()
    if any(n in ("", ".", "..") or "\\" in n or "\0" in n for n in names):
        raise _NotServed()
    return names, folder


def _open_below(root: str, names: list[str]) -> tuple[int, os.stat_result]:
    """A regular file or a folder below ``root``, opened one name at a time from the folder above
    it, never following a symbolic link (O_NOFOLLOW) and never opening anything but a folder or a
    regular file of one link (a FIFO would hang the server; a hard link may be a file from
    elsewhere): (its descriptor, its stat). Raises _NotServed."""
    import stat

    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(root, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    try:
        for i, name in enumerate(names):
            try:
                seen = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise _NotServed(missing=True) from None
            last = i == len(names) - 1
            if not (stat.S_ISDIR(seen.st_mode) or (last and stat.S_ISREG(seen.st_mode) and seen.st_nlink == 1)):
                raise _NotServed()
            opened = os.open(name, flags | (0 if stat.S_ISREG(seen.st_mode) else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = opened
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino, stat.S_IFMT(now.st_mode)) != (
                seen.st_dev,
                seen.st_ino,
                stat.S_IFMT(seen.st_mode),
            ):
                raise _NotServed()  # replaced between the look and the open
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def _runs_table(warehouse: Path, served: set[str]) -> str:
    """The root page's table of runs from the warehouse (a short read-only connection): each run,
    the newest first, its report's link (a report in ``served``, the folder's files, or the lake's),
    and each metric's overall score and gate. An empty string when there is no warehouse or it
    cannot be read: the page then lists the files alone."""
    from urllib.parse import quote

    if not lake.enabled() and not warehouse.is_file():
        return ""
    try:
        records = queries.run_list(warehouse)
    except Exception:  # noqa: BLE001 - a warehouse being written, an old schema: the files are listed
        return ""
    runs: dict[str, list[dict]] = {}
    for r in records:
        runs.setdefault(r["run_id"], []).append(r)
    if not runs:
        return ""
    body = []
    for run_id, ms in runs.items():
        name = default_out(run_id, warehouse).name
        link = (
            f'<a href="{quote(name)}">{escape(run_id)}</a>'
            if name in served or lake.enabled()
            else f"{escape(run_id)} <small>(no report: <code>aip-eval report {escape(run_id)}</code>)</small>"
        )
        scored = [m for m in ms if m["metric"] is not None]
        gates = [m["passed"] for m in scored if m["passed"] is not None]
        gate = "no gate" if not gates else "passed" if all(gates) else "failed"
        cells = "".join(
            f'<li data-metric="{escape(m["metric"])}">{escape(m["metric"])}: '
            + ("n/a" if m["score"] is None else f"{m['score']:.3f}")
            + ("" if m["threshold"] is None else f" (threshold {m['threshold']:.3f})")
            + ("" if m["passed"] is None else " passed" if m["passed"] else " <b>failed</b>")
            + "</li>"
            for m in scored
        )
        created = "" if ms[0]["created_at"] is None else escape(str(ms[0]["created_at"])[:19])
        body.append(
            f'<tr data-run-id="{escape(run_id)}" data-gate="{gate}"><td>{link}</td><td>{created}</td>'
            f"<td>{gate}</td><td><ul>{cells}</ul></td></tr>\n"
        )
    return (
        "<h2>Runs</h2>\n<table>\n<tr><th>run</th><th>registered</th><th>gate</th><th>metrics: overall score</th></tr>\n"
        + "".join(body)
        + "</table>\n"
        + _comparisons(warehouse, served)
        + "<h2>Files</h2>\n"
    )


def _comparisons(warehouse: Path, served: set[str]) -> str:
    """The root page's list of comparison pages (``aip-eval compare A B --html``) in the folder:
    each pair of runs whose page is one of ``served``, the newest comparison first."""
    from urllib.parse import quote

    from .comparison import default_out as comparison_out

    try:
        records = queries.comparison_list(warehouse)
    except Exception:  # noqa: BLE001 - an old schema: the files are listed
        return ""
    items = []
    for r in records:
        name = comparison_out(r["run_a"], r["run_b"], warehouse).name
        if name not in served:
            continue
        items.append(
            f'<li data-run-a="{escape(r["run_a"])}" data-run-b="{escape(r["run_b"])}"><a href="{quote(name)}">'
            f"{escape(r['run_b'])} vs {escape(r['run_a'])}</a> ({r['significant']} significant change"
            f"{'' if r['significant'] == 1 else 's'}; compared {escape(str(r['created_at'])[:19])})</li>\n"
        )
    return "<h2>Comparisons</h2>\n<ul>\n" + "".join(items) + "</ul>\n" if items else ""


def _listing(fd: int, shown_as: str, runs: Callable[[set[str]], str] | None = None) -> bytes:
    """A folder's page: its folders and the regular files it would serve (no link, nothing else);
    ``runs`` (the root's) puts the table of runs above them, given the names of the files."""
    import stat
    from urllib.parse import quote

    names = []
    with os.scandir(fd) as entries:
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                names.append(e.name + "/")
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                names.append(e.name)
    items = "".join(f'<li><a href="{quote(n)}">{escape(n)}</a></li>\n' for n in sorted(names, key=str.lower))
    title = escape(f"Reports: {shown_as}")
    table = runs(set(names)) if runs else ""
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
        f"<body><h1>{title}</h1>\n{table}<ul>\n{items}</ul></body></html>\n"
    ).encode()


def serve_reports(folder: Path, host: str = "127.0.0.1", port: int | None = None, warehouse: Path | None = None):
    """An HTTP server for the reports folder (read-only: files and a listing, nothing else); in a
    lake, a report the folder lacks is served from the lake (written by a worker elsewhere). Its
    root lists the runs of ``warehouse`` (default: this process's) with their scores and gates,
    newest first, above the files.
    It serves only regular files and folders inside the folder: a request whose path names a
    symbolic link at any step, a FIFO, a device or a socket, a file with another hard link, or
    that spells ``..``, ``//`` or a backslash in any encoding, is a 404 that names nothing.
    Returns the server; ``serve_forever()`` runs it, ``shutdown()`` stops it."""
    import io
    from http import HTTPStatus
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    folder.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(folder)
    db = Path(warehouse).resolve() if warehouse is not None else wh.default_path()

    class Reports(SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
            pass

        def _answer(self, body: bytes, ctype: str, modified: float | None = None) -> io.BytesIO:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if modified is not None:
                self.send_header("Last-Modified", self.date_time_string(modified))
            self.end_headers()
            return io.BytesIO(body)

        def _from_lake(self, name: str):
            """The lake's copy of a report the folder lacks (a file object, or None: answered)."""
            try:
                html = stored_report(name)
            except AipError:  # no lake made yet: no such report
                html = None
            except Exception as e:  # noqa: BLE001 - said to the browser, the server goes on
                self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, f"the lake cannot be read: {type(e).__name__}")
                return None
            if html is None:
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            return self._answer(html.encode("utf-8"), "text/html; charset=utf-8")

        def send_head(self):  # what GET and HEAD answer (the stdlib's, without following links)
            import stat

            names: list[str] = []
            want_folder = False
            try:
                names, want_folder = _request_parts(self.path)
                fd, st = _open_below(root, names)
            except _NotServed as e:
                if e.missing and names == ["favicon.ico"]:  # what a browser asks of every page: no icon
                    self.send_response(HTTPStatus.NO_CONTENT)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if e.missing and lake.enabled() and len(names) == 1 and names[0].endswith(".html") and not want_folder:
                    return self._from_lake(names[0])
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            except (OSError, ValueError):  # a name the system will not take, a link, a folder's file
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            if stat.S_ISREG(st.st_mode):
                if want_folder:
                    os.close(fd)
                    self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                    return None
                f = os.fdopen(fd, "rb")
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", self.guess_type(names[-1]))
                self.send_header("Content-Length", str(st.st_size))
                self.send_header("Last-Modified", self.date_time_string(st.st_mtime))
                self.end_headers()
                return f
            try:  # a folder
                if not want_folder:
                    self.send_response(HTTPStatus.MOVED_PERMANENTLY)
                    self.send_header("Location", self.path.split("?", 1)[0].split("#", 1)[0] + "/")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                runs = (lambda served: _runs_table(db, served)) if not names else None
                return self._answer(
                    _listing(fd, "/" + "".join(n + "/" for n in names), runs), "text/html; charset=utf-8"
                )
            finally:
                os.close(fd)

    return ThreadingHTTPServer((host, report_port() if port is None else port), Reports)


def serve_beside(parent: int, host: str, port: int) -> None:
    """The report server's process beside the UI: it serves the reports folder (as `report
    --serve`) until its parent, the UI, ends. Says ``ready <port>`` or ``busy <why>`` on stdout
    once, then nothing."""
    import signal
    import sys
    import threading
    import time

    # a SIGTERM ends it at once, whatever disposition or mask it inherited and whatever its threads
    # hold (it only serves files): the UI's end, a test's terminate(), a service manager
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    try:
        server = serve_reports(default_out("x").parent, host, port)
    except OSError as e:  # the port is taken (a `report --serve` already running?)
        print(f"busy {e.strerror or e}", flush=True)
        return
    print(f"ready {server.server_address[1]}", flush=True)
    sys.stdout.close()

    def watch() -> None:  # the parent gone (the UI ended, however): stop serving
        while os.getppid() == parent:
            time.sleep(1)
        server.shutdown()

    threading.Thread(target=watch, daemon=True).start()
    try:
        server.serve_forever()
    finally:
        server.server_close()
