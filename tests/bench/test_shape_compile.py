"""`bench shape-compile` on Qwen, small: the phrases compile, the old scan and the set lookup find
the same pieces (the bench refuses otherwise), and the CLI prints the result as JSON."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from exactedit import cli
from tests import oracles



@pytest.mark.live
def test_bench_shape_compile_on_qwen():
    oracles.live_model("qwen")
    r = CliRunner().invoke(cli.main, ["bench", "shape-compile", "--model", "qwen", "--phrases", "40",
                                      "--scan-phrases", "10", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["vocab"] == 151936 and d["phrases"] == 40 and d["pieces"] > 0 and d["scan_phrases"] == 10
    assert d["compile_s"] > 0 and d["scan_s"] > 0 and d["pieces_s"] > 0


def test_phrases_are_the_models_lowercase_words_and_seeded():
    import itertools

    from exactedit.bench.shape_compile import draw_phrases

    words = [b" " + bytes(w) for w in itertools.islice(itertools.product(b"abcde", repeat=4), 60)]
    table = words + [b"Bad", b" x", b" UPPER", b" two words", b" digit7", b""]
    a = draw_phrases(table, 30, 1)
    assert a == draw_phrases(table, 30, 1) and a != draw_phrases(table, 30, 2)
    assert len(set(a)) == 30 and all(2 <= len(p.split()) <= 4 for p in a)
    assert {w.encode() for p in a for w in p.split()} <= {w[1:] for w in words}
