"""``structspec batch``: JSON Lines of requests in, a result line each out, in order."""

from __future__ import annotations

import json
import re

import pytest

from structspec.api import Result
from structspec.batch import check_defaults, read_requests, record
from structspec.cli import main
from structspec.engine import DecodeStats
from structspec.errors import GenerationError, SchemaError

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}},
          "required": ["name"]}


def test_requests_are_read_by_line_and_blank_lines_skipped():
    lines = ['{"prompt": "a", "schema": {"type": "integer"}}', "", '  ',
             '{"id": 7, "prompt": "b", "regex": "x+", "max_new_tokens": 3}']
    assert read_requests(lines) == [{"prompt": "a", "schema": {"type": "integer"}},
                                    {"id": 7, "prompt": "b", "regex": "x+", "max_new_tokens": 3}]


@pytest.mark.parametrize(("line", "message"), [
    ('{"prompt": "a", "shema": {}}', r"f\.jsonl line 2: unknown field\(s\) shema \(known: "),
    ('{"schema": {}}', r"f\.jsonl line 2: 'prompt' must be a string"),
    ('["prompt"]', r"f\.jsonl line 2: a request is a JSON object, not list"),
    ('{"prompt": "a",', r"f\.jsonl line 2: not JSON: .*column"),
])
def test_a_malformed_line_is_refused_by_its_number(line, message):
    with pytest.raises(ValueError, match=message):
        read_requests(['{"prompt": "fine"}', line], "f.jsonl")


def test_defaults_fill_what_a_line_leaves_out():
    defaults = check_defaults({"schema": {"type": "integer"}, "max_new_tokens": 9})
    lines = ['{"prompt": "a"}', '{"prompt": "b", "max_new_tokens": 3, "id": 1}']
    assert read_requests(lines, defaults=defaults) == [
        {"prompt": "a", "schema": {"type": "integer"}, "max_new_tokens": 9},
        {"prompt": "b", "schema": {"type": "integer"}, "max_new_tokens": 3, "id": 1}]


@pytest.mark.parametrize(("value", "message"), [
    ({"schema": {}, "temprature": 1}, r"d.json: unknown field\(s\) temprature"),
    ({"id": 1}, r"d.json: unknown field\(s\) id"),
    ([1], "d.json: a JSON object of Generator.run's arguments, not list"),
])
def test_bad_defaults_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        check_defaults(value, "d.json")


def test_no_request_at_all_is_refused():
    with pytest.raises(ValueError, match="f.jsonl: no requests"):
        read_requests(["", " "], "f.jsonl")


def test_records_carry_the_id_the_value_where_it_differs_and_errors_by_type():
    stats = DecodeStats(prompt_tokens=5, new_tokens=3, forward_passes=2, seconds=0.25)
    line = record(0, {"id": "x", "prompt": "p"}, Result({"a": 1}, '{"a": 1}', [1, 2, 3], stats))
    assert line == {"index": 0, "id": "x", "text": '{"a": 1}', "value": {"a": 1}, "attempts": 1,
                    "stats": {"new_tokens": 3, "forward_passes": 2, "prompt_tokens": 5,
                              "seconds": 0.25}}
    assert "value" not in record(1, {"prompt": "p"}, Result("ab", "ab", [1], stats))
    assert record(2, {"prompt": "p"}, Result(1, "1", [1], stats))["value"] == 1
    assert record(3, {"prompt": "p"}, GenerationError("out of budget", "{\"a", [1])) == {
        "index": 3, "error": {"type": "GenerationError", "message": "out of budget",
                              "text": '{"a'}}
    assert record(4, {"id": 1, "prompt": "p"}, SchemaError("bad", "/type"))["error"] == {
        "type": "SchemaError", "message": "bad (at schema /type)"}


def test_a_malformed_file_exits_2_before_the_model_loads(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b", "temprature": 1}\n')
    assert main(["batch", str(path), "--model", str(tmp_path / "no-such-model")]) == 2
    assert "r.jsonl line 2: unknown field(s) temprature" in capsys.readouterr().err
    assert main(["batch", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    path.write_text('{"prompt": "a"}\n')
    assert main(["batch", str(path), "--replicas", "0"]) == 2
    assert "--replicas must be a positive integer or 'auto'" in capsys.readouterr().err
    assert main(["batch", str(path), "--defaults", '{"shema": {}}']) == 2
    assert "--defaults: unknown field(s) shema" in capsys.readouterr().err
    assert main(["batch", str(path), "--defaults", str(tmp_path / "none.json")]) == 2
    assert "--defaults: no such file" in capsys.readouterr().err
    assert main(["batch", str(path), "--defaults", '{"schema": ']) == 2
    assert re.search(r"--defaults is not valid JSON: .*\(line 1, column \d+\)",
                     capsys.readouterr().err)
    (tmp_path / "d.json").write_text('{"schema": ')
    assert main(["batch", str(path), "--defaults", str(tmp_path / "d.json")]) == 2
    assert "d.json is not valid JSON: " in capsys.readouterr().err


def test_a_batch_writes_a_line_per_request_in_order_and_goes_on_after_a_failure(
        tmp_path, capsys, tiny_model_dir):
    requests = [  # the first takes its schema and budget from --defaults
        {"id": "json", "prompt": "Name someone."},
        {"id": "bad", "prompt": "x", "schema": {"type": "nope"}},
        {"prompt": "A date.", "regex": "20[0-9][0-9]-0[1-9]", "schema": None},
        {"id": 4, "prompt": "Anything.", "max_new_tokens": 5, "temperature": 0.8, "seed": 3,
         "schema": None},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in requests) + "\n")
    out = tmp_path / "out.jsonl"
    defaults = tmp_path / "defaults.json"
    defaults.write_text(json.dumps({"schema": PERSON, "max_new_tokens": 24}))
    code = main(["batch", str(path), "--model", str(tiny_model_dir), "--output", str(out),
                 "--stats", "--defaults", str(defaults)])
    err = capsys.readouterr().err
    assert code == 1  # one request failed
    assert "4 requests (1 failed) in this process" in err
    totals = json.loads(err.strip().splitlines()[-1])  # --stats: the batch's sums, last
    # as a Generator counts them: the requests that reached decoding (not the bad schema)
    assert totals["requests"] == 3 and totals["decodes"] == 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2, 3]
    assert [line.get("id") for line in lines] == ["json", "bad", None, 4]
    assert lines[1]["error"]["type"] == "SchemaError"
    assert "/type" in lines[1]["error"]["message"]
    import re

    assert re.fullmatch("20[0-9][0-9]-0[1-9]", lines[2]["text"])
    assert lines[3]["stats"]["new_tokens"] <= 5
    first = lines[0]
    if "error" in first:  # a random model may run out of budget inside the string
        assert first["error"]["type"] == "GenerationError"
    else:
        assert first["value"] == json.loads(first["text"]) and "name" in first["value"]


def test_a_progress_bar_counts_requests_on_stderr_when_asked(tmp_path, capsys,
                                                              tiny_model_dir):
    """--progress draws a bar of requests on stderr (stdout keeps the results alone); by
    default a stderr that is not a terminal gets the summary line only."""
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "regex": "[0-9]{2}"}) + "\n"
                            for p in ("One.", "Two.", "Three.")))
    assert main(["batch", str(path), "--model", str(tiny_model_dir), "--progress"]) == 0
    captured = capsys.readouterr()
    assert "structspec batch" in captured.err and "3/3" in captured.err
    assert "failed=0" in captured.err and "tokens_per_s" in captured.err
    assert len(captured.out.splitlines()) == 3 and "3/3" not in captured.out
    assert main(["batch", str(path), "--model", str(tiny_model_dir)]) == 0
    err = capsys.readouterr().err
    assert "3/3" not in err and "3 requests (0 failed)" in err


def test_replicas_write_what_this_process_writes(tmp_path, capsys, tiny_model_dir):
    from tests.conftest import torch_threads

    requests = [{"id": i, "prompt": p, "schema": PERSON, "max_new_tokens": 24}
                for i, p in enumerate(["Name someone.", "Another name.", "A third."])]
    requests.append({"id": "re", "prompt": "A year.", "regex": "19[0-9][0-9]"})
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    outputs = {}
    for replicas in ("1", "2"):
        out = tmp_path / f"out{replicas}.jsonl"
        with torch_threads(2):  # the in-process run sets the thread count it is given
            code = main(["batch", str(path), "--model", str(tiny_model_dir), "--output",
                         str(out), "--replicas", replicas, "--threads", "1"])
        assert code in (0, 1), capsys.readouterr().err
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        for line in lines:  # the same tokens; time and passes are each process's own
            line.pop("stats", None)
        outputs[replicas] = lines
    assert "on 2 replicas of 1 thread(s)" in capsys.readouterr().err
    assert outputs["1"] == outputs["2"]
    assert [line["id"] for line in outputs["2"]] == [0, 1, 2, "re"]
