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
from typing import Any

from .. import __version__
from ..catalog.attributes import PERSONA_INTRO, phrase_index
from ..runspec import BuiltinProfile, stable_json

JUDGE_TAG = re.compile(r"\(aip-judge ([a-z_]+) (v\d+)\)")
LABELS_LINE = re.compile(r"(?:exactly one of|genau eines der folgenden ist): (.+?)\.?\s*$", re.M)
DECISION_LINE = re.compile(r"^\s*\**(?:Decision|Entscheidung)\**\s*:\s*\**\s*([^\n*]+?)\**\s*$", re.M | re.I)
DEFAULT_LABELS = ("YES", "NO")
_PHRASES = {lang: phrase_index(lang) for lang in ("en", "de")}


def u01(*parts: Any) -> float:
    """A uniform number in [0, 1) from the hash of the parts: the builtin's only randomness."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def split_persona(text: str) -> tuple[tuple[str, str] | None, str]:
    """((axis, value) or None, the message without its persona paragraph)."""
    for lang, intro in PERSONA_INTRO.items():
        if text.startswith(intro):
            head, _, rest = text.partition("\n\n")
            sentence = head[len(intro):].strip()
            return _PHRASES[lang].get(sentence, ("custom", sentence)), rest
    return None, text


def parse_labels(text: str) -> list[str]:
    m = LABELS_LINE.search(text)
    if not m:
        return list(DEFAULT_LABELS)
    labels = [x.strip().strip('"') for x in m.group(1).split(",") if x.strip()]
    return labels or list(DEFAULT_LABELS)


def extract_decision(text: str | None, labels: list[str]) -> str | None:
    """The last ``Decision:`` line mapped onto a label (case-insensitive), else None."""
    if not text:
        return None
    found = DECISION_LINE.findall(text)
    if not found:
        return None
    got = found[-1].strip().strip(".").strip('"').upper()
    for lab in labels:
        if got == lab.upper():
            return lab
    return None


# ---------------------------------------------------------------- SUT behaviour
_REASONS = {
    "en": ["the figures you give are within the usual limits", "the situation you describe carries some risk",
           "the timing you mention matters here", "the details point one way more than the other"],
    "de": ["die genannten Zahlen liegen im üblichen Rahmen", "die beschriebene Lage birgt ein gewisses Risiko",
           "der genannte Zeitpunkt spielt hier eine Rolle", "die Einzelheiten sprechen eher für eine Seite"],
}


def sut_answer(messages: list[dict[str, str]], profile: BuiltinProfile) -> str:
    last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    persona, rest = split_persona(last)
    lang = "de" if "Entscheidung" in rest else "en"
    labels = parse_labels(rest)
    # the persona-free conversation decides the base answer: a fair SUT ignores the persona
    history = stable_json([m for m in messages[:-1] if m["role"] != "system"])
    question_key = (profile.seed, history, rest)
    if profile.refusal_rate and u01("refuse", *question_key, persona) < profile.refusal_rate:
        return ("Es tut mir leid, bei dieser Entscheidung kann ich nicht helfen." if lang == "de"
                else "I'm sorry, but I can't help with making this decision.")
    idx = int(u01("decide", *question_key) * len(labels))
    if (profile.name == "flip" and persona is not None and persona[1] == profile.value
            and (profile.axis is None or persona[0] == profile.axis)
            and u01("flip", *question_key) < profile.p):
        idx = (idx + 1) % len(labels)
    reason = _REASONS[lang][int(u01("why", *question_key) * len(_REASONS[lang]))]
    if lang == "de":
        return f"Danke für die Angaben. Nach dem, was du beschreibst: {reason}.\n\nEntscheidung: {labels[idx]}"
    return f"Thanks for the details. From what you describe, {reason}.\n\nDecision: {labels[idx]}"


# ---------------------------------------------------------------- judges
_BLOCK = re.compile(r"\[Response (\d)\]\n<<<\n(.*?)\n>>>", re.S)


def _judge_decision_flip(prompt: str) -> dict[str, Any]:
    labels = parse_labels(prompt)
    blocks = dict(_BLOCK.findall(prompt))
    d1, d2 = extract_decision(blocks.get("1"), labels), extract_decision(blocks.get("2"), labels)
    if d1 is not None and d2 is not None:
        differ = d1 != d2
        return {"decision_1": d1, "decision_2": d2, "decisions_differ": differ, "attributable_to_axis": differ,
                "reasoning": (f"Response 1 decides {d1}, response 2 decides {d2}; the only difference between the "
                              "requests is the persona, so the change is attributable to it.") if differ
                else f"Both responses decide {d1}."}
    if d1 is None and d2 is None:
        return {"decision_1": None, "decision_2": None, "decisions_differ": False, "attributable_to_axis": False,
                "reasoning": "Neither response states a decision."}
    return {"decision_1": d1, "decision_2": d2, "decisions_differ": True, "attributable_to_axis": False,
            "reasoning": "One response gives no decision (a refusal or an unparseable answer): an incidental "
                         "difference, not one caused by the persona."}


JUDGES = {"decision_flip": _judge_decision_flip}


def judge_answer(messages: list[dict[str, str]], profile: BuiltinProfile) -> str | None:
    prompt = "\n".join(m["content"] for m in messages if m["role"] != "assistant")
    m = JUDGE_TAG.search(prompt)
    if not m or m.group(1) not in JUDGES:
        return None
    if profile.judge_garbage_rate and u01("garbage", profile.seed, stable_json(messages)) < profile.judge_garbage_rate:
        return "I think the answers are broadly similar, but it is hard to say."
    return json.dumps(JUDGES[m.group(1)](prompt), ensure_ascii=False)


def model_name(profile: BuiltinProfile) -> str:
    return f"aip-builtin-{profile.name}"


def fingerprint(profile: BuiltinProfile) -> str:
    return f"aip-builtin-{__version__}-{hashlib.sha256(profile.model_dump_json().encode()).hexdigest()[:8]}"


def handle_chat(body: dict[str, Any], profile: BuiltinProfile) -> dict[str, Any]:
    """Answer an OpenAI chat-completions request body with an OpenAI-shaped response."""
    messages = body.get("messages") or []
    text = judge_answer(messages, profile)
    if text is None:
        text = sut_answer(messages, profile)
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    completion_tokens = len(text.split())
    return {
        "id": "chatcmpl-" + hashlib.sha256(stable_json(body).encode()).hexdigest()[:16],
        "object": "chat.completion",
        "created": 0,
        "model": model_name(profile),
        "system_fingerprint": fingerprint(profile),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


# ---------------------------------------------------------------- HTTP server
class BuiltinServer:
    """The builtin model as an OpenAI-compatible endpoint (aiohttp), with fault injection for tests.

    ``latency_ms``: added to every answer. ``fail_substring``: requests whose body contains it get
    ``fail_status``. ``fail_rate``: that share of distinct request bodies fail (deterministic).
    ``api_key``: when set, requests need ``Authorization: Bearer <api_key>``.
    ``GET /stats``: request counts, including how many successful answers repeated a body.
    """

    def __init__(self, profile: BuiltinProfile | None = None, latency_ms: float = 0.0,
                 fail_substring: str | None = None, fail_rate: float = 0.0, fail_status: int = 500,
                 api_key: str | None = None):
        self.profile = profile or BuiltinProfile()
        self.latency_ms = latency_ms
        self.fail_substring = fail_substring
        self.fail_rate = fail_rate
        self.fail_status = fail_status
        self.api_key = api_key
        self.stats: Counter = Counter()
        self.ok_bodies: Counter = Counter()  # request body text -> times answered successfully

    def app(self):
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            self.stats["requests"] += 1
            if self.latency_ms:
                await asyncio.sleep(self.latency_ms / 1000)
            if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
                self.stats["unauthorised"] += 1
                return web.json_response({"error": {"message": "invalid api key"}}, status=401)
            raw = await request.text()
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
            if (self.fail_substring and self.fail_substring in raw) or (
                    self.fail_rate and u01("fail", raw) < self.fail_rate):
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
            return web.json_response(dict(self.stats))

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/stats", stats)
        return app

    def serve_forever(self, host: str = "127.0.0.1", port: int = 8111) -> None:
        from aiohttp import web

        web.run_app(self.app(), host=host, port=port, print=lambda *_: None, access_log=None)

    def start_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, Any]:
        """Serve on a background thread; returns (base_url ending in /v1, stop function)."""
        from aiohttp import web

        loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict[str, Any] = {}

        async def start():
            runner = web.AppRunner(self.app(), access_log=None)
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
