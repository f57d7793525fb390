"""The builtin model outside the pipeline: `aip-eval answer` (a dataset's sut_response filled in)
and `aip-eval serve-builtin` (served as an OpenAI-compatible endpoint)."""

from __future__ import annotations

import json
import os

from ..errors import AipError


def cmd_answer(args) -> int:
    from ..recipes import answer_file

    profile = _profile(args.profile)
    try:
        n = answer_file(args.dataset, args.out, profile)
    except ValueError as e:
        raise AipError(str(e)) from None
    print(f"answered {n} rows with the builtin model ({profile.name}) -> {args.out}")
    return 0


def _profile(text: str | None):
    """A builtin profile from --profile JSON; a malformed one is the user's input error."""
    from pydantic import ValidationError

    from ..errors import format_validation_error
    from ..runspec import BuiltinProfile

    if not text:
        return BuiltinProfile()
    try:
        return BuiltinProfile.model_validate(json.loads(text))
    except json.JSONDecodeError as e:
        raise AipError(f"--profile: not valid JSON: {e}") from None
    except ValidationError as e:
        raise AipError("--profile: " + format_validation_error(e).replace("\n", "; ")) from None


def cmd_serve(args) -> int:
    from ..metrics import base as _metrics  # noqa: F401  (registers the metrics' builtin judge answers)
    from ..models.builtin import BuiltinServer

    profile = _profile(args.profile)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    server = BuiltinServer(
        profile,
        latency_ms=args.latency_ms,
        fail_rate=args.fail_rate,
        fail_substring=args.fail_substring,
        api_key=api_key,
        batch_seconds=args.batch_seconds,
        batch_expire_rate=args.batch_expire_rate,
    )
    print(
        f"builtin model ({profile.name}) serving OpenAI-compatible API at http://{args.host}:{args.port}/v1", flush=True
    )
    server.serve_forever(args.host, args.port)
    return 0
