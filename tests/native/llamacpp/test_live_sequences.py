"""One llama.cpp context for many sequences (LlamaEngine.sequences, what capture_dump runs the
corpus windows and the replies through): each sequence's logits, captured tail rows and
micro-batches are bitwise those of a fresh context per sequence, whatever ran before it."""
from __future__ import annotations

import numpy as np
import pytest

from tests import oracles

pytestmark = pytest.mark.live

TEXTS = ("The committee met on Tuesday to discuss the budget, and after a long debate it decided to "
         "postpone the vote until the following week.", "Hello.",
         "Rivers carry sediment from the mountains to the sea.")


def test_one_context_gives_the_numbers_of_fresh_ones():
    from exactedit.native.llamacpp.capture import tail_names
    from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine
    from exactedit.quant import gguf
    from exactedit.quant.model import arch

    path = oracles.live_model("smollm")
    with gguf.open(path) as g:
        names = tail_names(arch.detect_tail(g).layer)
    # 16-token batches: the first text spans several decode calls; the short one follows a long one
    with LlamaEngine(path, EngineSettings(n_ctx=128, n_batch=16, n_ubatch=8, n_threads=1)) as e:
        docs = [e.tokenize(t) for t in TEXTS] + [e.tokenize(TEXTS[0])[:5]]
        fresh = [e.evaluate(d, capture=names) for d in docs]
        with e.sequences(capture=names) as run:
            again = [run(d) for d in docs]
    assert docs[0].size > 16
    for a, b in zip(fresh, again):
        assert np.array_equal(a.tokens, b.tokens) and a.ubatch_sizes == b.ubatch_sizes
        assert np.array_equal(a.logits, b.logits)
        assert sorted(a.captured) == sorted(b.captured) and a.captured
        for name in a.captured:
            assert np.array_equal(a.captured[name], b.captured[name]), name


def test_one_capturer_writes_the_dumps_of_separate_captures(tmp_path):
    """Capturer (the corpus stage: the model hashed and loaded once, one context for every part's
    documents) writes dumps whose fields, documents and model hash are those of capture_dump per part."""
    from exactedit import dumps
    from exactedit.native.llamacpp.capture import CaptureDoc, Capturer, capture_dump
    from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine

    path = oracles.live_model("smollm")
    s = EngineSettings(n_ctx=128, n_batch=16, n_ubatch=8, n_threads=1)
    with LlamaEngine(path, s) as e:
        toks = [e.tokenize(t) for t in TEXTS]
    parts = ([CaptureDoc("a", toks[0]), CaptureDoc("b", toks[1])], [CaptureDoc("c", toks[2])])
    with Capturer(path, s) as cap:
        together = [cap.dump(docs, tmp_path / f"one-{i}", keep_logits=False) for i, docs in enumerate(parts)]
    apart = [capture_dump(path, docs, tmp_path / f"own-{i}", settings=s) for i, docs in enumerate(parts)]
    for a, b in zip(together, apart):
        assert a.model_sha256 == b.model_sha256 and a.rows == b.rows and a.logits is None
        da, db = dumps.read_dump(a.path), dumps.read_dump(b.path)
        for field in ("tokens", "next", "R", "hh"):
            assert np.array_equal(np.asarray(getattr(da, field)), np.asarray(getattr(db, field))), field
        assert [d.name for d in da.docs] == [d.name for d in db.docs]
        assert da.meta["ubatch_sizes"] == db.meta["ubatch_sizes"]
