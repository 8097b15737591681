"""`eval blind` reads what it repeats of the dev run from the dev report (issue 38): its protocol
path (meta.protocol), its shaping rules (meta.shapes) and the bars it compares. A field of the wrong
type is one clean error naming the report and the field, before the bundle, the dump or the ledger
is touched (before: a TypeError traceback from Path(5), tuple(7), or 1.0 - "0.5" in the comparison;
a report naming no protocol was ".: file: not a regular file")."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.evals.scoring.bars import BarRow
from exactedit.evals.scoring.report import BarReport, ReportError, read_report, report_to_json
from exactedit.fixtures import DEFAULT_FIXTURE

MODEL = DEFAULT_FIXTURE / "model.gguf"


def _dev(tmp_path, meta, rows=()) -> str:
    f = tmp_path / "dev.json"
    f.write_text(json.dumps(report_to_json(BarReport("score", "dev", tuple(rows), "pass", meta=meta))))
    return str(f)


@pytest.mark.parametrize("meta, field, says", [
    ({"protocol": 5}, "meta.protocol", "expected the protocol file's path, got 5; give --protocol"),
    ({"protocol": ["p.toml"]}, "meta.protocol", "expected the protocol file's path, got ['p.toml']"),
    ({"protocol": ""}, "meta.protocol", "expected the protocol file's path, got ''"),
    ({}, "meta.protocol", "missing; give --protocol"),
    ({"protocol": "p.toml", "shapes": 7}, "meta.shapes", "expected a list of shaping rules (strings), got 7"),
    ({"protocol": "p.toml", "shapes": [1]}, "meta.shapes", "expected a list of shaping rules (strings), got [1]"),
    ({"protocol": "p.toml", "shapes": ["bogus"]}, "meta.shapes", "unknown shaping rule 'bogus'"),
])
def test_a_dev_report_field_of_the_wrong_type_is_named(tmp_path, meta, field, says):
    (tmp_path / "bundle").mkdir()
    (tmp_path / "doc").mkdir()
    dev = _dev(tmp_path, meta)
    res = CliRunner().invoke(main, ["eval", "blind", "--model", str(MODEL), "--bundle", str(tmp_path / "bundle"),
                                    "--doc", str(tmp_path / "doc"), "--dev-report", dev,
                                    "--workspace", str(tmp_path / "ws")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert f"Error: {dev}: {field}: {says}" in res.output, res.output
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("key, value, says", [
    ("number", "0.5", "bars[0].number: expected a number or null, got '0.5'"),
    ("passed", "yes", "bars[0].passed: expected true, false or null, got 'yes'"),
    ("number", True, "bars[0].number: expected a number or null, got True"),
    ("ci", [0.1], "bars[0].ci: expected [low, high], got [0.1]"),
    ("n", 1.5, "bars[0].n: expected an integer, got 1.5"),
    ("key", None, "bars[0].key: expected a string, got None"),
])
def test_a_bar_of_the_wrong_type_is_refused_when_read(tmp_path, key, value, says):
    """`eval blind` compares the dev report's numbers: a string there was read, then a TypeError."""
    row = BarRow("c_reduction", "c", "slop reduction", 0.8, 0.5, ">=", True, 12, (0.7, 0.9))
    f = _dev(tmp_path, {"protocol": "p.toml"}, [row])
    obj = json.loads(open(f).read())
    obj["bars"][0][key] = value
    open(f, "w").write(json.dumps(obj))
    with pytest.raises(ReportError) as err:
        read_report(f, "--dev-report")
    assert str(err.value) == f"{f}: --dev-report: not an exactedit eval report ({says})", str(err.value)


def test_meta_must_be_an_object(tmp_path):
    f = _dev(tmp_path, {})
    obj = json.loads(open(f).read())
    obj["meta"] = "p.toml"
    open(f, "w").write(json.dumps(obj))
    with pytest.raises(ReportError, match=r"not an exactedit eval report \(meta: expected an object, got 'p.toml'\)"):
        read_report(f, "--dev-report")
