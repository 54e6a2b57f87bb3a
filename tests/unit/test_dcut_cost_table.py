"""Cost table: JSON round trip, the file schema, lookup, corrupt and mismatched files.

Budget: < 2 s.
"""

import dataclasses
import json
import logging

import pytest

from sglang_ext.dcut import CostTable, CostTableError, CostTableKey

KEY = CostTableKey(
    model="tgt", draft="drf", device="cpu", tp=1, dtype="float32", draft_tokens=4, topk=1,
    num_steps=3, attention_backend="torch_sdpa", context_len=2048, sglang_version="0.5.23",
    sglang_ext_version="0.1.0",
)
CREATED = "2026-01-02T03:04:05+00:00"


OFF_MS = [0.8, 1.6, 3.5]


def _table():
    return CostTable.build(
        KEY, [1, 4, 16], [[1.0, 1.5, 2.0, 2.5], [2.0, 3.0, 4.0, 5.0], [5.0, 9.0, 13.0, 17.5]],
        created=CREATED, off_ms=OFF_MS,
    )


def _valid_dict():
    return {
        "version": 2,
        "key": {
            "model": "tgt", "draft": "drf", "device": "cpu", "tp": 1, "dtype": "float32",
            "draft_tokens": 4, "topk": 1, "num_steps": 3, "attention_backend": "torch_sdpa",
            "context_len": 2048, "sglang_version": "0.5.23", "sglang_ext_version": "0.1.0",
        },
        "tiers": [0.25, 0.5, 0.75, 1.0],
        "batch_sizes": [1, 4, 16],
        "step_ms": [[1.0, 1.5, 2.0, 2.5], [2.0, 3.0, 4.0, 5.0], [5.0, 9.0, 13.0, 17.5]],
        "off_ms": [0.8, 1.6, 3.5],
        "created": CREATED,
    }


def test_version_1_files_load_without_draft_off_costs(tmp_path):
    v1 = _valid_dict()
    v1["version"] = 1
    del v1["off_ms"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(v1))
    t = CostTable.load(path, expected_key=KEY)
    assert t.off_ms is None and not t.has_draft_off and t.lookup_off(4) is None
    assert t.step_ms == _table().step_ms
    saved = t.to_dict()  # written back as version 2, the draft-off costs null
    assert saved["version"] == 2 and saved["off_ms"] is None
    assert CostTable.from_dict(saved) == t
    v1_with_off = dict(v1, off_ms=OFF_MS)  # a version-1 file has no draft-off field: ignored
    assert CostTable.from_dict(v1_with_off).off_ms is None


def test_draft_off_lookup_uses_the_tier_row():
    t = _table()
    assert [t.lookup_off(b) for b in (1, 2, 4, 5, 16)] == [(1, 0.8), (4, 1.6), (4, 1.6), (16, 3.5), (16, 3.5)]
    for b in (1, 3, 9, 16, 40):
        assert t.lookup_off(b)[0] == t.lookup(b)[0]


def test_round_trip_and_exact_schema(tmp_path):
    path = tmp_path / "cost.json"
    _table().save(path)
    assert json.loads(path.read_text()) == _valid_dict()   # the schema other tools read
    loaded = CostTable.load(path, expected_key=KEY)
    assert loaded == _table()
    assert CostTable.from_dict(_valid_dict()) == _table()
    assert not list(tmp_path.glob("*.tmp*"))                # the temporary file was renamed


def test_lookup_uses_smallest_profiled_batch_size_at_least_bs(caplog):
    t = _table()
    with caplog.at_level(logging.WARNING):
        assert t.lookup(1) == (1, (1.0, 1.5, 2.0, 2.5))
        assert t.lookup(2) == (4, (2.0, 3.0, 4.0, 5.0))
        assert t.lookup(4) == (4, (2.0, 3.0, 4.0, 5.0))
        assert t.lookup(5)[0] == 16 and t.lookup(16)[0] == 16
    assert not caplog.records


def test_lookup_beyond_the_table_uses_the_largest_row_and_warns_once(caplog):
    t = CostTable.build(KEY, [1, 4, 16], [[1.0, 1.5, 2.0, 2.5], [2.0, 3.0, 4.0, 5.0], [5.0, 9.0, 13.0, 17.5]],
                        created="2026-05-06T07:08:09+00:00")  # a table no other test has looked up
    with caplog.at_level(logging.WARNING):
        assert t.lookup(17) == (16, (5.0, 9.0, 13.0, 17.5))
        assert t.lookup(64) == (16, (5.0, 9.0, 13.0, 17.5))
    (record,) = caplog.records
    assert "batch size 17 is beyond the cost table (largest profiled batch size 16)" in record.getMessage()


def test_cache_identity_and_fill_from_nearest():
    from sglang_ext.dcut.cost_table import cache_identity, fill_from_nearest, nearest_batch_size

    ident = cache_identity(KEY, (0.5, 1.0), (1, 4))
    assert ident == {"key": KEY.to_dict(), "tiers": [0.5, 1.0], "batch_sizes": [1, 4]}
    assert [nearest_batch_size(b, [1, 4, 16]) for b in (2, 3, 10, 11, 64)] == [1, 4, 16, 16, 16]
    rows, filled = fill_from_nearest([1, 2, 8, 64], {1: [1.0, 2.0], 8: [3.0, 4.0]})
    assert rows == [[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0]] and filled == {2: 1, 64: 8}
    with pytest.raises(ValueError):
        fill_from_nearest([1], {})


def test_key_differences_name_each_field():
    other = dataclasses.replace(KEY, tp=2, attention_backend="flashinfer")
    assert KEY.differences(other) == ["tp: file 1 != server 2",
                                      "attention_backend: file 'torch_sdpa' != server 'flashinfer'"]
    assert KEY.differences(KEY) == []


def _mutations():
    def m(fn):
        d = _valid_dict()
        fn(d)
        return d

    return [
        ("version", m(lambda d: d.update(version=3))),
        ("version", m(lambda d: d.update(version=True))),
        ("missing field", m(lambda d: d.pop("off_ms"))),
        ("off_ms has 2 values", m(lambda d: d["off_ms"].pop())),
        ("off_ms must be finite positive", m(lambda d: d["off_ms"].__setitem__(0, 0.0))),
        ("off_ms must be finite positive", m(lambda d: d["off_ms"].__setitem__(0, float("inf")))),
        ("off_ms must be a list or null", m(lambda d: d.update(off_ms=1.0))),
        ("version", m(lambda d: d.pop("version"))),
        ("missing field", m(lambda d: d.pop("step_ms"))),
        ("missing field", m(lambda d: d["key"].pop("tp"))),
        ("unknown field", m(lambda d: d["key"].update(extra="x"))),
        ("'tp' must be an int", m(lambda d: d["key"].update(tp="1"))),
        ("'tp' must be an int", m(lambda d: d["key"].update(tp=True))),
        ("'model' must be a string", m(lambda d: d["key"].update(model=3))),
        ("tiers", m(lambda d: d.update(tiers=[0.5, 0.25, 0.75, 1.0]))),
        ("tiers", m(lambda d: d.update(tiers=[0.0, 0.5, 0.75, 1.0]))),
        ("tiers", m(lambda d: d.update(tiers=[0.25, 0.5, 0.75, 1.5]))),
        ("batch_sizes", m(lambda d: d.update(batch_sizes=[1, 16, 4]))),
        ("batch_sizes", m(lambda d: d.update(batch_sizes=[0, 4, 16]))),
        ("batch_sizes", m(lambda d: d.update(batch_sizes=[1, 4.0, 16]))),
        ("rows", m(lambda d: d["step_ms"].pop())),
        ("values", m(lambda d: d["step_ms"][1].pop())),
        ("finite positive", m(lambda d: d["step_ms"][0].__setitem__(2, -1.0))),
        ("finite positive", m(lambda d: d["step_ms"][0].__setitem__(2, float("nan")))),
        ("finite positive", m(lambda d: d["step_ms"][0].__setitem__(2, "3"))),
        ("ISO 8601", m(lambda d: d.update(created="yesterday"))),
        ("list", m(lambda d: d.update(step_ms="[[1]]"))),
    ]


@pytest.mark.parametrize("needle,data", _mutations())
def test_corrupt_tables_raise_clear_errors(tmp_path, needle, data):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CostTableError) as exc:
        CostTable.load(path)
    msg = str(exc.value)
    assert msg.startswith(str(path)) and needle in msg


@pytest.mark.parametrize("text", ["", "{", "not json", "[1, 2]", "null", '{"version": 1}'])
def test_unparsable_files_raise(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CostTableError, match="cost table"):
        CostTable.load(path)


def test_missing_file_raises(tmp_path):
    with pytest.raises(CostTableError, match="cannot read"):
        CostTable.load(tmp_path / "absent.json")


def test_mismatched_key_names_the_fields(tmp_path):
    path = tmp_path / "cost.json"
    _table().save(path)
    other = dataclasses.replace(KEY, tp=2, device="NVIDIA H200")
    with pytest.raises(CostTableError) as exc:
        CostTable.load(path, expected_key=other)
    msg = str(exc.value)
    assert "another setup" in msg and "tp" in msg and "device" in msg and "draft_tokens" not in msg
    assert KEY.mismatches(other) == ["device", "tp"]


def test_cost_table_error_is_a_value_error():
    assert issubclass(CostTableError, ValueError)
    with pytest.raises(CostTableError):
        CostTable.build(KEY, [4, 2], [[1, 2, 3, 4], [1, 2, 3, 4]])
