import json

import pandas as pd
import pytest

from aip_assets.dataset import load_dataset
from aip_assets.errors import DatasetError

ROWS = [
    {"input_id": "a", "prompt": "Should I apply?", "task_type": "single_turn_llm", "metadata": {"domain": "x"}},
    {
        "input_id": "b",
        "prompt": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Approve?"},
        ],
        "task_type": "multi_turn_llm",
    },
    {
        "input_id": "c",
        "prompt": "Per the policy, approve?",
        "task_type": "single_turn_rag",
        "context": ["Policy 1: ..."],
        "sut_response": "Yes.",
    },
]


def _check(rows):
    assert [r.input_id for r in rows] == ["a", "b", "c"]
    assert rows[1].turns[-1]["content"] == "Approve?" and len(rows[1].turns) == 3
    assert rows[2].context == ["Policy 1: ..."] and rows[2].sut_response == "Yes."
    assert rows[0].metadata == {"domain": "x"}


def test_reads_jsonl_csv_parquet(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in ROWS))
    _check(load_dataset(p))
    flat = [
        {
            **r,
            "prompt": r["prompt"] if isinstance(r["prompt"], str) else json.dumps(r["prompt"]),
            "context": json.dumps(r["context"]) if r.get("context") else None,
            "metadata": json.dumps(r["metadata"]) if r.get("metadata") else None,
        }
        for r in ROWS
    ]
    pd.DataFrame(flat).to_csv(tmp_path / "d.csv", index=False)
    _check(load_dataset(tmp_path / "d.csv"))
    pd.DataFrame(flat).to_parquet(tmp_path / "d.parquet")
    _check(load_dataset(tmp_path / "d.parquet"))


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (
            lambda rs: [{k: v for k, v in r.items() if k != "task_type"} for r in rs],
            "missing required column(s) ['task_type']",
        ),
        (lambda rs: rs + [{**rs[0]}], "row 4 (input_id 'a'): field 'input_id': duplicate of row 1"),
        (
            lambda rs: [{**rs[0], "task_type": "chat"}] + rs[1:],
            "row 1 (input_id 'a'): field 'task_type': must be one of",
        ),
        (lambda rs: [{**rs[0], "colour": "red"}] + rs[1:], "unknown column(s) ['colour']"),
        (
            lambda rs: rs[:2] + [{**rs[2], "context": None}],
            "row 3 (input_id 'c'): field 'context': task_type single_turn_rag needs",
        ),
        (
            lambda rs: [rs[0], {**rs[1], "prompt": rs[1]["prompt"][:2]}, rs[2]],
            "field 'prompt': the last turn must be a user turn",
        ),
        (lambda rs: [{**rs[0], "prompt": "  "}] + rs[1:], "row 1 (input_id 'a'): field 'prompt': is empty"),
        # blank in every script: zero-width characters, NBSP, the ideographic space
        (
            lambda rs: [{**rs[0], "prompt": "\u200b\u00a0\u3000\ufeff"}] + rs[1:],
            "row 1 (input_id 'a'): field 'prompt': is empty",
        ),
        (
            lambda rs: [rs[0], {**rs[1], "prompt": [{"role": "user", "content": "\u2060\u200d\n"}]}, rs[2]],
            "field 'prompt': turn 1: content is empty",
        ),
        (
            lambda rs: [{**rs[0], "prompt": rs[1]["prompt"]}] + rs[1:],
            "row 1 (input_id 'a'): field 'prompt': task_type single_turn_llm takes a single prompt, got 3 turns",
        ),
        (
            lambda rs: [rs[0], {**rs[1], "prompt": [{"role": "tool", "content": "x"}, rs[1]["prompt"][-1]]}, rs[2]],
            "row 2 (input_id 'b'): field 'prompt': turn 1: role must be one of system, user, assistant (got 'tool')",
        ),
        (
            lambda rs: [rs[0], {**rs[1], "prompt": [{"role": "user", "content": "x", "name": "n"}]}, rs[2]],
            "field 'prompt': turn 1 must be an object with exactly 'role' and 'content'",
        ),
        (
            lambda rs: [rs[0], {**rs[1], "prompt": [{"role": "user", "content": " "}]}, rs[2]],
            "field 'prompt': turn 1: content is empty",
        ),
        (lambda rs: [rs[0], {**rs[1], "prompt": []}, rs[2]], "field 'prompt': turn list is empty"),
        (
            lambda rs: [rs[0], {**rs[1], "prompt": "one string"}, rs[2]],
            "field 'prompt': task_type multi_turn_llm needs a list of {role, content} turns",
        ),
        (
            lambda rs: [{**rs[0], "metadata": ["not", "an", "object"]}] + rs[1:],
            "row 1 (input_id 'a'): field 'metadata': must be a JSON object",
        ),
        (lambda rs: [{**rs[0], "metadata": "plain text"}] + rs[1:], "field 'metadata': must be a JSON object"),
        (
            lambda rs: rs[:2] + [{**rs[2], "context": [1, 2]}],
            "row 3 (input_id 'c'): field 'context': must be text or a list",
        ),
        (lambda rs: rs[:2] + [{**rs[2], "sut_response": 42}], "field 'sut_response': must be text (got int)"),
        (lambda rs: [{**rs[0], "input_id": ""}] + rs[1:], "row 1 (input_id ''): field 'input_id': is empty"),
        (lambda rs: [{**rs[0], "prompt": 7}] + rs[1:], "field 'prompt': must be text or a list of turns (got int)"),
    ],
)
def test_bad_input_names_file_row_and_field(tmp_path, mutate, needle):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in mutate([dict(r) for r in ROWS])))
    with pytest.raises(DatasetError) as e:
        load_dataset(p)
    assert needle in str(e.value) and "bad.jsonl" in str(e.value)


def test_unreadable_and_unsupported(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DatasetError, match="unsupported file type"):
        load_dataset(tmp_path / "x.txt")
    (tmp_path / "x.jsonl").write_text('{"input_id": "a"\n')
    with pytest.raises(DatasetError, match=r"x.jsonl: row 1 \(line 1\): not valid JSON"):
        load_dataset(tmp_path / "x.jsonl")


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    rows = [
        {"input_id": "a", "prompt": "", "task_type": "x"},
        {"input_id": "a", "prompt": "q", "task_type": "single_turn_llm"},
        {"input_id": "b", "prompt": "q", "task_type": "single_turn_llm", "metadata": [1]},
    ]
    p = tmp_path / "many.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(DatasetError) as e:
        load_dataset(p)
    msg = str(e.value)
    assert "row 1 (input_id 'a'): field 'task_type'" in msg and "row 1 (input_id 'a'): field 'prompt': is empty" in msg
    assert "row 3 (input_id 'b'): field 'metadata'" in msg
    # a row that failed is not "seen": the second 'a' is not a duplicate of an invalid row
    assert "duplicate" not in msg


def test_csv_structured_cells_and_numeric_ids(tmp_path):
    p = tmp_path / "d.csv"
    pd.DataFrame(
        [
            {
                "input_id": 7,
                "prompt": "q",
                "task_type": "single_turn_rag",
                "context": "one passage",
                "metadata": '{"k": 1}',
            }
        ]
    ).to_csv(p, index=False)
    [row] = load_dataset(p)
    assert row.input_id == "7" and row.context == ["one passage"] and row.metadata == {"k": 1}


def test_single_turn_takes_a_list_of_one_user_turn_and_long_error_lists_are_cut(tmp_path):
    p = tmp_path / "one.jsonl"
    p.write_text(
        json.dumps({"input_id": "a", "prompt": [{"role": "user", "content": "q?"}], "task_type": "single_turn_llm"})
    )
    assert load_dataset(p)[0].turns == [{"role": "user", "content": "q?"}]
    from aip_assets.dataset import MAX_ERRORS_SHOWN

    for n, more in ((MAX_ERRORS_SHOWN, None), (MAX_ERRORS_SHOWN + 3, "... and 3 more")):
        p.write_text(
            "\n".join(json.dumps({"input_id": f"r{i}", "prompt": "", "task_type": "single_turn_llm"}) for i in range(n))
        )
        with pytest.raises(DatasetError) as e:
            load_dataset(p)
        lines = str(e.value).splitlines()
        assert len(lines) == 1 + MAX_ERRORS_SHOWN + (1 if more else 0)
        assert (lines[-1] == more) if more else "more" not in str(e.value)
