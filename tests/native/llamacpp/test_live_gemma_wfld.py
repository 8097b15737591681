"""`solve wfld` live on the real Gemma 3 270M: the anti-slop edit of blk.17.ffn_down (Q6_K) through
Gemma's post-FFN norm (R' = R + rmsnorm(W_down hh) * post_ffw_norm), shipped as Q6_K bytes,
verified on llama.cpp bit for bit.

The phrase is the model's own: Gemma 3 270M (by all signs the pretrained model, not the instruction-tuned
one: its GGUF has no chat template, and its greedy replies often echo the question) answered
"Write a short note to a friend who just moved to a new city." in its turn format
(`<bos><start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n`, greedy) with "Purchase a new
car." (its other greedy replies: "You can't get a better job than this.", "You are a student in a
class."). So the documents are short chats in that format whose replies say "a new car", with
legitimate uses of " car" elsewhere ("the car", "her car"). The row roles come from Gemma's turn
framing (<start_of_turn> / <end_of_turn>, role "model"), given here because the file has no template;
the special tokens and the turn end are named (`--special`, `--turn-end <end_of_turn>`): the file's
own eos is <eos>, not the turn end.

What is checked: the solve (the library call behind `exactedit solve wfld`) converges through the
norm on the shipped Q6_K bytes; `apply` writes the bundle into a copy of the tied GGUF (an ffn_down
edit leaves the tied token_embd alone, so no untie is needed); llama.cpp's logits on base and edited
files equal the engine-faithful prediction bit for bit (`native.verify.live.check_edit`); and the
engine's change of the targeted logit is the solve's."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tests import oracles

pytestmark = pytest.mark.live

PHRASE = "new car"
DOWN = "blk.17.ffn_down.weight"
SPECIALS = ("<end_of_turn>", "<start_of_turn>", "<eos>", "<bos>", "<pad>")


def _turns(*pairs) -> str:
    return "<bos>" + "".join(f"<start_of_turn>user\n{u}<end_of_turn>\n<start_of_turn>model\n{m}<end_of_turn>\n"
                             for u, m in pairs)


DOCS = {   # role -> [(name, text, tags)]
    "train": [("chat-train", _turns(
        ("What should I buy with my bonus?", "Purchase a new car. A new car is safer than an old one."),
        ("Is it worth it?", "Yes. My neighbour parks the car in the garage. Buying a new car was the best thing "
                            "she did.")), ("chat", "slop"))],
    "heldout": [("chat-heldout", _turns(
        ("My old car broke down. What now?", "Purchase a new car. A new car will get you to work, and you can "
                                             "sell the old car.")), ("chat", "slop"))],
    "collateral": [("plain-collateral", "<bos>The car stopped at the light. She washed her car and drove the car "
                                        "to the coast.\n", ("plain", "collateral"))],
    "anchors": [("plain-anchor", "<bos>The weather was mild, and the children played in the park until the "
                                 "evening.\n", ("anchor", "plain")),
                ("chat-anchor", _turns(("How do I boil an egg?", "Place the egg in boiling water for nine "
                                                                 "minutes.")), ("anchor", "chat"))],
}


@pytest.fixture(scope="module")
def gemma():
    return oracles.live_model("gemma")  # missing extra: a skip, or a failure in CI (tests/oracles.py)


@pytest.fixture(scope="module")
def captured(gemma, tmp_path_factory):
    """One llama.cpp dump per role (default settings: one micro-batch per document), row roles from
    Gemma's turn framing; the train capture keeps the engine's logits (the verify baseline)."""
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
    from exactedit.native.llamacpp.chat import ModelChat
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.quant import gguf
    from exactedit.quant.model.chat_template import ChatFormat
    from exactedit.quant.model.specials import model_specials
    from exactedit.solvers.tail.model import load_tokens

    t0 = time.perf_counter()
    d = tmp_path_factory.mktemp("gemma-wfld")
    with gguf.open(gemma) as g:
        chat = ModelChat(gemma, None, ChatFormat("<start_of_turn>", "<end_of_turn>", "\n", "model"), "test:gemma",
                         model_specials(g), load_tokens(g))
    with LlamaEngine(gemma) as engine:
        tokens = {role: [(n, engine.tokenize(text), tags) for n, text, tags in docs] for role, docs in DOCS.items()}
    caps = {role: capture_dump(gemma, [CaptureDoc(n, tk, source="test", character=n, tags=tags, roles=chat.roles(tk))
                                       for n, tk, tags in docs], d / role, keep_logits=role == "train")
            for role, docs in tokens.items()}
    (d / "phrases.txt").write_text(PHRASE + "\n")
    return d, caps, time.perf_counter() - t0


@pytest.fixture(scope="module")
def solved(gemma, captured):
    from exactedit.runs.solve.wfld import WfldInputs, solve_wfld
    from exactedit.solvers.l47.config import WfldConfig

    d, caps, _ = captured
    cfg = WfldConfig(specials=SPECIALS, turn_end="<end_of_turn>", gn_iters=3)
    inputs = WfldInputs(str(gemma), str(d / "phrases.txt"), (str(caps["train"].path),), (str(caps["heldout"].path),),
                        (str(caps["collateral"].path),), (str(caps["anchors"].path),))
    t0 = time.perf_counter()
    res = solve_wfld(cfg, inputs, d / "bundle")
    return res, time.perf_counter() - t0


@pytest.fixture(scope="module")
def verified(gemma, captured, solved):
    """check_edit on the train document: the engine on base and on the edited copy against the
    engine-faithful prediction; and the edited engine's own logits (for the targeted logit)."""
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.native.verify.live import baseline_from_dump, check_edit
    from exactedit.solvers.apply import apply_bundle

    d, caps, _ = captured
    res, _ = solved
    t0 = time.perf_counter()
    base = baseline_from_dump(gemma, caps["train"].path, caps["train"].logits)
    edited = apply_bundle(res.bundle, gemma, d / "edited.gguf").out
    report = check_edit(base, res.bundle, edited=edited)
    with LlamaEngine(edited, base.settings) as engine:
        logits = engine.evaluate(base.tokens).logits
    return base, report, logits, time.perf_counter() - t0


def test_the_solve_goes_through_the_post_ffn_norm(gemma, captured, solved):
    """The tail is Gemma's (post-FFN norm, Q6_K ffn_down, tied Q8_0 head); the mined positions are
    the phrase's; the Gauss-Newton rounds, scored exactly on the shipped Q6_K bytes through the
    norm and the head, converge (measured: max exact error 0.052, 0.0039, 0.0054 nats over the
    rounds, the last two at the Q6_K rounding's floor; 0.02 allowed), and p(" car") drops at the
    solved train positions (measured 0.34 -> 0.05 mean) and at the separate held-out document's
    (0.76 -> 0.13), which the solve never saw."""
    from exactedit.quant import gguf
    from exactedit.solvers.bundle import read_bundle
    from exactedit.solvers.tail.model import load_tail

    res, seconds = solved
    with gguf.open(gemma) as g:
        tail = load_tail(g)
    assert tail.l47.w_post is not None and tail.spec.tied and tail.spec.tensor("ffn_down").type_name == "Q6_K"
    (edit,) = read_bundle(res.bundle).edits
    assert (edit.tensor, edit.type_name) == (DOWN, "Q6_K") and res.report["shipping"]["feedback"]
    counts = res.report["mining"]["counts"]
    assert counts["train:train"]["ftpo"] >= 3 and counts["heldout:heldout"]["ftpo"] >= 1
    its = res.report["iterations"]
    err = [max(it["exact_err"].values()) for it in its]
    assert err[-1] < 0.02 and err[-1] < err[0], err
    (ph,) = res.report["phrases"]
    assert ph["train"]["p_edit"] < 0.5 * ph["train"]["p_base"], ph
    assert ph["heldout"]["p_edit"] < ph["heldout"]["p_base"], ph      # a separate document, never solved on
    print(f"\ncapture {captured[2]:.1f} s, solve {seconds:.1f} s; exact error per round {err}; "
          f"p(car) train {ph['train']['p_base']:.3f} -> {ph['train']['p_edit']:.3f}, "
          f"held out {ph['heldout']['p_base']:.3f} -> {ph['heldout']['p_edit']:.3f}")


def test_the_edit_verifies_live_bitwise(verified):
    """llama.cpp on the edited GGUF computes exactly the logits exactedit predicts from the base
    dump and the bundle's Q6_K bytes (engine-faithful: Q8_K activations into the Q6_K ffn_down,
    float32 norms, the Q8_0 head), and the edit moved them."""
    base, report, logits, seconds = verified
    assert report.passed, [c.failures for c in report.checks]
    assert all(c.stats.bitwise for c in report.checks), report.checks
    assert report.checks[1].stats.max_abs == 0.0
    assert report.edit_effect.kl_max > 1e-2
    print(f"\nverify {seconds:.1f} s; edit effect: mean KL {report.edit_effect.kl_mean:.3g}, "
          f"max KL {report.edit_effect.kl_max:.3g}")


def test_the_targeted_logit_moved_as_solved(solved, verified):
    """At each solved train position, the engine's change of the rejected logit (edited minus
    base llama.cpp, same tokens and settings) against the solve's exact change (`rej_dlogit`: the
    float32 tail on the shipped bytes, no activation quantization). The engine's own change is
    the engine-faithful prediction's bit for bit (test above); it differs from the float path's
    by what the engine rounds and the float path does not (Q8_K activations into ffn_down, Q8_0
    into the head). Measured on a train document like this one, over every row and its 8 top
    tokens and next token: |engine change - float change| median 0.024, p99 0.11, max 0.16 nats
    (the absolute logits differ by up to 0.93: Gemma's residual reaches 6e4), so 0.2 allowed,
    and within 5% where the solve moved the logit by more than a nat (measured: -3.18 vs -3.21,
    and -0.021 vs +0.002 at a position already below its alternatives, target 0)."""
    res, _ = solved
    base, report, logits, _ = verified
    pos = [p for p in res.report["alternatives"]["positions"] if p["trace"] == "train:train"]
    assert pos
    moved = []
    for p in pos:
        row = p["row"]
        tok = int(base.tokens[row + 1])
        engine = float(logits[row, tok]) - float(base.logits[row, tok])
        assert abs(engine - p["rej_dlogit"]) < 0.2, (row, engine, p["rej_dlogit"])
        if abs(p["rej_dlogit"]) > 1.0:
            assert abs(engine - p["rej_dlogit"]) < 0.05 * abs(p["rej_dlogit"]), (row, engine, p["rej_dlogit"])
        moved.append((row, round(engine, 4), round(p["rej_dlogit"], 4)))
    assert min(m[1] for m in moved) < -2.0, moved
    print(f"\n(row, engine dlogit, solved dlogit): {moved}")
