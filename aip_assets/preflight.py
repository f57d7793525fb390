"""The checks before a run writes anything, and the structured-output forms its LLM judges take.

``preflight``: every endpoint answers (and the shared-state database and the lake, when
configured), and each LLM judge's structured-output form is found or checked; ``examine``: the
judge exam of a new run, after it. ``stage_endpoint_check``: the same endpoint check at a stage's
start, retried as its calls are (``check_policy``), which the run's first sampling stage in the
process that checked the run skips (``checked_before_the_run``). The forms chosen are recorded in the run's
journal (``record_forms``), where every stage finds them; ``structured_summary`` says which form
each judge endpoint uses and how it came to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import warehouse as wh
from .handover import Handover
from .judge_exam import Exam, examined, run_exam
from .metrics import check_policy, get_metric
from .metrics.base import StageContext
from .metrics.judging import panel_role
from .models.endpoint_check import check_endpoint
from .models.journal_pg import open_journal
from .models.providers import capabilities
from .runspec import RunSpec

logger = logging.getLogger("aip_assets")
Log = Callable[[str], None]


class Preflight(list):
    """What the endpoint check found: a line per check (the list), and ``forms``, the
    structured-output forms it chose (journal records without a run id: ``record_forms``)."""

    def __init__(self, lines: list[str], forms: list[dict[str, Any]]):
        super().__init__(lines)
        self.forms = forms


def preflight(spec: RunSpec, run_id: str | None = None, path: Path | None = None) -> Preflight:
    """Check every endpoint answers before anything is written (raises EndpointError), and the
    shared-state database and the lake when configured (``AIP_SHARED_STATE_URL``,
    ``AIP_LAKE_DATA_PATH``; raises AipError). For an LLM judge (and an audit judge) with
    ``structured_output: auto``, find the structured-output form it takes (``client.negotiate``)
    unless the run ``run_id`` (resumed) has one recorded; with a form pinned, check the endpoint
    takes it (a refusal stops the run: it would fail every judgement).
    Returns what to log, a line per check, and the forms chosen (``Preflight.forms``)."""
    from .shared_state import check_shared_state
    from .warehouse import lake

    shared = [line for line in (check_shared_state(), lake.check()) if line]  # the database first: the lake's catalog
    forms: list[dict[str, Any]] = []
    recorded = _recorded_forms(run_id, path) if run_id else []

    async def go():
        roles = [(panel_role(i), c) for i, c in enumerate(spec.panel())]
        if any(get_metric(m).calls_sut for m in spec.metrics):
            roles.insert(0, ("sut", spec.sut))
        if spec.synthesis is not None:
            roles.append(("synthesis", spec.synthesis))
        if spec.judge_audit is not None:
            roles.append(("audit", spec.judge_audit.judge))
        checked: dict[str, str] = {}  # endpoint and model -> the role it was checked for
        probed: set[str] = set()
        plan: list[tuple[str, Any, str, bool]] = []  # role, connection, endpoint and model, probe its form
        for role, conn in roles:
            key = conn.endpoint_id() + conn.model
            judging = (role == "audit" or role.startswith("judge")) and capabilities(
                conn
            ).pinned_form is None  # judge-2... too
            if key in checked and not (judging and key not in probed):
                continue
            # a judge on the SUT's own endpoint and model is not checked twice, but is probed for its form
            plan.append((role, conn, key, judging))
            checked.setdefault(key, role)
            if judging:
                probed.add(key)
        # every endpoint at once (each check mostly waits on the network); a second role of an
        # endpoint and model waits for the first's check; said, and a failure raised, in the order
        # of the roles
        first: dict[str, asyncio.Task] = {}

        async def check(role: str, conn: Any, key: str, judging: bool, found: list) -> str:
            if checked[key] == role:
                line = f"endpoint ok: {await check_endpoint(conn, role, **check_policy(spec, role))}"
            else:
                await first[key]
                line = f"endpoint ok: {role}: the {checked[key]}'s endpoint and model"
            if judging:  # its form, once the endpoint answers
                line += "; " + await _structured_check(conn, role, recorded, found)
            return line

        found: list[list[dict[str, Any]]] = [[] for _ in plan]
        tasks = [asyncio.ensure_future(check(*entry, found[i])) for i, entry in enumerate(plan)]
        for (_, _, key, _), task in zip(plan, tasks, strict=True):
            first.setdefault(key, task)
        done = await asyncio.gather(*tasks, return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                raise result
        for chosen in found:
            forms.extend(chosen)
        return [str(line) for line in done]

    return Preflight(asyncio.run(go()) + shared, forms)


def examine(
    spec: RunSpec, run_id: str, forms: list[dict[str, Any]], path: Path | None = None, log: Log = logger.info
) -> Exam:
    """The judge exam of a new run (``judge_exam``), after the endpoint check and before any SUT
    call: the forms the check chose are recorded for the run first, so the exam asks in them.
    Raises ``ExamFailed`` (exit 2) when a judge fails; nothing is then written to the warehouse
    (the exam's calls stay in the run's journal: asked again under the same run id, they are
    answered from it)."""
    if not examined(spec):
        return Exam(run_id)
    record_forms(run_id, forms, path)
    exam = run_exam(spec, run_id, path, log)
    exam.raise_if_failed()
    return exam


FRESH_S = 60.0  # how long the check before a run stands for its first sampling stage's (same process)
_CHECKED = Handover()  # run id -> when its endpoints answered the check before it (time.monotonic)


@contextmanager
def hand_over_check(run_id: str, answered_at: float) -> Iterator[None]:
    """Around ``aip-eval run``'s evaluation of the run it checked (``preflight``, which answered at
    ``answered_at``) in this process: the first of its metrics to sample takes that check as its own
    (``checked_before_the_run``). Not taken by the end (no metric sampled), it is dropped, so no
    later run of the same id in this process finds it."""
    _CHECKED.put(run_id, answered_at)
    try:
        yield
    finally:
        _CHECKED.take(run_id)


def checked_before_the_run(ctx: StageContext) -> bool:
    """Whether the SUT's endpoint check at this sampling stage's start is the check before the run,
    handed over (``hand_over_check``) and made less than ``FRESH_S`` ago: true once per run and
    process, for the first sampling stage (the metrics after it check again). The check before the
    run stopped it on any endpoint that did not answer, so asking again seconds later would only
    cost the stage a round trip before its first call."""
    answered_at = _CHECKED.take(ctx.run_id)
    if answered_at is None:
        return False
    age = time.monotonic() - answered_at
    if age >= FRESH_S:
        return False
    logger.debug(f"sampling [{ctx.run_id} × {ctx.metric}]: the SUT's endpoint answered the run's check {age:.1f}s ago")
    return True


def stage_endpoint_check(ctx: StageContext, stage: str, conn, role: str) -> None:
    """The endpoint check at a stage's start, retried as its calls are (``check_policy``). An
    endpoint that answers but cannot be used (unauthorised, misconfigured) stops the stage
    (EndpointError). One still down after the retries does not: an outage is data, so the stage
    goes on, each of its calls is tried within its own retries, and those that fail are recorded
    as failed on their rows (the gate then counts them); a warning says so, in the log and in the
    run's notes."""
    from .errors import EndpointDown

    try:
        asyncio.run(check_endpoint(conn, role, log=ctx.log, **check_policy(ctx.spec, role, [ctx.metric])))
    except EndpointDown as e:
        msg = (
            f"{stage} [{ctx.run_id} × {ctx.metric}]: {e}. The endpoint is down: the stage goes on, and its "
            f"{role} calls that fail (each tried within its retries) are recorded as failed on their rows"
        )
        logger.warning(msg)
        ctx.notes.append({"level": "warning", "code": "endpoint_down", "message": msg})


async def _structured_check(conn, role: str, recorded: list[dict[str, Any]], forms: list[dict[str, Any]]) -> str:
    """The structured-output line of a judge's endpoint check (see ``preflight``)."""
    from .errors import EndpointError
    from .models.client import negotiate
    from .models.structured import configured_form

    setting = conn.structured_output
    pinned = configured_form(setting, capabilities(conn))
    if pinned == "prompt":
        return f"structured output: prompt (structured_output: {setting})"
    if pinned is not None:
        n = await negotiate(conn, role, forms=(pinned,))
        if n.answered:
            return f"structured output: {pinned} answers (structured_output: {setting})"
        why = n.tried[0][1]
        if why.startswith("refused "):
            raise EndpointError(
                f"{role} endpoint {conn.base_url} (model {conn.model}) refuses structured-output "
                f"form {pinned} {why[len('refused ') :]}; structured_output: {setting} never moves to "
                "another form: set structured_output: auto to find one it takes, or name a form it "
                "takes (json_schema, json_object_schema, json_object, prompt)"
            )
        return f"structured output: {pinned} (structured_output: {setting}), but the probe {why}"
    mine = [e for e in recorded if e["endpoint"] == conn.endpoint_id() and e["model"] == conn.model]
    if mine:
        from .models.structured import FORMS

        form = max(reversed(mine), key=lambda e: FORMS.index(e["form"]))["form"]
        return f"structured output: {form} (recorded for this run)"
    n = await negotiate(conn, role)
    forms.append(
        {
            "endpoint": conn.endpoint_id(),
            "model": conn.model,
            "role": role,
            "form": n.form,
            "previous": None,
            "how": "preflight",
            "reason": n.describe(),
        }
    )
    return f"structured output: {n.form} ({n.describe()})"


def _recorded_forms(run_id: str, path: Path | None) -> list[dict[str, Any]]:
    """The structured-output events recorded for a run ([] with no journal yet: none is made)."""
    from .models.journal import journal_path
    from .shared_state import shared_state_url
    from .warehouse import lake

    path = Path(path) if path else wh.default_path()
    if not (shared_state_url() and lake.enabled()) and not journal_path(path).exists():
        return []
    journal = open_journal(path)
    try:
        return journal.forms(run_id)
    finally:
        journal.close()


def record_forms(run_id: str, forms: list[dict[str, Any]], path: Path | None = None) -> None:
    """Record the structured-output forms the endpoint check chose for run ``run_id`` in its
    journal, where every stage of the run (in any process, resumed or not) finds them."""
    if not forms:
        return
    journal = open_journal(Path(path) if path else wh.default_path())
    try:
        for f in forms:
            journal.record_form({**f, "run_id": run_id})
    finally:
        journal.close()


def structured_summary(spec: RunSpec, run_id: str, path: Path | None = None) -> list[dict[str, Any]]:
    """Per LLM judge endpoint of the run (judge, each judge of a panel, audit judge, synthesis model): the
    structured-output form its requests for JSON use and how it came to it (``history``: the
    journal's events, oldest first: chosen before the run, lazily, or moved to after a refusal)."""
    from .models.structured import FORMS, configured_form

    conns = [
        *((panel_role(i), c) for i, c in enumerate(spec.panel())),  # a panel's every judge
        ("audit", spec.judge_audit.judge if spec.judge_audit else None),
        ("synthesis", spec.synthesis),
    ]
    events: list[dict[str, Any]] | None = None
    out: list[dict[str, Any]] = []
    seen = set()
    for role, conn in conns:
        if conn is None or capabilities(conn).pinned_form is not None or (conn.endpoint_id(), conn.model) in seen:
            continue
        seen.add((conn.endpoint_id(), conn.model))
        row: dict[str, Any] = {
            "role": role,
            "endpoint": conn.endpoint_id(),
            "model": conn.model,
            "structured_output": conn.structured_output,
        }
        pinned = configured_form(conn.structured_output, capabilities(conn))
        if pinned is not None:
            out.append({**row, "form": pinned, "history": []})
            continue
        if events is None:
            events = _recorded_forms(run_id, path)
        mine = [e for e in events if e["endpoint"] == conn.endpoint_id() and e["model"] == conn.model]
        form = max(reversed(mine), key=lambda e: FORMS.index(e["form"]))["form"] if mine else None
        out.append(
            {
                **row,
                "form": form,
                "history": [
                    {"how": e["how"], "form": e["form"], "previous": e["previous"], "reason": e["reason"]} for e in mine
                ],
            }
        )
    return out
