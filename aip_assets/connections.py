"""The connection model: how a run reaches a language model (the builtin offline model or an
OpenAI-compatible endpoint), the builtin model's profile, and the checks that keep secrets out of
what is stored. A leaf module: it imports nothing of the project."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# a header name is a secret's when one of its words (split at - _ . and spaces) is one of these
_SECRET_WORD = re.compile(
    r"auth\w*|\w*token|\w*secret|cookie|set-cookie|passw(?:or)?d|credentials?|signature|"
    r"session\w*|key|apikey|api-?key|accesskey|privatekey",
    re.I,
)
# a value is one when it has an auth scheme, or a provider's token shape (their prefixes are case-sensitive
# and followed by a long random part, so "asia-southeast1" or "sk-learn-team" is no key)
_TOKEN_PREFIX = re.compile(
    r"^(?i:(?:bearer|basic|token|apikey)\s+\S{6,})|^(?:(?:sk|pk|rk)[-_][A-Za-z0-9_-]{16,}|"
    r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|"
    r"(?:AKIA|ASIA)[0-9A-Z]{16}|eyJ[\w-]{10,}\.|glpat-[\w-]{20,}|hf_[A-Za-z0-9]{30,}|"
    r"AIza[\w-]{35}|ya29\.[\w-]{20,})"
)


def secret_header_name(name: str) -> bool:
    """``Authorization``, ``X-Api-Key``, ``X-Auth-Token``, ``Cookie`` …, not ``X-Monkey-Team``."""
    return any(_SECRET_WORD.fullmatch(w) for w in re.split(r"[-_.\s]+", name) if w) or bool(
        re.fullmatch(r"(?i)x?-?api-?key", name)
    )


def looks_like_credential(value: str) -> bool:
    """A header value that looks like a secret whatever its header's name: a known token prefix
    (``Bearer …``, ``sk-…``, ``ghp_…``, a JWT…), or a long, high-entropy string with no spaces."""
    import math
    from collections import Counter

    v = value.strip()
    if _TOKEN_PREFIX.match(v) and len(v) >= 10:
        return True
    for token in v.split():
        if len(token) < 20:
            continue
        counts = Counter(token)
        entropy = -sum(n / len(token) * math.log2(n / len(token)) for n in counts.values())
        alnum = [c for c in token if c.isascii() and c.isalnum()]
        cls = [0 if c.islower() else 1 if c.isupper() else 2 for c in alnum]
        mixing = sum(a != b for a, b in zip(cls, cls[1:])) / max(1, len(cls))  # random strings switch class often
        if (entropy >= 3.5 and len(set(cls)) >= 2 and mixing >= 0.3) or re.fullmatch(r"[0-9a-fA-F]{32,}", token):
            return True
    return False


# the persona axes of the attribute catalogue (catalog/attributes.py AXES; this module imports
# nothing of the project, a test keeps the two equal)
_PERSONA_AXES = ("role", "gender", "ethnicity", "religion")


class BuiltinProfile(BaseModel):
    """Behaviour of the offline builtin SUT (known in advance, so metrics can be calibrated).

    - ``fair``: answers every persona the same way.
    - ``flip``: when the persona has attribute ``value`` (on ``axis``, optional), the decision is
      flipped with probability ``p`` (deterministic per question under the seed). Symmetric by
      default (the label is swapped: a favourable decision turns unfavourable and an unfavourable
      one favourable, so no favourable rate moves); ``directional: true`` turns only the
      favourable decision (the first label) unfavourable, at rate ``p``: a bias against ``value``.
    - ``noisy``: a fair SUT whose every answer, at rate ``noise_rate``, draws its decision at
      random (uniform over the labels) and its advice afresh, independently per persona and per
      sample: differences that no persona causes (the no-effect baseline's calibration).
    - ``terse``: personas with attribute ``terse_value`` (on ``terse_axis``, optional), or with
      every value of ``terse_intersection`` (a combination, e.g. ``{gender: woman, ethnicity:
      Black}``), get a terse, colder answer with less help.
    - ``biased``: both of the above.
    - ``inconsistent``: each fresh sample (sample index > 0) contradicts the base answer with
      probability ``contradiction_rate``: a flipped stance, a changed figure and date.
    - ``unsafe``: answers to jailbreak-wrapped prompts drop the safety posture with probability
      ``jailbreak_yield_rate``.
    - ``fragile``: reads questions through a form that undoes every perturbation of the
      robustness recipe except ``fragile_to`` (e.g. ``typos``), so its answers change on those.
    - ``intersectional``: the flip (``p``, ``directional``) only for personas that carry every
      value of ``intersection`` (e.g. ``{gender: woman, ethnicity: Black}``): a bias against one
      combination, not against either value alone (``value`` and ``axis`` stay unset).
    - ``names``: a flip (on ``value``/``axis`` or ``intersection``) that reacts to catalogue names
      only (``persona_signal: names``, its default here): a name of the group flips, an explicit
      statement of it does not.
    - ``custom``: any combination of the effects above.
    - any profile: ``persona_signal`` says which signals of a persona the SUT reads: explicit
      statements (default), catalogue names (catalog/names.py) found anywhere in the user's
      message, or both. When names are read, the base answer is keyed on the message with the name
      replaced by a placeholder, so personas that differ only by name share it.
    - any profile: ``refusal_rate`` (refuse that share of answers), only for personas with
      ``refusal_value`` when it is set (a system that refuses one group).
    """

    model_config = ConfigDict(extra="forbid")
    name: Literal[
        "fair",
        "flip",
        "terse",
        "biased",
        "inconsistent",
        "unsafe",
        "fragile",
        "noisy",
        "intersectional",
        "names",
        "custom",
    ] = Field(
        "fair",
        description="The profile (above): which effects the fields below may set; custom allows any mix. "
        "Default fair: no effect.",
    )
    value: str | None = Field(
        None,
        description="The attribute value whose decisions flip, at rate p (flip, biased), e.g. woman. None "
        "(default): no flip.",
    )
    axis: str | None = Field(
        None, description="The axis value is looked for on (e.g. gender). None (default): any axis."
    )
    intersection: dict[str, str] | None = Field(
        None,
        description="The combination whose decisions flip, at rate p (intersectional, names, custom), e.g. "
        "{gender: woman, ethnicity: Black}: two or more axis: value entries, all of which the persona must carry; "
        "value and axis then stay unset. None (default): the flip, if any, is on value.",
    )
    persona_signal: Literal["statements", "names", "both"] = Field(
        "statements",
        description="Which signals of a persona the SUT reacts to: explicit persona statements (statements, the "
        "default), catalogue names found in the user's message (names; the names profile's default), or both.",
    )
    p: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Probability (0-1) that a decision for a persona with value (or intersection) flips, deterministic per question "
        "under the seed; default 0.0.",
    )
    directional: bool = Field(
        False,
        description="flip only the favourable decision (the first label) to an "
        "unfavourable one, at rate p, instead of swapping any decision",
    )
    noise_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of answers (per persona and sample) whose "
        "decision is drawn at random and whose advice is drawn afresh",
    )
    terse_value: str | None = Field(
        None,
        description="The attribute value whose personas get a terse, colder answer with less help (terse, "
        "biased). None (default): nobody.",
    )
    terse_axis: str | None = Field(None, description="The axis terse_value is looked for on. None (default): any axis.")
    terse_intersection: dict[str, str] | None = Field(
        None,
        description="The combination whose personas get the terse answer (terse, biased, custom), e.g. "
        "{gender: woman, ethnicity: Black}: two or more axis: value entries, all of which the persona must carry "
        "(a bias against the combination, not against either value alone); terse_value and terse_axis then "
        "stay unset. None (default): the terse answer, if any, is for terse_value.",
    )
    contradiction_rate: float = Field(0.0, ge=0.0, le=1.0, description="q: share of fresh samples that contradict")
    jailbreak_yield_rate: float = Field(0.0, ge=0.0, le=1.0, description="r: share of jailbreak-wrapped prompts obeyed")
    fragile_to: Literal["typos", "casing", "punctuation", "word_order", "filler", "synonyms"] | None = Field(
        None,
        description="The perturbation type whose variants change the fragile profile's answers; it undoes every "
        "other type of the robustness recipe before answering. None (default): robust to all.",
    )
    refusal_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="share of answers that refuse (an incidental difference)"
    )
    refusal_value: str | None = Field(
        None,
        description="refuse only personas with this attribute value (at "
        "refusal_rate): a differential refusal, for calibration",
    )
    judge_garbage_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of judge answers that are not valid JSON")
    judge_position_bias: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of judge answers that favour the "
        "response shown first (decision flip: misreads the second decision; group bias: "
        "calls the second answer less helpful)",
    )
    seed: int = Field(
        0,
        description="Seed of the builtin model's draws (flips, noise, refusals, judge answers): the same seed "
        "gives the same answers. Default 0.",
    )

    @model_validator(mode="after")
    def _check_effects(self):
        if self.intersection is not None:
            if len(self.intersection) < 2:
                raise ValueError(
                    "'intersection' needs two or more axis: value entries (e.g. {gender: woman, ethnicity: Black}); "
                    "for one value use 'value'"
                )
            unknown = sorted(set(self.intersection) - set(_PERSONA_AXES))
            if unknown:
                raise ValueError(f"'intersection': unknown axis {unknown[0]!r}; known: {', '.join(_PERSONA_AXES)}")
            if self.value is not None or self.axis is not None:
                raise ValueError(
                    "'intersection' replaces 'value' and 'axis' (the flip is for the combination only); unset them"
                )
        if self.terse_intersection is not None:
            if len(self.terse_intersection) < 2:
                raise ValueError(
                    "'terse_intersection' needs two or more axis: value entries (e.g. {gender: woman, ethnicity: "
                    "Black}); for one value use 'terse_value'"
                )
            unknown = sorted(set(self.terse_intersection) - set(_PERSONA_AXES))
            if unknown:
                raise ValueError(
                    f"'terse_intersection': unknown axis {unknown[0]!r}; known: {', '.join(_PERSONA_AXES)}"
                )
            if self.terse_value is not None or self.terse_axis is not None:
                raise ValueError(
                    "'terse_intersection' replaces 'terse_value' and 'terse_axis' (the terse answer is for the "
                    "combination only); unset them"
                )
        if self.name == "names":
            if "persona_signal" not in self.model_fields_set:
                self.persona_signal = "names"
            elif self.persona_signal != "names":
                raise ValueError(
                    "profile 'names' reacts to names only: its persona_signal is 'names' (for another reading, "
                    "use profile 'flip', 'intersectional' or 'custom' with persona_signal)"
                )
        if self.name == "intersectional" and not self.intersection:
            raise ValueError(
                "profile 'intersectional' needs 'intersection' (the combination whose decisions flip, e.g. "
                "{gender: woman, ethnicity: Black})"
            )
        effects = {
            "flip": bool(self.value or self.p or self.intersection),
            "intersection": bool(self.intersection),
            "terse": bool(self.terse_value or self.terse_intersection),
            "inconsistent": bool(self.contradiction_rate),
            "unsafe": bool(self.jailbreak_yield_rate),
            "fragile": bool(self.fragile_to),
            "noisy": bool(self.noise_rate),
        }
        wanted = {
            "fair": set(),
            "flip": {"flip"},
            "terse": {"terse"},
            "biased": {"flip", "terse"},
            "inconsistent": {"inconsistent"},
            "unsafe": {"unsafe"},
            "fragile": {"fragile"},
            "noisy": {"noisy"},
            "intersectional": {"flip", "intersection"},
            "names": {"flip", "intersection"},
        }.get(self.name)
        if self.name == "noisy" and not self.noise_rate:
            raise ValueError("profile 'noisy' needs 'noise_rate' (the share of answers decided at random)")
        if self.directional and not (self.value or self.intersection):
            raise ValueError("'directional' needs 'value' (the attribute value whose favourable decisions turn)")
        if self.name == "fragile" and not self.fragile_to:
            raise ValueError("profile 'fragile' needs 'fragile_to' (the perturbation type it is not robust to)")
        if (self.name in ("flip", "biased", "names") or effects["flip"]) and not (self.value or self.intersection):
            raise ValueError("a flipping profile needs 'value' (the attribute value whose decisions flip)")
        if self.name in ("terse", "biased") and not (self.terse_value or self.terse_intersection):
            raise ValueError(
                f"profile '{self.name}' needs 'terse_value' (the attribute value that gets less effort) or "
                "'terse_intersection' (the combination that does)"
            )
        if wanted is not None:
            extra = {k for k, on in effects.items() if on} - wanted
            if extra:
                raise ValueError(
                    f"profile '{self.name}' does not have the effect(s) {sorted(extra)}; "
                    "use the matching profile name or 'custom'"
                )
        return self


class BatchSettings(BaseModel):
    """The provider's Batch API for this connection (OpenAI's ``/v1/files`` + ``/v1/batches``): a
    stage's calls go as one batch (or more, ``max_requests`` each), polled until done, at about
    half the price of live calls and without an answer within seconds (models/batch.py)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(
        False,
        description="Send each stage's calls through the Batch API (an openai connection only). Default false: "
        "live calls.",
    )
    max_requests: int = Field(50_000, ge=1, le=50_000, description="requests per batch (OpenAI's limit: 50,000)")
    poll_seconds: float = Field(30.0, gt=0, le=3600, description="seconds between looks at a batch in progress")
    completion_window: Literal["24h"] = Field("24h", description="the provider's window (OpenAI offers 24h)")
    on_failure: Literal["live", "fail"] = Field(
        "live",
        description="a request the batch failed or let expire: sent again as a live call (live), or "
        "recorded as failed with the reason (fail)",
    )


class Prices(BaseModel):
    """What the endpoint charges, for ``--dry-run``'s estimate (US dollars, or any one currency)."""

    model_config = ConfigDict(extra="forbid")
    input_per_million_tokens: float = Field(
        ge=0.0, description="Price of one million prompt tokens at live rates (required)."
    )
    output_per_million_tokens: float = Field(
        ge=0.0, description="Price of one million completion tokens at live rates (required)."
    )
    batch_discount: float = Field(
        0.5, ge=0.0, le=1.0, description="the Batch API's discount (OpenAI and Anthropic: half the price of live calls)"
    )


class Connection(BaseModel):
    """A language-model connection: the builtin offline model or any OpenAI-compatible endpoint."""

    model_config = ConfigDict(extra="forbid")
    provider: Literal["builtin", "openai"] = Field(
        "builtin",
        description="builtin (default): the offline builtin model, no network; openai: any OpenAI-compatible "
        "/chat/completions endpoint at base_url.",
    )
    base_url: str | None = Field(
        None,
        description="The endpoint's base URL, e.g. http://localhost:8000/v1 (calls go to <base_url>/chat/completions); "
        "required by openai, and it may carry no credential. None (default): builtin only.",
    )
    model: str = Field(
        "aip-builtin",
        description="The model name sent in every request body, and part of every call's cache key. Default "
        "aip-builtin.",
    )
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")
    system_prompt: str | None = Field(
        None,
        description="A system message put before the messages of every request on this connection. None "
        "(default): none.",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers (non-secret)")
    header_env: dict[str, str] = Field(
        default_factory=dict, description="header name -> env var holding its (secret) value"
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="The completion-token cap (max_tokens) sent with every request that sets none of its own. "
        "None (default): the endpoint's.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="other request parameters (top_p, seed, stop, ...)"
    )
    profile: BuiltinProfile = Field(
        default_factory=BuiltinProfile,
        description="The builtin model's profile: its known behaviour as a SUT (and as a judge); builtin only. "
        "Default: fair.",
    )
    max_connections: int = Field(
        64,
        ge=1,
        le=1024,
        description="calls in flight at this endpoint, shared by every role, metric and process on this machine",
    )
    requests_per_minute: int | None = Field(
        None,
        ge=1,
        description="request starts per minute at this endpoint, "
        "shared by every role, metric and process on this machine",
    )
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        description="prompt + completion tokens per minute at this "
        "endpoint, shared like requests_per_minute (charged before each attempt as "
        "characters / 4 + max_tokens or max_completion_tokens, settled with "
        "the answer's usage; a 429 at 0, another failure at its prompt)",
    )
    max_rate_limit_wait_seconds: float = Field(
        600.0,
        ge=0.0,
        description="a 429/503 with Retry-After is waited out without using the call's retries, "
        "up to this many seconds in total per call; then it counts as a failure",
    )
    adaptive_concurrency: bool = Field(
        True,
        description="on rate-limit answers (429, or 503 with Retry-After) halve the calls in flight, then add "
        "one back after as many successes in a row; never above the configured concurrency",
    )
    structured_output: Literal["auto", "on", "off", "json_schema", "json_object_schema", "json_object", "prompt"] = (
        Field(
            "auto",
            description="how judges are asked for their JSON verdict (response_format): auto tries, before the "
            "run, json_schema (OpenAI), json_object_schema (json_object with the schema: llama.cpp), "
            "json_object, then prompt (no response_format) and keeps the first the endpoint takes "
            "and answers in, moving on to the next form when the endpoint refuses one during the "
            "run; on = json_schema and off = prompt, never falling back; or name one form to pin it",
        )
    )
    batch: BatchSettings = Field(
        default_factory=BatchSettings, description="send this connection's calls through the provider's Batch API"
    )
    prices: Prices | None = Field(None, description="the endpoint's prices, for --dry-run's cost estimate")

    @model_validator(mode="after")
    def _check(self):
        if self.provider == "openai" and not self.base_url:
            raise ValueError("provider 'openai' needs base_url (e.g. http://localhost:8000/v1)")
        if self.batch.enabled and self.provider != "openai":
            raise ValueError(
                "batch.enabled needs an openai endpoint (a Batch API: /v1/files and /v1/batches); the "
                "builtin model answers in process (serve it with `aip-eval serve-builtin` to batch it)"
            )
        secret = [h for h in self.headers if secret_header_name(h)]
        if secret:
            raise ValueError(
                f"headers {secret} look secret: name an environment variable for them in header_env instead"
            )
        secret = [h for h, v in self.headers.items() if looks_like_credential(v)]
        if secret:  # the value is never echoed
            raise ValueError(
                f"headers {secret}: the value looks like a credential (a token prefix, or long and "
                "random); put it in an environment variable and name it in header_env instead, "
                f"e.g. header_env: {{{secret[0]}: MY_{re.sub(r'[^A-Z0-9]', '_', secret[0].upper())}}}"
            )
        if self.base_url:  # a URL is stored and printed: it may carry no credential
            from urllib.parse import parse_qsl, urlsplit

            u = urlsplit(self.base_url)
            if u.username or u.password:
                raise ValueError(
                    "base_url carries a user name or password (user:pass@host): put the credential in "
                    "an environment variable (api_key_env, or header_env for a header) instead"
                )
            bad = [k for k, v in parse_qsl(u.query) if secret_header_name(k) or looks_like_credential(v)]
            if bad:
                raise ValueError(
                    f"base_url's query parameter(s) {bad} look like a credential: send it as a header "
                    "from an environment variable (header_env) instead"
                )
        secret = [
            k
            for k, v in self.params.items()
            if secret_header_name(k) or (isinstance(v, str) and looks_like_credential(v))
        ]
        if secret:  # params go into every stored request body
            raise ValueError(
                f"params {secret} look like a credential: params are stored with every request; "
                "send it as a header from an environment variable (header_env) instead"
            )
        reserved = {"model", "messages", "temperature", "n", "stream"} & set(self.params)
        if reserved:
            raise ValueError(f"params may not set {sorted(reserved)}: the metric controls them")
        return self

    def endpoint_id(self) -> str:
        return (
            f"builtin:{self.profile.model_dump_json()}"
            if self.provider == "builtin"
            else (self.base_url or "").rstrip("/")
        )

    def foreign_fields(self) -> set[str]:
        """The fields that do not apply to this connection's provider (a shown spec leaves them out)."""
        return OPENAI_ONLY if self.provider == "builtin" else BUILTIN_ONLY

    def call_identity(self) -> tuple:
        """What a call's key takes from this connection (models/client.call_key: the endpoint and
        the request body): two connections alike in it share every call."""
        return (
            self.endpoint_id(),
            self.model,
            self.system_prompt,
            self.max_tokens,
            json.dumps(self.params, sort_keys=True, default=str),
        )


BUILTIN_ONLY = {"profile"}
OPENAI_ONLY = {
    "base_url",
    "api_key_env",
    "system_prompt",
    "headers",
    "header_env",
    "max_tokens",
    "max_connections",
    "max_rate_limit_wait_seconds",
    "structured_output",
    "batch",
    "prices",
}
