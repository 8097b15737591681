"""Reading a report back (`eval blind --dev-report`): the round trip, and the file as untrusted input
(issue 38): a FIFO or /dev/zero refused by name, a cap checked before reading, a foreign or
malformed document one ReportError naming the file and the flag."""
from __future__ import annotations

import json
import math

import pytest

from exactedit.evals.scoring.bars import BarRow, PhraseRow
from exactedit.evals.scoring.report import (MAX_REPORT_BYTES, REPORT_KIND, BarReport, ReportError, read_report,
                                            write_report)
from exactedit.files import file_sha256
from tests.special_files import WHY, special


def _report() -> BarReport:
    row = BarRow("c_reduction", "c", "slop reduction", 0.8, 0.5, ">=", True, 12, (0.7, 0.9))
    return BarReport("score", "dev", (row,), "pass", (PhraseRow(0, (3, 4), 5, 0.2, 0.01, " end to"),),
                     {"chat": {"mean": 0.001}}, {"protocol": "p.toml"})


def test_round_trip_and_the_sha256_of_the_bytes(tmp_path):
    written = write_report(_report(), tmp_path, "dev-report", png=False)
    back, sha = read_report(written.paths["json"])
    assert sha == file_sha256(written.paths["json"]) == written.sha256["json"]
    assert back.rows[0].number == 0.8 and math.isnan(back.rows[0].base) and back.phrases == _report().phrases
    assert back.meta == {"protocol": "p.toml"} and back.kld == {"chat": {"mean": 0.001}}


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_special_files_are_refused_by_name(tmp_path, kind):
    """A FIFO was waited on for ever (here: the watchdog's empty write end, then "cannot read a
    report: Expecting value"); /dev/zero read until memory ran out."""
    bad = special(tmp_path / "dev-report.json", kind)
    with pytest.raises(ReportError) as err:
        read_report(bad, "--dev-report")
    assert str(err.value).startswith(f"{bad}: --dev-report: {WHY[kind]}")


def test_the_cap_is_checked_before_reading(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(MAX_REPORT_BYTES + 1)                       # sparse
    with pytest.raises(ReportError, match=f"report: {MAX_REPORT_BYTES + 1} bytes, over the limit of {MAX_REPORT_BYTES}"):
        read_report(big)


@pytest.mark.parametrize("text, says", [
    ('{"kind": "%s"}' % REPORT_KIND, "not an exactedit eval report (missing key 'bars')"),
    ('{"kind": "%s", "report": "score", "heldout_role": "dev", "verdict": "pass", "bars": 3}' % REPORT_KIND,
     "not an exactedit eval report ('int' object is not iterable)"),
    ('{"kind": "%s", "report": "score", "heldout_role": "dev", "verdict": "pass", "bars": [], "kld": []}'
     % REPORT_KIND, "not an exactedit eval report"),
    ('{"kind": "other"}', f"not an exactedit eval report (kind {REPORT_KIND!r})"),
    ("[" * 100_000 + "]" * 100_000, "not JSON (nested too deeply)"),
    ("{not json", "not JSON (Expecting property name"),
])
def test_a_malformed_report_is_one_report_error(tmp_path, text, says):
    """A report missing a key was a KeyError (a traceback); one nested too deeply a RecursionError."""
    f = tmp_path / "r.json"
    f.write_text(text)
    with pytest.raises(ReportError) as err:
        read_report(f, "--dev-report")
    assert str(err.value).startswith(f"{f}: --dev-report: {says}"), str(err.value)


def test_not_utf8_names_the_byte(tmp_path):
    f = tmp_path / "r.json"
    f.write_bytes(json.dumps({"kind": REPORT_KIND}).encode() + b"\xff")
    with pytest.raises(ReportError, match=r"r\.json: report: not UTF-8 text \(invalid start byte at byte \d+\)"):
        read_report(f)
