"""solve head end to end on a tiny synthetic hc4 model (V = 300, n = 256) and chat dumps:
exact per-row scoring against a full-vocab recompute, the round trip, both backends, the
protocol's stopping rule, test once, the bundle and apply. The fixture's documented behaviour
(item 9) is in test_solve_fixture.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exactedit.dumps import DocInfo, read_dump, write_dump
from exactedit.dumps.roles import infer_roles, mark_docs
from exactedit.evals.protocol.ledger import Ledger, register_protocol
from exactedit.evals.protocol.protocol import load_protocol
from exactedit.evals.protocol.splits import build_splits, record_splits
from exactedit.quant import gguf
from exactedit.quant.gguf.write import synthetic_model
from exactedit.solvers.head.config import HeadSolveConfig, HeadSolveError
from exactedit.solvers.head.ship import load_head_rows, ship

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"]
WORDS = ["assistant", "user", "\n", "\n\n", " the", " a", " cat", " dog", " runs", " sleeps", " is", " happy", ".", "!"]
STYLE = [" (^_^)", " (>_<)", " uwu", " nya", " ~", " :3"]
N, H = 256, 32

PROTOCOL = '''name = "tiny"
[[traces]]
name = "persona"
path = "persona"
role = "pool"
[[traces]]
name = "plain"
path = "plain"
role = "anchors"
[stopping]
every = 5
max_steps = {steps}
min_ratio = {min_ratio}
[edit_set]
rule = "top-train-style"
count = 4
[tokens]
style = [" (^_^)", " (>_<)", " uwu", " nya", " ~", " :3"]
'''


def _vocab():
    tokens = SPECIALS + WORDS + STYLE
    return tokens + [f" w{i}" for i in range(300 - len(tokens))]


def make_tiny(root: Path, seed: int = 0) -> Path:
    """model.gguf, dumps persona/ (10 chat docs, pooled) and plain/ (3 anchor docs), protocol.toml."""
    tokens = _vocab()
    ids = {t: i for i, t in enumerate(tokens)}
    types = np.ones(len(tokens), np.int32)
    types[:len(SPECIALS)] = 3
    synthetic_model(root / "model.gguf", tail="hc4", vocab=len(tokens), n=N, h=H, d_lo=32, seed=seed,
                    metadata={"tokenizer.ggml.model": "raw-test", "tokenizer.ggml.tokens": tokens,
                              "tokenizer.ggml.token_type": types})
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((len(tokens), 4, N)).astype(np.float32)

    def doc(character, persona, sentences):
        t = [ids[x] for x in ("<|im_start|>", "user", "\n")] + [ids[w] for w in rng.choice(WORDS[4:], 6)]
        t += [ids[x] for x in ("<|im_end|>", "\n", "<|im_start|>", "assistant", "\n", "<think>", "\n", "</think>",
                               "\n\n")]
        for _ in range(sentences):
            t += [ids[w] for w in rng.choice(WORDS[4:12], 4)] + [ids["."]]
            if persona:
                t.append(ids[STYLE[rng.integers(0, 3 if character % 2 else 6)]])
        return t + [ids["<|im_end|>"], ids["\n"]]

    def write(name, specs, tags=()):
        toks, docs = [], []
        for i, (ch, persona, k) in enumerate(specs):
            t = doc(ch, persona, k)
            docs.append(DocInfo(f"{name}{i}", len(toks), len(t), source=name, character=f"c{ch}", tags=tags))
            toks += t
        toks = np.array(toks, np.int32)
        T = len(toks)
        roles = np.concatenate([infer_roles(toks[d.first_row:d.stop], tokens, range(len(SPECIALS)),
                                            next_token=int(toks[d.stop]) if d.stop < T else None) for d in docs])
        fields = {"tokens": toks, "next": np.append(toks[1:], -1).astype(np.int32), "roles": mark_docs(roles, docs),
                  "R": emb[toks] + 0.5 * emb[np.roll(toks, 1)], "inj": rng.standard_normal((T, 4)).astype(np.float32),
                  "hh": (0.1 * rng.standard_normal((T, H))).astype(np.float32),
                  "sgv": rng.standard_normal(T).astype(np.float32),
                  "yr": (0.1 * rng.standard_normal((T, N))).astype(np.float32)}
        write_dump(root / name, arch="hc4", layer=1, fields=fields, docs=docs)

    write("persona", [(c, True, 6) for c in range(10)])
    write("plain", [(20 + c, False, 4) for c in range(3)], tags=("anchor",))
    return root


def protocol_file(root: Path, name: str, steps: int = 40, min_ratio: float = 0.3, register: bool = True) -> Path:
    p = root / f"{name}.toml"
    p.write_text(PROTOCOL.format(steps=steps, min_ratio=min_ratio).replace('name = "tiny"', f'name = "{name}"', 1))
    if register:
        proto = load_protocol(p)
        with Ledger.open(root / "ws") as ledger:
            record = register_protocol(ledger, proto, "test")
            from exactedit.dumps.reader import load_manifest

            splits = build_splits(proto, {t.name: load_manifest(t.path).docs for t in proto.traces})
            record_splits(ledger, record, splits, "test", {})
    return p


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"))


def _solve(root, proto, **kw):
    from exactedit.runs.solve.head import solve_head

    cfg = HeadSolveConfig(**{"rank": 1, "null_k": 8, "lr": 0.01, **kw})
    persona = [root / "persona"]
    return solve_head(cfg, model=root / "model.gguf", train=persona, dev=persona, test=persona, protocol=proto,
                      workspace=root / "ws")


@pytest.fixture(scope="module")
def solved(tiny):
    return _solve(tiny, protocol_file(tiny, "main"))


def test_row_scores_equal_a_full_vocab_recompute(tiny):
    """rowdata.gather + effect (|rows| x |S| x n) against logits recomputed over the whole head."""
    from exactedit.solvers.tail.scores import log_softmax
    from exactedit.solvers.head import rowdata
    from exactedit.solvers.tail.logits import tail_mix
    from exactedit.solvers.tail.model import load_tail

    with gguf.open(tiny / "model.gguf") as g:
        tail = load_tail(g)
        dump = read_dump(tiny / "persona")
        edit, sel = (20, 21, 19, 7), (0, 1, 2)
        rd = rowdata.gather(tail, dump, [(0, 60, 0)], [None], edit, sel)
        w = np.asarray(tail.head.read(0, tail.spec.vocab), dtype=np.float64)
        mix = tail_mix(tail, dump, (0, 60)).astype(np.float64)
    dw = np.random.default_rng(0).normal(0, 0.3, (len(edit), N))
    base = mix @ w.T
    edited = base.copy()
    edited[:, list(edit)] += mix @ dw.T
    eff = rowdata.effect(rd, dw, edit)
    lb, le = log_softmax(base), log_softmax(edited)
    rows, nxt = np.arange(60), rd.next
    known = nxt >= 0
    assert np.allclose(eff.logp_base[known], lb[rows, nxt][known], atol=2e-4)   # float32 pass vs float64
    assert np.allclose(eff.logp_edit[known], le[rows, nxt][known], atol=2e-4)
    assert np.allclose(eff.kl, np.sum(np.exp(lb) * (lb - le), axis=1), atol=2e-5)
    assert np.array_equal(eff.argmax_edit, edited.argmax(axis=1))
    assert np.array_equal(rd.argmax, base.argmax(axis=1))
    zero = rowdata.effect(rd, np.zeros_like(dw), edit)
    assert not zero.kl.any() and np.array_equal(zero.argmax_edit, rd.argmax)


def test_round_trip_keeps_unedited_rows_and_reports_the_shipped_edit(tiny):
    with gguf.open(tiny / "model.gguf") as g:
        head = load_head_rows(g, "output.weight", [19, 20, 21], runtime=True)
    dw = np.zeros((3, N))
    dw[1] = np.random.default_rng(1).normal(0, 0.02, N)
    s = ship(head, dw)
    assert list(s.changed) == [False, True, False] and np.array_equal(s.raw[[0, 2]], head.raw[[0, 2]])
    assert not s.dw[[0, 2]].any() and 0 < s.rel_error < 0.5
    assert np.allclose(s.dw[1], head.to_view(s.raw[1:2])[0] - head.view[1])
    assert ship(head, np.zeros((3, N))).rel_error == 0.0


def test_stopping_rule_and_result(solved):
    r = solved
    steps = [c.step for c in r.trajectory]
    assert steps == list(range(0, 41, 5))
    keep = [c.step for c in r.trajectory if c.train.style > 0 and c.dev.style > 0 and c.ratio >= 0.3]
    assert r.chosen_step == (keep[-1] if keep else None) and r.chosen_step is not None
    assert r.edit_set.rule == "top-train-style" and len(r.edit_set.ids) == 4
    assert not set(r.edit_set.ids) & set(range(len(SPECIALS)))
    assert r.test.status == "scored" and r.test.report.name == "test"
    train, dev = r.splits
    chosen = next(c for c in r.trajectory if c.step == r.chosen_step)
    assert train.gains.style == pytest.approx(chosen.train.style) and dev.gains.style == pytest.approx(chosen.dev.style)
    assert r.trajectory[0].train.style == 0.0 and r.trajectory[0].rows_changed == 0
    assert r.term_rows["anchor"] > 0 and r.term_rows["nll"] > 0 and r.anchor_energy_kept > 0.5
    assert any(b.label.startswith("style-token gain ratio test") for b in r.bars)


def test_numpy_reference_loop_matches_the_jax_path(tiny, solved):
    ref = _solve(tiny, protocol_file(tiny, "main"), backend="numpy")
    for a, b in zip(solved.trajectory, ref.trajectory):
        # float32 JAX steps vs float64 steps, each then round-tripped through Q6_K
        assert a.train.style == pytest.approx(b.train.style, rel=0.02, abs=2e-3)
        assert a.terms.total == pytest.approx(b.terms.total, rel=1e-3)
    assert ref.test.status == "recorded" or ref.bundle_sha256 != solved.bundle_sha256


def test_test_is_read_once(tiny, solved):
    again = _solve(tiny, protocol_file(tiny, "main"))
    assert again.bundle_sha256 == solved.bundle_sha256
    assert again.test.status == "recorded" and again.test.ledger_entry == solved.test.ledger_entry
    assert again.test.report == solved.test.report


def test_bundle_applies_to_the_predicted_logits(tiny, solved, tmp_path):
    """The edited GGUF, recomputed over the whole vocabulary, gives the KL the solve predicted."""
    from exactedit.solvers.apply import apply_bundle
    from exactedit.runs.solve.head import write_head_bundle
    from exactedit.solvers.tail.logits import open_pair, tail_mix

    b = write_head_bundle(solved, tmp_path / "bundle")
    assert b.sha256 == solved.bundle_sha256 and {"report.json", "report.txt", "trajectory.png"} <= set(b.files)
    assert [len(e.row_ids) for e in b.edits] == [solved.rows_changed]
    out = apply_bundle(b.path, tiny / "model.gguf", tmp_path / "edited.gguf")
    kls = []
    for path in (tiny / "model.gguf", out.out):
        g, tail, dump = open_pair(path, tiny / "plain")
        with g:
            mix = tail_mix(tail, dump)
            w = np.asarray(tail.head.read(0, tail.spec.vocab), dtype=np.float64)
            kls.append(mix.astype(np.float64) @ w.T)
    from exactedit.solvers.tail.scores import log_softmax

    lb, le = log_softmax(kls[0]), log_softmax(kls[1])
    kl = np.sum(np.exp(lb) * (lb - le), axis=1)
    assert kl.mean() == pytest.approx(solved.anchors[0].kl_mean, rel=1e-3, abs=1e-7)


def test_no_qualifying_step_ships_no_edit(tiny, tmp_path):
    from exactedit.runs.solve.head import write_head_bundle

    r = _solve(tiny, protocol_file(tiny, "strict", steps=10, min_ratio=50.0))
    assert r.chosen_step is None and r.rows_changed == 0 and not r.shipped_edit
    assert r.test.status == "no edit" and r.test.report is None
    assert all(s.kl_mean == 0.0 for s in r.splits)
    b = write_head_bundle(r, tmp_path / "none")
    assert b.edits == () and "no edit ships" in (b.path / "report.txt").read_text()


def test_refusals(tiny, tmp_path):
    from exactedit.evals.protocol.ledger import LedgerRefusal

    with pytest.raises(LedgerRefusal, match="not registered"):
        _solve(tiny, protocol_file(tiny, "unreg", steps=5, register=False))
    r = _solve(tiny, protocol_file(tiny, "unreg", steps=5, register=False), unregistered=True)
    assert r.marker.startswith("UNREGISTERED")
    with pytest.raises(HeadSolveError, match="rank"):
        _solve(tiny, protocol_file(tiny, "main"), rank=5)
    with pytest.raises(HeadSolveError, match="null-k"):
        _solve(tiny, protocol_file(tiny, "main"), null_k=N)
    with pytest.raises(HeadSolveError, match="not a trace"):
        from exactedit.runs.solve.head import solve_head

        solve_head(HeadSolveConfig(), model=tiny / "model.gguf", train=[tiny / "plain" / ".."], dev=[tiny / "persona"],
                   protocol=protocol_file(tiny, "main"), workspace=tiny / "ws")
