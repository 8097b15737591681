"""`solve wfld` end to end on a Gemma 2 style tail: the synthetic world's post-FFN
norm tail written as architecture gemma2, with its `gemma2.final_logit_softcapping` (4.0: this
world's logits reach 3.4, so the cap bends them by up to 20%) and `gemma2.attn_logit_softcapping`
keys. The final softcap is read from the GGUF and applied exactly wherever the WFLD path computes
logits: the Gauss-Newton rounds' exact errors (through the cap's tanh), the strength frontier, the
re-score, and `exactedit logits` on the applied GGUF agree to float32 ulps. The attention softcap
acts before the dumped activations, inside llama.cpp, and is no part of the tail."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.runs.solve.wfld import WfldInputs, solve_wfld
from exactedit.quant import gguf
from exactedit.solvers.apply import apply_bundle
from exactedit.solvers.tail.forward.head_ref import apply_softcap
from exactedit.solvers.tail.logits import write_logits
from exactedit.solvers.tail.model import load_tail
from tests.solvers.l47.synth import build_world
from tests.solvers.l47.test_post_norm_solve import CFG

CAP = 4.0


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    root = tmp_path_factory.mktemp("wfld-softcap")
    w = build_world(root, tail="post", softcap=CAP)
    inputs = WfldInputs(str(w["model"]), str(w["phrases"]), (str(w["train"]),), (str(w["heldout"]),),
                        (str(w["collateral"]),), (str(w["anchors"]),))
    return w, inputs, solve_wfld(CFG, inputs, root / "bundle")


def test_the_tail_reads_gemma2s_final_softcap(solved):
    w, _, _ = solved
    with gguf.open(w["model"]) as g:
        tail = load_tail(g)
        assert g.get("general.architecture") == "gemma2" and g.get("gemma2.attn_logit_softcapping") == 50.0
    assert tail.softcap == CAP and tail.l47.w_post is not None


def test_rounds_reach_the_targets_through_the_cap(solved):
    """The exact error of each round is measured through the capped logits (the linearization's
    cotangent carries the cap's slope 1 - tanh^2): as on the uncapped post-norm world, to the Q6_K
    rounding floor."""
    _, _, res = solved
    its = res.report["iterations"]
    assert max(its[-1]["exact_err"].values()) < 0.05, its[-1]["exact_err"]
    assert its[-1]["mean_change"]["rejected"] < 0 and its[-1]["mean_change"]["alternative"] > 0
    st = res.report["strength"]
    assert st["on"] == "dev" and set(st["chosen"]) == set(res.mining.phrases)


def test_rescore_equals_exactedit_logits_on_the_applied_gguf(solved, tmp_path):
    w, _, res = solved
    out = tmp_path / "edited.gguf"
    apply_bundle(res.bundle, w["model"], out)
    lr = write_logits(out, w["heldout"], tmp_path / "edit.npy")
    raw = np.load(tmp_path / "edit.npy").astype(np.float64)
    assert np.abs(raw).max() < CAP                  # the logits written are the capped ones
    lg = raw - lr.lse[:, None]
    s = res.scores
    sel = np.flatnonzero(np.array([s.docs[i].trace for i in s.doc]) == "heldout:heldout")
    nxt = np.asarray(read_dump(w["heldout"]).next)
    r = np.flatnonzero(nxt >= 0)
    np.testing.assert_allclose(s.logp_edit[sel][r], lg[r, nxt[r]], rtol=0, atol=2e-5)
    # and the cap is what makes them agree: the uncapped logits' log-probs are elsewhere
    uncapped = np.arctanh(raw / CAP) * CAP
    lu = uncapped - np.log(np.exp(uncapped - uncapped.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - uncapped.max(1, keepdims=True)
    assert np.abs(lu[r, nxt[r]] - s.logp_edit[sel][r]).max() > 0.05
    np.testing.assert_allclose(apply_softcap(uncapped, CAP), raw, rtol=0, atol=1e-5)
