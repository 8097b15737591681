"""Style rates of a generation, and `mine` end to end on Qwen (contexts found by the shared phrase
matcher, tests/solvers/test_phrases.py, land on the dump rows that predict the rejected token)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from exactedit.runs.data.mine import KAOMOJI, style_rates
from tests import oracles


def test_style_rates():
    texts = ["sure thing (＾▽＾)", "Certainly! Here it is.", "", "ok ヽ(°〇°)ﾉ", "The end."]
    r = style_rates(texts, [False, False, True, False, False], ("Certainly", "Sure"))
    assert r.replies == 5 and r.kaomoji == pytest.approx(0.4) and r.lowercase_start == pytest.approx(0.4)
    assert r.slop_starter == pytest.approx(0.2) and r.empty_step0 == pytest.approx(0.2)
    assert not KAOMOJI.search("f(x) = (a + b)")


@pytest.mark.live
def test_mine_finds_contexts_in_its_own_text_and_dumps_them(tmp_path):
    from click.testing import CliRunner

    from exactedit.cli import main
    from exactedit.dumps import read_dump

    oracles.live_model("qwen")  # missing extra: a skip, or a failure in CI (tests/oracles.py)
    (tmp_path / "p.txt").write_text("Write two sentences about the history of rivers.\n")
    (tmp_path / "s.txt").write_text("of the\nin the\nto the\nrather than\n")
    res = CliRunner().invoke(main, ["mine", "--model", "qwen", "--prompts", str(tmp_path / "p.txt"),
                                    "--phrases", str(tmp_path / "s.txt"), "--out", str(tmp_path / "d"),
                                    "--max-new", "40", "--temperature", "0.2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["contexts"], out["replies"]
    d = read_dump(out["dump"])
    toks = np.asarray(d.field("tokens"))
    for c in out["contexts"]:
        assert d.field("next")[c["row"]] == c["rejected"] == toks[c["row"] + 1]
    assert d.manifest.meta["mine"]["contexts"] == out["contexts"]
    assert out["rates"]["base"]["replies"] == 1
