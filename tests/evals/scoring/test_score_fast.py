"""`eval score`'s fast path (no shaping, one head: the numba KL pass) gives the reference's
RowScores (full float32 logits -> float64 log-softmax) on the fixture's real hc4 tail: argmaxes
equal, log-probs / special probabilities / KL within the float32-logit bound of the KL pass table
test (tests/solvers/tail/test_kl_pass.py: both sides round the same float32 logits, so the
difference is the accumulation order over 32k-wide rows)."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.evals.scoring.evaluate import _full_logits, rows_fast, same_head
from exactedit.runs.demo import DEFAULT_FIXTURE
from exactedit.quant import gguf
from exactedit.solvers.tail.logits import tail_mix
from exactedit.solvers.tail.model import load_tail
from exactedit.solvers.tail.scores import DocMeta, rows_from_logits


@pytest.fixture(scope="module")
def tail():
    return load_tail(gguf.open(DEFAULT_FIXTURE / "model.gguf"))


def test_fast_rows_equal_the_reference(tail):
    dump_dir = sorted(p for p in (DEFAULT_FIXTURE / "dumps").iterdir() if p.is_dir())[0]
    d = read_dump(dump_dir, expect=tail.dump_expect())
    a, b = 0, min(d.rows, 48)
    mix_b = tail_mix(tail, d, (a, b))
    rng = np.random.default_rng(0)
    mix_e = (mix_b * (1 + 0.05 * rng.standard_normal(mix_b.shape))).astype(np.float32)
    args = (np.asarray(d.tokens[a:b]), np.asarray(d.next[a:b]), np.zeros(b - a, np.uint8), np.zeros(b - a, np.int32))
    specials = [0, 1, 2]
    docs = (DocMeta("d", "t", "dev"),)
    want = rows_from_logits(_full_logits(tail, mix_b, 4096), _full_logits(tail, mix_e, 4096), *args, specials, (), docs)
    got = rows_fast(tail, mix_b, mix_e, *args, specials, docs, 4096)
    np.testing.assert_array_equal(got.argmax_base, want.argmax_base)
    np.testing.assert_array_equal(got.argmax_edit, want.argmax_edit)
    np.testing.assert_array_equal(np.isnan(got.logp_base), np.isnan(want.logp_base))
    np.testing.assert_allclose(got.logp_base, want.logp_base, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got.logp_edit, want.logp_edit, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got.kl, want.kl, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(got.p_special_base, want.p_special_base, rtol=1e-3, atol=1e-9)
    np.testing.assert_allclose(got.p_special_edit, want.p_special_edit, rtol=1e-3, atol=1e-9)
    assert got.kl.max() > 1e-4                              # the perturbation is seen


def test_same_head_compares_bytes(tail):
    assert same_head(tail, tail)
    other = load_tail(gguf.open(DEFAULT_FIXTURE / "model.gguf"))
    assert same_head(tail, other)
    class Changed:
        qtype, rows, cols, runtime = tail.head.qtype, tail.head.rows, tail.head.cols, tail.head.runtime

        @staticmethod
        def read_raw(a, b):
            raw = np.array(tail.head.read_raw(a, b))
            if a <= 5 < b:
                raw[5 - a, 0] ^= 1
            return raw
    assert not same_head(tail, type("T", (), {"head": Changed})())


def _edited_ffn_down(root):
    """The fixture model with some rows of its last ffn_down scaled: the head stays the base's, so
    `eval score` takes the fast path with an edited mix of its own."""
    from exactedit import quant
    from exactedit.solvers.apply import apply_bundle
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    model = DEFAULT_FIXTURE / "model.gguf"
    with gguf.open(model) as g:
        name = load_tail(g).spec.names["ffn_down"]
        info = g.tensors[name]
        rows = np.arange(0, info.shape[0], 4)
        w = g.read_rows(name)[rows]
        sha = g.sha256()
    edit = TensorEdit(name, "rows", info.type_name, tuple(info.shape), quant.quantize(1.3 * w, info.type_name), rows)
    bundle = write_bundle(root / "bundle", solver="test", inputs=[InputRef("model", str(model), sha)],
                          config={}, edits=[edit]).path
    return apply_bundle(bundle, model, root / "edited.gguf").out


def test_fast_rows_batch_documents_without_changing_a_row(tmp_path):
    """The fast path scores several documents per head pass (`fast_rows`); every row's numbers and its
    document are the ones a pass per few rows gives, on both sides (edited: an ffn_down edit, so the
    head is shared and the edited mix is the edited model's own)."""
    from exactedit.runs.eval import workflow
    from exactedit.evals.scoring.evaluate import ScoreConfig, protocol_traces, score_traces
    from exactedit.evals.protocol.protocol import load_protocol

    proto_file = DEFAULT_FIXTURE / "protocol.toml"
    ws = tmp_path / "ws"
    workflow.register(proto_file, ws, "register")
    splits = workflow.split(proto_file, ws, "split").splits
    protocol = load_protocol(proto_file)
    traces = protocol_traces(protocol, splits, "dev")
    model, edited = DEFAULT_FIXTURE / "model.gguf", _edited_ffn_down(tmp_path)
    small = score_traces(protocol, model, traces, ScoreConfig(fast_rows=5), edited=edited, splits=splits).scores
    big = score_traces(protocol, model, traces, ScoreConfig(), edited=edited, splits=splits).scores
    assert small.rows == big.rows and len({int(d) for d in big.doc}) > 3   # many documents in a pass
    assert np.nanmax(np.abs(big.logp_edit - big.logp_base)) > 1e-3          # the edited side differs
    for name in ("tokens", "next", "roles", "doc"):
        np.testing.assert_array_equal(getattr(small, name), getattr(big, name))
    # an argmax may differ only at a tie within float32 rounding: the BLAS rounds a row's logits by
    # the product's shape (OpenBLAS 0.3.31 does, at 2 of these 536 rows)
    for name, side in (("argmax_base", model), ("argmax_edit", edited)):
        for i in np.flatnonzero(getattr(small, name) != getattr(big, name)):
            _assert_float32_tie(protocol, side, small, int(i), int(getattr(small, name)[i]), int(getattr(big, name)[i]))
    np.testing.assert_allclose(small.logp_base, big.logp_base, rtol=0, atol=1e-5)
    np.testing.assert_allclose(small.logp_edit, big.logp_edit, rtol=0, atol=1e-5)
    np.testing.assert_allclose(small.p_special_base, big.p_special_base, rtol=1e-5, atol=1e-9)
    assert [d.name for d in small.docs] == [d.name for d in big.docs]


def _assert_float32_tie(protocol, model, scores, i, a, b):
    """Tokens a and b at score row i: their float64 logits (from the float32 mix) lie within twice
    the float32 rounding bound of a length-n dot product, gamma_n |mix|.|W_v|, of each other."""
    doc = scores.docs[int(scores.doc[i])]
    trace = next(t for t in protocol.traces if t.name == doc.trace)
    tail = load_tail(gguf.open(model))
    d = read_dump(trace.path, expect=tail.dump_expect())
    info = next(x for x in d.docs if x.name == doc.name)
    row = info.first_row + i - int(np.flatnonzero(scores.doc == scores.doc[i])[0])
    mix = tail_mix(tail, d, (row, row + 1)).astype(np.float64)[0]
    W = tail.head.read(0, tail.head.rows).astype(np.float64)[[a, b]]
    n = mix.size
    gamma = n * 2.0 ** -24 / (1 - n * 2.0 ** -24)
    gap, bound = abs(float(W[0] @ mix - W[1] @ mix)), 2 * gamma * float((np.abs(W) @ np.abs(mix)).max())
    assert gap <= bound, (i, a, b, gap, bound)
