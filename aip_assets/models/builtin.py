"""The builtin model: an offline SUT and judge whose behaviour is known in advance.

It reads the prompt formats this project writes. As a SUT it answers a decision question with
reasoning and a final ``Decision: <label>`` line; profiles inject known effects (``flip``:
the decision flips for one attribute value with probability ``p``). As a judge it reads the
project's judge prompts and answers in their JSON format. Everything is a pure function of the
request and the profile (seeded hashing, no global state), so it is deterministic and gives the
same answers in-process and over HTTP (``aip-eval serve-builtin``).

Because the truth is known, it is the calibration rig: a metric that cannot recover an effect
injected here is wrong.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from .. import __version__
from ..catalog.attributes import LANGUAGES, PERSONA_INTRO, persona_attributes, phrase_index
from ..connections import BuiltinProfile, Connection
from ..hashing import stable_json, u01
from .provider import Capabilities, TransportResponse

JUDGE_TAG = re.compile(r"\(aip-judge ([a-z_]+) (v\d+)\)")
LABELS_LINE = re.compile(r"(?:exactly one of|genau eines der folgenden ist): (.+?)\.?\s*$", re.M)
DEFAULT_LABELS = ("YES", "NO")
NO_DECISION = "none"  # the judge prompt's word for an answer that states no decision
_PHRASES = {lang: phrase_index(lang) for lang in LANGUAGES}


def split_persona(text: str) -> tuple[tuple[str, str] | None, str]:
    """((axis, value) of the first persona sentence or None, the message without its persona paragraph)."""
    attrs, rest = persona_of(text)
    return (attrs[0] if attrs else None), rest


def persona_of(text: str) -> tuple[list[tuple[str, str]], str]:
    """(every catalogue attribute of the persona paragraph, the message without it)."""
    for intro in PERSONA_INTRO.values():
        if text.startswith(intro):
            head, _, rest = text.partition("\n\n")
            sentence = head[len(intro) :].strip()
            attrs = persona_attributes(sentence)
            return (attrs or [("custom", sentence)]), rest
    return [], text


def parse_labels(text: str) -> list[str]:
    m = LABELS_LINE.search(text)
    if not m:
        return list(DEFAULT_LABELS)
    labels = [x.strip().strip('"') for x in m.group(1).split(",") if x.strip()]
    return labels or list(DEFAULT_LABELS)


# ---------------------------------------------------------------- SUT behaviour
_REASONS = {
    "en": [
        "the figures you give are within the usual limits",
        "the situation you describe carries some risk",
        "the timing you mention matters here",
        "the details point one way more than the other",
    ],
    "de": [
        "die genannten Zahlen liegen im üblichen Rahmen",
        "die beschriebene Lage birgt ein gewisses Risiko",
        "der genannte Zeitpunkt spielt hier eine Rolle",
        "die Einzelheiten sprechen eher für eine Seite",
    ],
}


_ADVICE = {
    "en": [
        "Start by writing down the key facts and dates so nothing is missed.",
        "Check the official requirements first, since they decide most of this.",
        "Compare at least two options before you commit to one.",
        "Keep copies of every document you send and note when you sent it.",
        "If a deadline is involved, act on it this week rather than waiting.",
        "Ask the provider for their decision criteria in writing.",
        "Consider talking to an independent adviser; many offer a free first session.",
        "Budget for the worst case so a surprise does not derail you.",
    ],
    "de": [
        "Schreib zuerst die wichtigsten Fakten und Daten auf, damit nichts fehlt.",
        "Prüfe zuerst die offiziellen Voraussetzungen, denn sie entscheiden das meiste.",
        "Vergleiche mindestens zwei Möglichkeiten, bevor du dich festlegst.",
        "Bewahre Kopien aller Unterlagen auf und notiere, wann du sie geschickt hast.",
        "Wenn eine Frist läuft, handle diese Woche statt zu warten.",
        "Bitte den Anbieter, dir seine Entscheidungskriterien schriftlich zu geben.",
        "Sprich mit einer unabhängigen Beratung; viele bieten ein kostenloses Erstgespräch.",
        "Plane für den ungünstigsten Fall, damit dich nichts aus der Bahn wirft.",
    ],
    "fr": [
        "Commencez par noter les faits et les dates clés pour ne rien oublier.",
        "Vérifiez d'abord les conditions officielles, car elles décident de l'essentiel.",
        "Comparez au moins deux options avant de vous engager.",
        "Gardez une copie de chaque document envoyé et notez la date d'envoi.",
        "S'il y a un délai, agissez cette semaine plutôt que d'attendre.",
        "Demandez par écrit les critères de décision.",
        "Pensez à consulter un conseiller indépendant ; beaucoup offrent un premier rendez-vous gratuit.",
        "Prévoyez le pire des cas pour qu'une surprise ne vous déstabilise pas.",
    ],
}
_WARM = {
    "en": (
        "Thank you for sharing this, I'm glad to help.",
        "I hope this helps, and please feel free to ask if anything is unclear.",
    ),
    "de": (
        "Danke, dass du das teilst, ich helfe dir gern.",
        "Ich hoffe, das hilft dir, und frag gern nach, wenn etwas unklar ist.",
    ),
    "fr": (
        "Merci de partager cela, je suis ravi de vous aider.",
        "J'espère que cela vous aide, n'hésitez pas à me poser vos questions.",
    ),
}
_TERSE_CLOSER = {"en": "That is all.", "de": "Das ist alles.", "fr": "C'est tout."}


def _language_of(text: str) -> str:
    if "Entscheidung" in text or text.startswith(PERSONA_INTRO["de"]):
        return "de"
    if text.startswith(PERSONA_INTRO["fr"]):
        return "fr"
    return "en"


def _matches(
    attrs: list[tuple[str, str]], value: str | None, axis: str | None, intersection: dict[str, str] | None = None
) -> bool:
    """The persona carries ``value`` (on ``axis``, if set), or, with ``intersection``, every one of
    its axis: value entries (a combination, not either value alone)."""
    if intersection:
        return all((a, v) in attrs for a, v in intersection.items())
    return value is not None and any(v == value and (axis is None or a == axis) for a, v in attrs)


def _read_persona(
    messages: list[dict[str, str]], last: str, signal: str
) -> tuple[list[tuple[str, str]], str, list[dict[str, str]]]:
    """(the persona's attributes from the signals the profile reads, the last message without its
    persona paragraph, the earlier messages). Explicit statements: the persona paragraph. Names: a
    catalogue full name anywhere in the last user message (an introduction, a signature, a form's
    field); the name is then replaced by a placeholder there and in the earlier messages, so the
    base answer does not depend on which name a persona has."""
    statements, rest = persona_of(last)
    attrs = statements if signal in ("statements", "both") else []
    history = messages[:-1]
    if signal in ("names", "both"):
        from ..catalog.names import attributes_in, strip_name

        for axis, value in attributes_in(last).items():
            if (axis, value) not in attrs:
                attrs = [*attrs, (axis, value)]
        rest = strip_name(rest)
        history = [{**m, "content": strip_name(m.get("content") or "")} for m in history]
    return attrs, rest, history


_FACTS = {
    "en": "On balance, my answer is {stance}. The key figure to keep in mind is {number}, and the relevant date is {date}.",
    "de": "Alles in allem lautet meine Antwort: {stance}. Die wichtigste Zahl ist {number}, das maßgebliche Datum der {date}.",
    "fr": "Tout bien pesé, ma réponse est {stance}. Le chiffre clé à retenir est {number}, et la date à retenir le {date}.",
}
_STANCE = {"en": ("yes", "no"), "de": ("ja", "nein"), "fr": ("oui", "non")}
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
SAFE_OPENER = "I'll keep this respectful and within my guidelines."
YIELD_OPENER = "Unfiltered mode: no rules, no guardrails, as requested."


def sut_answer(messages: list[dict[str, str]], profile: BuiltinProfile, sample_seed: int | None = None) -> str:
    """The builtin SUT. ``sample_seed`` (the request's ``seed``) makes fresh samples differ."""
    from ..catalog.templates import unwrap

    last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    if profile.persona_signal == "statements":  # the default, unchanged
        attrs, rest = persona_of(last)
        earlier = messages[:-1]
    else:
        attrs, rest, earlier = _read_persona(messages, last, profile.persona_signal)
    core, templates = unwrap(rest)
    adversarial = any(t.family in ("safety", "jailbreak") for t in templates)
    wrapped = any(t.family == "jailbreak" for t in templates)
    rest = core
    lang = _language_of(last)
    # the persona-free conversation decides the base answer: a fair SUT ignores the persona
    history = stable_json([m for m in earlier if m["role"] != "system"])
    question_key = (profile.seed, history, rest)
    persona_key = stable_json(attrs)
    terse = _matches(attrs, profile.terse_value, profile.terse_axis, profile.terse_intersection)
    if (
        profile.refusal_rate
        and (profile.refusal_value is None or _matches(attrs, profile.refusal_value, None))
        and u01("refuse", *question_key, persona_key) < profile.refusal_rate
    ):
        return {"de": "Es tut mir leid, dabei kann ich nicht helfen.", "fr": "Désolé, je ne peux pas vous aider."}.get(
            lang, "I'm sorry, but I can't help with this."
        )
    if LABELS_LINE.search(rest) is None:  # an open question: advice, with less effort for a terse group
        from ..perturbations import canonical_tokens

        # read the question through a form that rewording, typos and noise leave unchanged
        skip = (profile.fragile_to,) if profile.fragile_to else ()
        question_key = (profile.seed, history, canonical_tokens(rest, skip=skip))
        bank = _ADVICE[lang]
        # a noisy SUT draws its advice afresh for this persona and sample (no persona causes it)
        noise = (
            (persona_key, sample_seed)
            if profile.noise_rate and u01("noise", *question_key, persona_key, sample_seed) < profile.noise_rate
            else ()
        )
        picks = sorted(range(len(bank)), key=lambda i: u01("advice", *question_key, *noise, i))[:3]
        contradict = (
            sample_seed is not None and u01("contradict", *question_key, sample_seed) < profile.contradiction_rate
        )
        stance = int(u01("stance", *question_key) * 2) ^ int(contradict)
        number = 10 + int(u01("number", *question_key) * 90) + (7 if contradict else 0)
        day = 1 + int(u01("day", *question_key) * 28)
        year = 2020 + int(u01("year", *question_key) * 6) + (1 if contradict else 0)
        facts = _FACTS[lang].format(
            stance=_STANCE[lang][stance],
            number=number,
            date=f"{day} {_MONTHS[int(u01('month', *question_key) * 12)]} {year}",
        )
        if terse:
            return f"{facts} {_TERSE_CLOSER[lang]}"
        body = f"{_WARM[lang][0]} {facts} {' '.join(bank[i] for i in picks)} {_WARM[lang][1]}"
        if adversarial:
            if wrapped and u01("yield", *question_key, sample_seed) < profile.jailbreak_yield_rate:
                return f"{YIELD_OPENER} {facts} {bank[picks[0]]} Honestly, figure the rest out yourself."
            return f"{SAFE_OPENER} {body}"
        return body
    labels = parse_labels(rest)
    idx = int(u01("decide", *question_key) * len(labels))
    if (
        profile.p
        and _matches(attrs, profile.value, profile.axis, profile.intersection)
        and u01("flip", *question_key) < profile.p
    ):
        # symmetric: the label swapped; directional: only the favourable (first) label turns
        if not profile.directional or idx == 0:
            idx = (idx + 1) % len(labels)
    if profile.noise_rate and u01("noise", *question_key, persona_key, sample_seed) < profile.noise_rate:
        idx = int(u01("noise-pick", *question_key, persona_key, sample_seed) * len(labels))
    word = "Entscheidung" if lang == "de" else "Decision"
    if terse:
        return f"{word}: {labels[idx]}"
    reasons = _REASONS["de" if lang == "de" else "en"]
    reason = reasons[int(u01("why", *question_key) * len(reasons))]
    if lang == "de":
        return f"Danke für die Angaben. Nach dem, was du beschreibst: {reason}.\n\n{word}: {labels[idx]}"
    return f"Thanks for the details. From what you describe, {reason}.\n\n{word}: {labels[idx]}"


# ---------------------------------------------------------------- judges
# a response shown to the judge: "[Response 1]\n<<<\n...\n>>>" (every metric's judge prompt)
RESPONSE_BLOCK = re.compile(r"\[Response (\d)\]\n<<<\n(.*?)\n>>>", re.S)


@dataclass(frozen=True)
class BuiltinJudge:
    """The builtin judge's answer to the prompts of one tag (``(aip-judge <tag> v<n>)`` in the prompt).

    A metric owns its answers (``Metric.builtin_judges``); this module only finds them.

    Attributes:
        answer: The verdict, as the JSON object the prompt asks for, from the prompt's text.
        favour_first: The verdict of a judge biased towards the response shown first (the
            profile's ``judge_position_bias``), from the prompt and the fair verdict; None: the
            bias leaves this tag's verdicts unchanged.
    """

    answer: Callable[[str], dict[str, Any]]
    favour_first: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None


JUDGES: dict[str, BuiltinJudge] = {}  # tag -> answers, filled from JUDGE_SOURCES as tags are met
JUDGE_SOURCES: list[Callable[[str], BuiltinJudge | None]] = []  # asked in turn for a tag not yet known


def register_judge_source(source: Callable[[str], BuiltinJudge | None]) -> None:
    """Add a place the builtin judge looks up a tag's answers in (the metric registry adds itself)."""
    if source not in JUDGE_SOURCES:
        JUDGE_SOURCES.append(source)


def builtin_judge(tag: str) -> BuiltinJudge | None:
    """The answers for a prompt tag, or None when no source knows it (the model then answers as a SUT)."""
    if tag not in JUDGES:
        for source in JUDGE_SOURCES:
            found = source(tag)
            if found is not None:
                JUDGES[tag] = found
                break
    return JUDGES.get(tag)


def judge_answer(messages: list[dict[str, str]], profile: BuiltinProfile) -> str | None:
    prompt = "\n".join(m["content"] for m in messages if m["role"] != "assistant")
    m = JUDGE_TAG.search(prompt)
    judge = builtin_judge(m.group(1)) if m else None
    if judge is None:
        return None
    if profile.judge_garbage_rate and u01("garbage", profile.seed, stable_json(messages)) < profile.judge_garbage_rate:
        return "I think the answers are broadly similar, but it is hard to say."
    verdict = judge.answer(prompt)
    if (
        profile.judge_position_bias
        and judge.favour_first is not None
        and u01("position", profile.seed, prompt) < profile.judge_position_bias
    ):
        verdict = judge.favour_first(prompt, verdict)
    return json.dumps(verdict, ensure_ascii=False)


def model_name(profile: BuiltinProfile) -> str:
    return f"aip-builtin-{profile.name}"


def fingerprint(profile: BuiltinProfile) -> str:
    return f"aip-builtin-{__version__}-{hashlib.sha256(profile.model_dump_json().encode()).hexdigest()[:8]}"


def handle_chat(body: dict[str, Any], profile: BuiltinProfile) -> dict[str, Any]:
    """Answer an OpenAI chat-completions request body with an OpenAI-shaped response."""
    messages = body.get("messages") or []
    text = '{"ok": true}' if _last_user(messages) == STRUCTURED_PROBE else judge_answer(messages, profile)
    if text is None:
        seed = body.get("seed")
        text = sut_answer(messages, profile, seed if isinstance(seed, int) else None)
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    completion_tokens = len(text.split())
    return {
        "id": "chatcmpl-" + hashlib.sha256(stable_json(body).encode()).hexdigest()[:16],
        "object": "chat.completion",
        "created": 0,
        "model": model_name(profile),
        "system_fingerprint": fingerprint(profile),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


# ---------------------------------------------------------------- HTTP server
ENDPOINT_CHECK = "Reply with OK."  # what endpoint_check.check_endpoint asks
# what client.negotiate asks, in each structured-output form (models/structured.py), to find the one
# an endpoint takes; the builtin model takes any form (it writes its JSON whatever it is sent)
STRUCTURED_PROBE = 'Reply with this JSON object and nothing else: {"ok": true}'


def _last_user(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    return next((m.get("content") for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)


def _is_endpoint_check(body: Any) -> bool:
    """The one tiny question ``endpoint_check.check_endpoint`` asks before a run."""
    msgs = body.get("messages") if isinstance(body, dict) else None
    return (
        isinstance(msgs, list)
        and bool(msgs)
        and isinstance(msgs[-1], dict)
        and msgs[-1].get("content") == ENDPOINT_CHECK
    )


class BuiltinServer:
    """The builtin model as an OpenAI-compatible endpoint (aiohttp), with fault injection for tests.

    ``latency_ms``: added to every answer. ``fail_substring``: requests whose body contains it get
    ``fail_status``. ``fail_rate``: that share of distinct request bodies fail (deterministic, by
    the body's content; never the endpoint check).
    ``api_key``: when set, requests need ``Authorization: Bearer <api_key>``.
    ``GET /stats``: request counts, including how many successful answers repeated a body, and the
    Batch API's (``batch_*``).

    OpenAI's Files and Batches API (``models/builtin_batch.py``): a batch is done ``batch_seconds``
    after it is created; the same ``fail_rate``/``fail_substring`` fail its requests;
    ``batch_expire_rate`` picks requests (by body) to miss the window, ``batch_expire_first``
    expires every request of the first that many batches; ``clock`` steps a test's time.
    """

    def __init__(
        self,
        profile: BuiltinProfile | None = None,
        latency_ms: float = 0.0,
        fail_substring: str | None = None,
        fail_rate: float = 0.0,
        fail_status: int = 500,
        api_key: str | None = None,
        batch_seconds: float = 2.0,
        batch_expire_rate: float = 0.0,
        batch_expire_first: int = 0,
        clock=None,
    ):
        import time

        from .builtin_batch import BatchService

        self.profile = profile or BuiltinProfile()
        self.latency_ms = latency_ms
        self.fail_substring = fail_substring
        self.fail_rate = fail_rate
        self.fail_status = fail_status
        self.api_key = api_key
        self.stats: Counter = Counter()
        self.ok_bodies: Counter = Counter()  # request body text -> times answered successfully
        self.batch = BatchService(
            self._answer,
            seconds=batch_seconds,
            expire_rate=batch_expire_rate,
            expire_first=batch_expire_first,
            clock=clock or time.time,
        )

    def _fails(self, raw: str, body: Any) -> bool:
        """Whether fault injection fails this request. fail_rate picks bodies by their content, not
        by how a client wrote them, and spares the endpoint check: it repeats one body, so a body
        picked would fail every run at its start."""
        return bool(
            (self.fail_substring and self.fail_substring in raw)
            or (self.fail_rate and not _is_endpoint_check(body) and u01("fail", stable_json(body)) < self.fail_rate)
        )

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A request of a batch, answered as the live endpoint answers it."""
        if self._fails(json.dumps(body), body):
            return self.fail_status, {"error": {"message": "injected failure", "type": "server_error"}}
        return 200, handle_chat(body, self.profile)

    def _guard(self, request):
        from aiohttp import web

        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            self.stats["unauthorised"] += 1
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        return None

    def app(self):
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            self.stats["requests"] += 1
            if self.latency_ms:
                await asyncio.sleep(self.latency_ms / 1000)
            if (refused := self._guard(request)) is not None:
                return refused
            raw = await request.text()
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
            if self._fails(raw, body):
                self.stats["failed"] += 1
                return web.json_response({"error": {"message": "injected failure"}}, status=self.fail_status)
            out = handle_chat(body, self.profile)
            self.stats["ok"] += 1
            self.ok_bodies[raw] += 1
            if self.ok_bodies[raw] > 1:
                self.stats["repeated_ok"] += 1
            return web.json_response(out)

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": model_name(self.profile), "object": "model"}]})

        async def stats(request: web.Request) -> web.Response:
            return web.json_response({**self.stats, **{f"batch_{k}": v for k, v in self.batch.stats.items()}})

        app = web.Application(client_max_size=200 * 1024 * 1024)  # a batch input file: OpenAI takes up to 200 MB
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/stats", stats)
        self.batch.routes(app, self._guard)
        return app

    def serve_forever(self, host: str = "127.0.0.1", port: int = 8111) -> None:
        from aiohttp import web

        web.run_app(self.app(), host=host, port=port, print=lambda *_: None, access_log=None)

    def start_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, Any]:
        """Serve on a background thread; returns (base_url ending in /v1, stop function)."""
        return start_app_in_thread(self.app(), host, port)


def start_app_in_thread(app, host: str = "127.0.0.1", port: int = 0) -> tuple[str, Any]:
    """Serve an aiohttp app on a background thread; returns (base_url ending in /v1, stop function)."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start():
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        box["runner"] = runner
        box["port"] = site._server.sockets[0].getsockname()[1]

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)

    def stop():
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return f"http://{host}:{box['port']}/v1", stop


class BuiltinProvider:
    """The builtin model in process: the same handler the HTTP server runs, no network."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        offline=True,
        structured_forms=("prompt",),
        writes=False,
        shares_connections=False,
        may_be_down=False,
        sends_text=False,
    )

    def __init__(self, conn: Connection):
        self.conn = conn

    def open(self) -> None:
        return None

    async def send(self, body: dict[str, Any], timeout: float, text: str | None = None) -> TransportResponse:
        await asyncio.sleep(0)  # let other calls interleave, as over a network
        out = handle_chat(body, self.conn.profile)
        return TransportResponse(200, out, "")

    def classify(self, e: BaseException, timeout: float) -> tuple[str, bool]:
        from .openai_compatible import describe_failure

        return describe_failure(e, timeout)

    def transient(self, status: int) -> bool:
        from .openai_compatible import TRANSIENT_STATUS

        return status in TRANSIENT_STATUS or status >= 500

    def describe(self) -> str:
        return f"builtin {json.dumps(self.conn.profile.model_dump(exclude_defaults=True), sort_keys=True)}"

    async def aclose(self) -> None:
        return None
