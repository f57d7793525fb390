"""The builtin server's Batch API (issue 15): OpenAI's Files and Batches endpoints, offline.

Driven over HTTP with httpx, as a provider's batch client would; time is a stepped clock, so the
batch's states are asserted without waiting."""

from __future__ import annotations

import json

import httpx
import pytest

from aip_assets.models.builtin import BuiltinServer
from aip_assets.runspec import BuiltinProfile

from .test_pipeline import FLIP


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def body(i: int) -> dict:
    return {
        "model": "m",
        "temperature": 0,
        "messages": [
            {
                "role": "user",
                "content": f"Case {i}: a loan of {1000 + 37 * i} euros, {i % 7 + 1} years of history. "
                "Should it be approved? Answer with exactly one of: YES, NO.",
            }
        ],
    }


def jsonl(lines) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def requests_file(n: int, start: int = 0) -> bytes:
    return jsonl(
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body(i)}
        for i in range(start, start + n)
    )


@pytest.fixture
def serve():
    stops = []

    def start(**opts):
        clock = Clock()
        server = BuiltinServer(BuiltinProfile.model_validate(FLIP), clock=clock, **opts)
        url, stop = server.start_in_thread()
        stops.append(stop)
        return server, httpx.Client(base_url=url, timeout=30), clock

    yield start
    for stop in stops:
        stop()


def upload(c: httpx.Client, content: bytes, purpose: str = "batch") -> httpx.Response:
    return c.post("/files", data={"purpose": purpose}, files={"file": ("requests.jsonl", content)})


def read_file(c: httpx.Client, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    r = c.get(f"/files/{file_id}/content")
    assert r.status_code == 200
    return {line["custom_id"]: line for line in map(json.loads, r.text.splitlines())}


def test_a_batch_answers_each_request_as_the_live_endpoint_does(serve):
    """Twelve requests, a quarter failing by the server's fail_rate: the batch goes validating,
    in progress (its completed count growing), finalizing, completed; its output file answers each
    request exactly as a live call of the same body is answered, and its error file holds each
    request the live endpoint fails, with the status and error body."""
    server, c, clock = serve(fail_rate=0.25, batch_seconds=100)
    f = upload(c, requests_file(12)).json()
    assert f["purpose"] == "batch" and f["bytes"] == len(requests_file(12)) and f["id"].startswith("file-")
    b = c.post(
        "/batches",
        json={
            "input_file_id": f["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"run": "r1"},
        },
    ).json()
    assert b["status"] == "validating" and b["request_counts"]["total"] == 12 and b["output_file_id"] is None
    assert b["metadata"] == {"run": "r1"}
    seen = []
    for step in (5, 40, 40, 8, 10):  # 5, 45, 85, 93, 103 s after creation
        clock.t += step
        seen.append(c.get(f"/batches/{b['id']}").json())
    assert [s["status"] for s in seen] == ["validating", "in_progress", "in_progress", "finalizing", "completed"]
    done = [s["request_counts"]["completed"] + s["request_counts"]["failed"] for s in seen]
    assert done[0] == 0 < done[1] < done[2] <= done[3] == done[4] == 12
    live = {f"c{i}": c.post("/chat/completions", json=body(i)) for i in range(12)}
    out, err = read_file(c, seen[-1]["output_file_id"]), read_file(c, seen[-1]["error_file_id"])
    ok = {k for k, r in live.items() if r.status_code == 200}
    assert set(out) == ok and set(err) == set(live) - ok and 0 < len(err) < 12
    for k in ok:
        assert out[k]["response"]["status_code"] == 200 and out[k]["response"]["body"] == live[k].json()
        assert out[k]["error"] is None
    for k in err:
        assert err[k]["response"]["status_code"] == 500 and "injected failure" in json.dumps(err[k]["response"]["body"])
    assert seen[-1]["request_counts"] == {"total": 12, "completed": len(ok), "failed": 12 - len(ok)}
    stats = httpx.get(str(c.base_url).rstrip("/").removesuffix("/v1") + "/stats").json()
    assert stats["batch_files"] == 1 and stats["batch_batches"] == 1 and stats["batch_batch_requests"] == 12
    assert stats["batch_polls"] == 5


def test_requests_that_miss_the_window_expire_and_say_so(serve):
    """expire_rate picks requests (by body) that miss the window: the batch ends `expired`, the
    others answered in its output file, each expired one in the error file with `batch_expired`.
    Sent again, the same bodies expire again. expire_first=1: the first batch expires whole, the
    next one completes."""
    server, c, clock = serve(batch_expire_rate=0.4, batch_seconds=10)
    f = upload(c, requests_file(10)).json()
    b = c.post(
        "/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    ).json()
    clock.t += 11
    b = c.get(f"/batches/{b['id']}").json()
    out, err = read_file(c, b["output_file_id"]), read_file(c, b["error_file_id"])
    assert b["status"] == "expired" and b["expired_at"] is not None and 0 < len(err) < 10
    assert set(out) | set(err) == {f"c{i}" for i in range(10)} and not set(out) & set(err)
    assert all(e["error"]["code"] == "batch_expired" and e["response"] is None for e in err.values())
    assert b["request_counts"] == {"total": 10, "completed": len(out), "failed": len(err)}
    expired = sorted(int(k[1:]) for k in err)
    again = jsonl(
        {"custom_id": f"x{i}", "method": "POST", "url": "/v1/chat/completions", "body": body(i)} for i in expired
    )
    b2 = c.post(
        "/batches",
        json={
            "input_file_id": upload(c, again).json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ).json()
    clock.t += 11
    b2 = c.get(f"/batches/{b2['id']}").json()
    assert (
        b2["status"] == "expired"
        and b2["output_file_id"] is None
        and len(read_file(c, b2["error_file_id"])) == len(expired)
    )

    server, c, clock = serve(batch_expire_first=1, batch_seconds=10)
    ids = []
    for _ in range(2):
        f = upload(c, requests_file(4)).json()
        ids.append(
            c.post(
                "/batches",
                json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            ).json()["id"]
        )
    clock.t += 11
    first, second = (c.get(f"/batches/{i}").json() for i in ids)
    assert first["status"] == "expired" and first["request_counts"] == {"total": 4, "completed": 0, "failed": 4}
    assert second["status"] == "completed" and len(read_file(c, second["output_file_id"])) == 4


def test_a_bad_input_file_fails_the_batch_naming_each_line(serve):
    """OpenAI's validation: bad lines fail the whole batch, `errors.data` naming the line and why;
    requests the service cannot take are refused with 400 or 404 naming the parameter."""
    server, c, clock = serve(batch_seconds=10)
    good = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body(1)}
    content = (
        json.dumps(good)
        + "\n"
        + "{not json\n"
        + json.dumps(good)
        + "\n"
        + json.dumps({**good, "custom_id": "b", "url": "/v1/embeddings"})
        + "\n"
        + json.dumps({**good, "custom_id": "c", "method": "GET"})
        + "\n"
        + json.dumps({"method": "POST"})
        + "\n"
    ).encode()
    b = c.post(
        "/batches",
        json={
            "input_file_id": upload(c, content).json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ).json()
    assert b["status"] == "failed" and b["failed_at"] is not None
    assert [(e["line"], e["code"]) for e in b["errors"]["data"]] == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "invalid_url"),
        (5, "invalid_method"),
        (6, "missing_required_parameter"),
    ]
    clock.t += 100
    assert c.get(f"/batches/{b['id']}").json()["status"] == "failed"  # and stays so
    fid = upload(c, requests_file(2)).json()["id"]
    for payload, status, param in [
        ({"input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h"}, 400, "endpoint"),
        (
            {"input_file_id": fid, "endpoint": "/v1/chat/completions", "completion_window": "1h"},
            400,
            "completion_window",
        ),
        (
            {"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            404,
            "input_file_id",
        ),
    ]:
        r = c.post("/batches", json=payload)
        assert r.status_code == status and r.json()["error"]["param"] == param, payload
    assert upload(c, requests_file(1), purpose="fine-tune").status_code == 400
    assert c.get("/batches/batch_nope").status_code == 404 and c.get("/files/file-nope/content").status_code == 404


def test_a_cancelled_batch_keeps_what_it_had_answered(serve):
    """Cancelled half-way: `cancelled`, its output file holding the requests answered by then, and
    it stays as it was; a batch already ended cannot be cancelled."""
    server, c, clock = serve(batch_seconds=100)
    b = c.post(
        "/batches",
        json={
            "input_file_id": upload(c, requests_file(10)).json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ).json()
    clock.t += 50  # half of the in-progress time: 5 of the 10 answered
    cancelled = c.post(f"/batches/{b['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["request_counts"]["completed"] == 5
    assert len(read_file(c, cancelled["output_file_id"])) == 5
    clock.t += 100
    assert c.get(f"/batches/{b['id']}").json()["status"] == "cancelled"
    done = c.post(
        "/batches",
        json={
            "input_file_id": upload(c, requests_file(2)).json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ).json()
    clock.t += 101
    assert c.post(f"/batches/{done['id']}/cancel").json()["status"] == "completed"


def test_the_batch_endpoints_need_the_api_key_when_the_server_does(serve):
    server, c, clock = serve(api_key="sk-batch-test")
    assert upload(c, requests_file(1)).status_code == 401
    assert c.get("/batches/batch_x").status_code == 401
    c.headers["Authorization"] = "Bearer sk-batch-test"
    assert upload(c, requests_file(1)).status_code == 200


def test_an_input_file_of_megabytes_is_taken(serve):
    """A batch of thousands of requests is megabytes: the server takes it (OpenAI: up to 200 MB;
    aiohttp's default would refuse more than 1 MiB)."""
    server, c, clock = serve(batch_seconds=1)
    content = requests_file(8000)
    assert len(content) > 2 * 1024 * 1024
    f = upload(c, content)
    assert f.status_code == 200 and f.json()["bytes"] == len(content)
