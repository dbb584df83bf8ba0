"""plain_values: every Arrow type a pass-through column may have, as strict JSON and as weights_only-loadable
values."""
import base64
import datetime
import decimal
import io
import json
import math

import pyarrow as pa
import torch

from rollout_relabel.transforms.lib.output.plain_values import plain_table, row_json


def awkward_table() -> pa.Table:
    return pa.table({
        "ts_ns": pa.array([1_000_000_001, None], pa.timestamp("ns")),
        "ts_utc": pa.array([1, 2], pa.timestamp("us", tz="UTC")),
        "price": pa.array([decimal.Decimal("12.50"), None]),
        "took": pa.array([1500, 6], pa.duration("ms")),
        "at": pa.array([5, None], pa.time64("ns")),
        "day": pa.array([1, 2], pa.date32()),
        "raw": pa.array([b"\x00\xff", None]),
        "score": [math.nan, -math.inf],
        "times": pa.array([[1_000_000_001], None], pa.list_(pa.timestamp("ns"))),
        "spans": pa.array([[("a", 1)], None], pa.map_(pa.string(), pa.duration("ns"))),
        "meta": pa.array([{"when": 1}, None], pa.struct([("when", pa.timestamp("ns"))])),
        "pair": pa.array([[1, 2], [3, 4]], pa.list_(pa.time64("ns"), 2)),
        "tag": pa.array(["a", "b"]).dictionary_encode(),
    })


def test_row_json_is_strict_json_for_every_type():
    table = awkward_table()
    rows = plain_table(table, only_nanoseconds=True).to_pylist()
    texts = [row_json(r) for r in rows]
    first = json.loads(texts[0], parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert first["ts_ns"] == "1970-01-01 00:00:01.000000001"
    assert first["at"] == "00:00:00.000000005"
    assert first["times"] == ["1970-01-01 00:00:01.000000001"]
    assert first["spans"] == [["a", "1ns"]]
    assert first["meta"] == {"when": "1970-01-01 00:00:00.000000001"}
    assert first["price"] == "12.50" and first["took"] == "0:00:01.500000"  # str() as before for these
    assert first["raw"] == {"$base64": base64.b64encode(b"\x00\xff").decode()}
    assert first["score"] == "NaN"
    second = json.loads(texts[1])
    assert second["score"] == "-Infinity" and second["ts_ns"] is None and second["times"] is None


def test_a_sliced_table_converts_only_its_rows():
    rows = plain_table(awkward_table().slice(1)).to_pylist()
    assert rows == [{"ts_ns": None, "ts_utc": "1970-01-01 00:00:00.000002Z", "price": None, "took": "6ms",
                     "at": None, "day": "1970-01-03", "raw": None, "score": -math.inf, "times": None,
                     "spans": None, "meta": None, "pair": ["00:00:00.000000003", "00:00:00.000000004"], "tag": "b"}]


def test_plain_values_load_with_weights_only():
    rows = plain_table(awkward_table()).to_pylist()
    buffer = io.BytesIO()
    torch.save({"samples": rows}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded["samples"][0]["price"] == "12.50" and loaded["samples"][0]["took"] == "1500ms"
    assert loaded["samples"][0]["day"] == "1970-01-02" and loaded["samples"][0]["raw"] == b"\x00\xff"


def test_types_without_conversion_are_the_same_objects():
    table = pa.table({"a": [1, 2], "b": [[1.5], []], "c": ["x", None]})
    assert plain_table(table) is table or plain_table(table).equals(table)
    assert row_json({"when": datetime.date(2020, 1, 2), "n": 1.5}) == '{"when": "2020-01-02", "n": 1.5}'


def test_messages_lose_terminal_escapes_and_control_characters():
    from rollout_relabel.transforms.lib.errors import BadFile, printable

    torch_like = "Weights only load failed. \x1b[1mdo those steps only if you trust the source\x1b[0m.\n\t(1) x\x07"
    assert printable(torch_like) == "Weights only load failed. do those steps only if you trust the source.  (1) x "
    assert BadFile("unsafe-pickle", torch_like).message == printable(torch_like)
    assert printable("plain text, ünïcode") == "plain text, ünïcode"
