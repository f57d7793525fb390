import json

import pandas as pd
import pytest

from aip_assets.dataset import load_dataset
from aip_assets.errors import DatasetError

ROWS = [
    {"input_id": "a", "prompt": "Should I apply?", "task_type": "single_turn_llm", "metadata": {"domain": "x"}},
    {"input_id": "b", "prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                 {"role": "user", "content": "Approve?"}], "task_type": "multi_turn_llm"},
    {"input_id": "c", "prompt": "Per the policy, approve?", "task_type": "single_turn_rag",
     "context": ["Policy 1: ..."], "sut_response": "Yes."},
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
    flat = [{**r, "prompt": r["prompt"] if isinstance(r["prompt"], str) else json.dumps(r["prompt"]),
             "context": json.dumps(r["context"]) if r.get("context") else None,
             "metadata": json.dumps(r["metadata"]) if r.get("metadata") else None} for r in ROWS]
    pd.DataFrame(flat).to_csv(tmp_path / "d.csv", index=False)
    _check(load_dataset(tmp_path / "d.csv"))
    pd.DataFrame(flat).to_parquet(tmp_path / "d.parquet")
    _check(load_dataset(tmp_path / "d.parquet"))


@pytest.mark.parametrize("mutate,needle", [
    (lambda rs: [{k: v for k, v in r.items() if k != "task_type"} for r in rs], "missing required column(s) ['task_type']"),
    (lambda rs: rs + [{**rs[0]}], "row 4 (input_id 'a'): field 'input_id': duplicate of row 1"),
    (lambda rs: [{**rs[0], "task_type": "chat"}] + rs[1:], "row 1 (input_id 'a'): field 'task_type': must be one of"),
    (lambda rs: [{**rs[0], "colour": "red"}] + rs[1:], "unknown column(s) ['colour']"),
    (lambda rs: rs[:2] + [{**rs[2], "context": None}], "row 3 (input_id 'c'): field 'context': task_type single_turn_rag needs"),
    (lambda rs: [rs[0], {**rs[1], "prompt": rs[1]["prompt"][:2]}, rs[2]], "field 'prompt': the last turn must be a user turn"),
    (lambda rs: [{**rs[0], "prompt": "  "}] + rs[1:], "row 1 (input_id 'a'): field 'prompt': is empty"),
])
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
