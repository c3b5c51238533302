import csv
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gym_tf.datasets import dataset_hash, load_dataset
from gym_tf.errors import DatasetError
from gym_tf.rollouts import build_messages


def test_bundled_quickstart_loads():
    problems = load_dataset("quickstart")
    assert len(problems) == 40
    assert problems[0].id == "qs-01" and problems[0].answer == "6"


def test_jsonl_alternative_field_names(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "final_answer": 2}) + "\n\n" + json.dumps({"prompt": "2+2?", "solution": "4"}) + "\n")
    problems = load_dataset(path)
    assert [(p.id, p.problem, p.answer) for p in problems] == [("0", "1+1?", "2"), ("1", "2+2?", "4")]


def test_field_mapping_and_extra_columns_kept(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "x?", "gold": "7", "level": 3}) + "\n")
    [problem] = load_dataset(path, problem_field="q", answer_field="gold")
    assert problem.answer == "7" and problem.row["level"] == 3


def test_malformed_jsonl_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:line 2: invalid JSON"):
        load_dataset(path)


def test_missing_answer_names_the_line_and_fields(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b"}\n')
    with pytest.raises(DatasetError, match=r"line 2: no answer field .*fields are \['problem'\]"):
        load_dataset(path)
    assert len(load_dataset(path, require_answer=False)) == 2


CHAT = [{"role": "system", "content": "You are the shop's assistant."},
        {"role": "user", "content": "A box holds 6 eggs. How many in 7 boxes?"},
        {"role": "assistant", "content": "42"},
        {"role": "user", "content": [{"type": "text", "text": "And in twice as many boxes?"}]}]


def test_a_chat_format_row_is_a_conversation_to_answer_and_its_turns_are_the_problem(tmp_path):
    path = tmp_path / "chat.jsonl"
    one_turn = [{"role": "user", "content": "What is 6 times 7?"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in [
        {"messages": CHAT, "answer": "84"}, {"messages": one_turn, "answer": "42"},
        {"problem": "My own text", "messages": one_turn, "answer": "42"}]))
    follow_up, single, named = load_dataset(path)
    assert follow_up.conversation == CHAT and follow_up.problem == (
        "User: A box holds 6 eggs. How many in 7 boxes?\n\nAssistant: 42\n\nUser: And in twice as many boxes?")
    assert single.problem == "What is 6 times 7?" and single.conversation == one_turn
    assert named.problem == "My own text" and named.conversation == one_turn  # a problem field still names the text
    assert load_dataset("quickstart")[0].conversation is None


def test_messages_that_end_with_the_reply_are_an_ordinary_column_beside_a_problem(tmp_path):
    """Fine-tuning data carries problem, answer and the whole chat, reply included: it loads as before, asked with the
    solve prompt; so does a CSV, whose `messages` cell is a string. A Parquet file's nulls are not sent."""
    jsonl, table = tmp_path / "sft.jsonl", tmp_path / "sft.csv"
    jsonl.write_text(json.dumps({"problem": "6 x 7?", "answer": "42", "messages": CHAT[:3]}) + "\n")
    table.write_text('problem,answer,messages\n6 x 7?,42,"[{""role"": ""user""}]"\n')
    for path in (jsonl, table):
        [problem] = load_dataset(path)
        assert problem.conversation is None and problem.problem == "6 x 7?"
        assert build_messages(problem)[0][-1] == {"role": "user", "content": "6 x 7?"}
    parquet = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "2+2?", "name": None}], "answer": "4"}]),
                   parquet)
    [problem] = load_dataset(parquet)
    assert problem.conversation == [{"role": "user", "content": "2+2?"}]
    messages, _ = build_messages(problem)
    messages[0]["content"] = "changed"  # the prompt is a copy: the dataset's row is untouched
    assert build_messages(problem)[0] == [{"role": "user", "content": "2+2?"}]


@pytest.mark.parametrize("messages, why", [
    ("hello", "must be a non-empty list"),
    ([], "must be a non-empty list"),
    ([{"role": "robot", "content": "hi"}], "message 0 must be an object whose role is one of"),
    ([{"role": "user", "content": 7}], "message 0: content must be a string"),
    (CHAT[:3], "must end with the user's turn or a tool's result"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "has no user message with text"),
])
def test_a_malformed_conversation_names_its_line_and_what_is_wrong(tmp_path, messages, why):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"problem": "ok", "answer": "1"}) + "\n" + json.dumps({"messages": messages, "answer": "1"}) + "\n")
    with pytest.raises(DatasetError, match=rf"chat.jsonl:line 2: field 'messages' {re.escape(why)}"):
        load_dataset(path)


def test_duplicate_ids_rejected(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"id": 1, "problem": "a", "answer": "1"}\n{"id": 1, "problem": "b", "answer": "2"}\n')
    with pytest.raises(DatasetError, match="line 2: duplicate id '1'"):
        load_dataset(path)


def test_csv_and_parquet(tmp_path):
    rows = [{"problem": "3*3?", "answer": "9"}, {"problem": "4*4?", "answer": "16"}]
    with (tmp_path / "d.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["problem", "answer"])
        writer.writeheader()
        writer.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        assert [p.answer for p in load_dataset(tmp_path / name)] == ["9", "16"]


def test_csv_row_with_extra_cells_names_line(tmp_path):
    (tmp_path / "d.csv").write_text("problem,answer\n1+1?,2\n2+2?,4,oops\n")
    with pytest.raises(DatasetError, match="line 3: more cells"):
        load_dataset(tmp_path / "d.csv")


def test_hf_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"question": "5-2?", "answer": "3"}]).save_to_disk(str(tmp_path / "hf"))
    [problem] = load_dataset(tmp_path / "hf")
    assert problem.problem == "5-2?" and problem.answer == "3"


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(DatasetError, match="no such dataset"):
        load_dataset(tmp_path / "nope.jsonl")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DatasetError, match="unknown dataset format"):
        load_dataset(tmp_path / "d.txt")


def test_content_hash_covers_every_column_and_the_dataset_hash_the_order(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "1+1?", "answer": "2", "level": 1}) + "\n"
                    + json.dumps({"answer": "2", "level": 1, "problem": "1+1?", "id": "x"}) + "\n")
    first, second = load_dataset(path)
    again = load_dataset(path)
    assert first.content_hash == again[0].content_hash and len(first.content_hash) == 64
    assert first.content_hash != second.content_hash  # the id column is content too
    variants = [{"problem": "1+1?", "answer": "3", "level": 1}, {"problem": "1+1?", "answer": "2", "level": 2},
                {"problem": "1+2?", "answer": "2", "level": 1}]
    for row in variants:
        path.write_text(json.dumps(row) + "\n")
        assert load_dataset(path)[0].content_hash != first.content_hash, row
    assert dataset_hash([first, second]) == dataset_hash(again) != dataset_hash([second, first])


# --- big datasets: read on demand ---------------------------------------------------------------------------------


def test_open_dataset_reads_the_same_problems_as_load_dataset(tmp_path):
    from gym_tf.datasets import LazyProblems, dataset_hash, open_dataset

    path = tmp_path / "big.jsonl"
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(200)]
    path.write_text("\n".join(json.dumps(r) for r in rows[:100]) + "\n\n" + "\n".join(json.dumps(r) for r in rows[100:]))
    lazy, whole = open_dataset(path), load_dataset(path)
    assert isinstance(lazy, LazyProblems) and len(lazy) == len(whole) == 200
    assert [lazy[i] for i in range(200)] == whole and lazy[-1] == whole[-1] and lazy[5:8] == whole[5:8]
    assert [lazy[i].row for i in (0, 150)] == [whole[i].row for i in (0, 150)]
    assert dataset_hash(lazy) == dataset_hash(whole)
    assert len(open_dataset(path, limit=7)) == 7


def test_open_dataset_names_the_bad_line_and_notices_a_changed_file(tmp_path):
    from gym_tf.datasets import open_dataset

    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a?", "answer": "1"}\n{"problem": "b?", "answer": "2"}\n{oops\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:line 3: invalid JSON"):
        open_dataset(path)
    path.write_text('{"id": "x", "problem": "a?", "answer": "1"}\n{"id": "x", "problem": "b?", "answer": "2"}\n')
    with pytest.raises(DatasetError, match=r"line 2: duplicate id 'x'"):
        open_dataset(path)
    path.write_text('{"problem": "a?", "answer": "1"}\n{"problem": "b?", "answer": "2"}\n')
    problems = open_dataset(path)
    path.write_text('{"problem": "a?", "answer": "9"}\n{"problem": "b?", "answer": "2"}\n')
    with pytest.raises(DatasetError, match="changed while the run reads it"):
        problems[0]


def test_a_second_opening_reads_the_saved_index_until_the_file_changes(tmp_path, monkeypatch):
    from gym_tf.datasets import LazyProblems, dataset_hash, open_dataset

    path, index_dir = tmp_path / "big.jsonl", tmp_path / "index"
    path.write_text("".join(json.dumps({"problem": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(50)))
    first = open_dataset(path, index_dir=index_dir)
    parsed = []
    real_parse = LazyProblems._parse
    monkeypatch.setattr(LazyProblems, "_parse", lambda self, *a: parsed.append(a[2]) or real_parse(self, *a))
    again = open_dataset(path, index_dir=index_dir)  # a resume: no row is read to open it
    assert parsed == [] and dataset_hash(again) == dataset_hash(first) and again[49] == first[49]
    assert parsed == [49, 49]  # only the two reads just made
    assert len(open_dataset(path, limit=5, index_dir=index_dir)) == 5  # another limit is another index

    path.write_text(path.read_text() + json.dumps({"problem": "new?", "answer": "1"}) + "\n")
    parsed.clear()
    grown = open_dataset(path, index_dir=index_dir)  # a changed stat: scanned again
    assert len(grown) == 51 and len(parsed) == 51 and grown[50].problem == "new?"

    stat = path.stat()
    for broken in ['{"stat": [1, 2', json.dumps({"stat": [stat.st_size, stat.st_mtime_ns, stat.st_ino],
                                                 "offsets": [0, 1], "fingerprints": [["a", "b"]]})]:
        for index in index_dir.glob("*.json"):
            index.write_text(broken)  # a torn or inconsistent index is scanned over, never trusted
        parsed.clear()
        reopened = open_dataset(path, index_dir=index_dir)
        assert dataset_hash(reopened) == dataset_hash(grown) and len(reopened) == 51 and len(parsed) == 51
    assert not list(index_dir.glob("*.partial"))


def test_a_row_changed_behind_an_unchanged_stat_is_caught_when_read(tmp_path):
    import os

    from gym_tf.datasets import open_dataset

    path, index_dir = tmp_path / "d.jsonl", tmp_path / "index"
    path.write_text('{"problem": "a?", "answer": "1"}\n{"problem": "b?", "answer": "2"}\n')
    open_dataset(path, index_dir=index_dir)
    stat = path.stat()
    path.write_text('{"problem": "a?", "answer": "9"}\n{"problem": "b?", "answer": "2"}\n')  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old modification time put back
    problems = open_dataset(path, index_dir=index_dir)
    assert problems[1].answer == "2"
    with pytest.raises(DatasetError, match="changed while the run reads it"):
        problems[0]
