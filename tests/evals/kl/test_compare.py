"""`evals.kl.compare.compare`: several dumps combine into one report, rows per dump or per document,
both statistics and both arithmetics equal to computing them step by step, a base side handed in
instead of the base model, and impossible requests refused."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.evals.kl.stats import kld_stats
from exactedit.evals.kl.compare import KldConfig, KldConfigError, compare
from exactedit.evals.kl.llamacpp import concat_rows, encode_base, score_rows
from exactedit.evals.kl.llamacpp_stats import lp_stats
from exactedit.solvers.tail.passes.kl_pass import KlRows

from tests.kld_world import CTX, V, make_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A dump of two 12-token documents and one of a single document (tests/kld_world.py)."""
    return make_world(tmp_path_factory.mktemp("kc"))


def _cfg(world, **kw):
    base, edited, d1, d2 = world
    return KldConfig(**{"dumps": (d1, d2), "model": base, "edited": edited, **kw})


def test_dumps_combine_into_one_report(world):
    base, edited, d1, d2 = world
    both = compare(_cfg(world))
    one, two = compare(_cfg(world, dumps=(d1,))), compare(_cfg(world, dumps=(d2,)))
    cat = KlRows(*(np.concatenate([getattr(one.exact_rows, f), getattr(two.exact_rows, f)]) for f in KlRows._fields))
    assert np.array_equal(both.per_row_kld, cat.kl) and both.exact == kld_stats(cat)
    assert both.span_rows == (2 * CTX, CTX) and both.summary()["rows"] == 3 * CTX
    assert [d.spans for d in both.dumps] == [((None, 0, 24),), ((None, 0, 12),)]
    assert both.exact.kld_min > 0 and both.to_dict()["per_row_kld"] == list(both.per_row_kld)


def test_rows_per_dump_and_per_document(world):
    r = compare(_cfg(world, rows=("0:5", "2:9")))
    assert r.span_rows == (5, 7) and r.dumps[1].spans == ((None, 2, 9),)
    r = compare(_cfg(world, rows=("-4:",)))
    assert r.span_rows == (4, 4)
    r = compare(_cfg(world, doc_rows="6:11"))
    assert r.span_rows == (5, 5, 5)
    assert [s for d in r.dumps for s in d.spans] == [("d1-0", 6, 11), ("d1-1", 18, 23), ("d2-0", 6, 11)]


def _steps(world, match_engine):
    """The llama-perplexity statistics computed step by step, for --doc-rows 6:11."""
    from exactedit.solvers.tail.engine_math import engine_logits_setup
    from exactedit.solvers.tail.logits import head_pass, open_pair, tail_mix

    base, edited, d1, d2 = world
    parts, sizes = [], []
    for dump in (d1, d2):
        for k in range(2 if dump == d1 else 1):
            span = (k * CTX + 6, k * CTX + 11)
            logits = []
            for model in (base, edited):
                g, tail, d = open_pair(model, dump)
                if match_engine:
                    mix, mm = engine_logits_setup(g, tail, d, span, "llamacpp")
                else:
                    mix, mm = tail_mix(tail, d, span), None
                out = np.empty((5, V), np.float32)
                head_pass(tail, mix, matmul=mm, sink=lambda a, b, t, out=out: out.__setitem__((slice(None), slice(a, b)), t))
                logits.append(out)
            nxt = np.asarray(d.next[span[0]:span[1]])
            rows, _ = encode_base(logits[0], nxt)
            parts.append(score_rows(logits[1], rows, nxt))
            sizes.append(5)
    return concat_rows(parts), tuple(sizes)


@pytest.mark.parametrize("match_engine", [None, "llamacpp"])
def test_llama_perplexity_stats_equal_the_steps(world, match_engine):
    """Blocks of 3 rows with the engine's arithmetic (each row's numbers depend on its micro-batch
    only, not on how many rows are computed together); whole spans with BLAS, whose float32 sums
    can depend on the number of rows in one product."""
    rows, sizes = _steps(world, match_engine)
    r = compare(_cfg(world, doc_rows="6:11", stats="llama-perplexity", match_engine=match_engine,
                     block_rows=3 if match_engine else 128))
    assert all(np.array_equal(a, b) for a, b in zip(r.lp_rows, rows))
    assert repr(r.llamacpp) == repr(lp_stats(rows, sizes)) and r.exact is None  # repr: nan == nan
    assert r.summary()["kld"]["mean"] == r.llamacpp.kld_mean and r.base_ppl is not None


def test_engine_arithmetic_differs_from_exact(world):
    exact = compare(_cfg(world, doc_rows="6:11"))
    engine = compare(_cfg(world, doc_rows="6:11", match_engine="llamacpp"))
    assert engine.match_engine == "llamacpp" and not np.array_equal(exact.per_row_kld, engine.per_row_kld)
    np.testing.assert_allclose(engine.per_row_kld, exact.per_row_kld, rtol=0.5, atol=1e-3)


class _Base:
    """A base side handed in (as a base file would be)."""

    def __init__(self, rows, nxt):
        self.rows_, self.nxt, self.rows = rows, nxt, rows.codes.shape[0]

    def next_tokens(self):
        return self.nxt

    def base_rows(self, a, b):
        return type(self.rows_)(*(f[a:b] for f in self.rows_))


def test_base_handed_in_equals_base_model(world):
    sink = []
    cfg = _cfg(world, doc_rows="6:11", stats="llama-perplexity")
    from_model = compare(cfg, base_sink=sink.append)
    rows = type(sink[0])(*(np.concatenate([getattr(s, f) for s in sink]) for f in sink[0]._fields))
    nxt = np.concatenate([np.asarray(s) for s in _nexts(world)])
    from_base = compare(KldConfig(dumps=cfg.dumps, edited=cfg.edited, doc_rows="6:11", stats="llama-perplexity"),
                        base=_Base(rows, nxt))
    assert repr(from_base.llamacpp) == repr(from_model.llamacpp) and from_base.model is None
    with pytest.raises(KldConfigError, match="predicts token"):
        compare(KldConfig(dumps=cfg.dumps, edited=cfg.edited, doc_rows="6:11", stats="llama-perplexity"),
                base=_Base(rows, (nxt + 1) % V))
    with pytest.raises(KldConfigError, match="rows"):
        compare(KldConfig(dumps=cfg.dumps, edited=cfg.edited, doc_rows="5:11", stats="llama-perplexity"),
                base=_Base(rows, nxt))


def _nexts(world):
    from exactedit.dumps import read_dump

    _, _, d1, d2 = world
    out = []
    for p in (d1, d2):
        d = read_dump(p)
        out += [d.next[doc.first_row + 6:doc.first_row + 11] for doc in d.docs]
    return out


@pytest.mark.parametrize("kw,match", [
    ({"rows": ("0:5", "0:5", "0:5")}, "one per dump"),
    ({"rows": ("0:5",), "doc_rows": "0:5"}, "not both"),
    ({"stats": "kl"}, "stats"),
    ({"match_engine": "metal"}, "match-engine"),
    ({"dumps": ()}, "at least one"),
])
def test_impossible_configs(world, kw, match):
    with pytest.raises(KldConfigError, match=match):
        _cfg(world, **kw)


def test_impossible_requests(world):
    with pytest.raises(KldConfigError, match="no next token"):
        compare(_cfg(world, stats="llama-perplexity"))                     # documents' last rows
    with pytest.raises(KldConfigError, match="llama-perplexity"):
        compare(_cfg(world), base_sink=lambda rows: None)
    with pytest.raises(KldConfigError, match="--model"):
        compare(_cfg(world, model=None))
    with pytest.raises(KldConfigError, match="--edited"):
        compare(_cfg(world, edited=None))
