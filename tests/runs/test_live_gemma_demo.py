"""`exactedit demo --model gemma`, small: the real-model loop on Gemma 3 270M through llama.cpp, with
the bundled chat template (the GGUF carries none), a few prompts and short replies, one plain text
and no corpus, so that it fits CI (93 s on 2 idle cores). What must hold at any size: every
prompt is rendered with the given template (bos, Gemma's turns), the protocol's turn end is
`<end_of_turn>` (read off the template, not the file's `<eos>`), the edit through the post-FFN norm
verifies live bitwise, every bar has a verdict, and the phrase rates come from held-out prompts on
both sides."""
from __future__ import annotations

import json
import tomllib

import pytest

from tests import oracles
from tests.runs.demo_checks import check_four_arms, check_verifies_live_bitwise, checked_report

pytestmark = [pytest.mark.live, pytest.mark.slow]

# bundled data prompts whose replies echo "What is the ..." and "What are ..." (the phrases the
# bundled list bans) most: the split is by prompt hash, so every set gets some of them
PROMPTS = ["What is the capital of France?", "What is the main language spoken in Brazil?",
           "What is the largest planet in our solar system?", "What is the boiling point of water?",
           "What is the difference between weather and climate?", "What is the speed of light?",
           "What are the three states of matter?", "How does the heart pump blood?"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    oracles.live_model("gemma")   # missing extra: a skip, or a failure in CI (tests/oracles.py)
    from exactedit.runs.antislop import AntislopConfig, run_antislop
    from exactedit.runs.loop.inputs import BUNDLED, lines as _lines

    assert set(PROMPTS) <= set(_lines(BUNDLED / "gemma" / "antislop" / "prompts.txt"))
    d = tmp_path_factory.mktemp("gemma-demo")
    (d / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    (d / "rates.txt").write_text("\n".join(_lines(BUNDLED / "gemma" / "antislop" / "rate_prompts.txt")[:3]) + "\n")
    cfg = AntislopConfig.for_model("gemma", prompts=str(d / "prompts.txt"), rate_prompts=str(d / "rates.txt"),
                                   texts=(str(BUNDLED / "gemma" / "texts" / "orchard.txt"),), samples=2,
                                   rate_samples=1, max_new=48, verify_tokens=64, n_boot=200, corpus_tokens=0,
                                   strength_grid=(1.0, 0.5))
    return run_antislop(cfg, d / "out")


def test_the_bundled_template_frames_the_data(demo):
    from exactedit.dumps import read_dump
    from exactedit.runs.loop.inputs import BUNDLED

    tpl = str(BUNDLED / "gemma" / "chat_template.jinja")
    chat = demo.records["data"]["chat"]
    assert chat["chat_framing"] == f"user:{tpl}" and chat["format"]["assistant"] == "model"
    assert chat["specials"]["turn_end"] == "<end_of_turn>"
    train = read_dump(demo.out / "data" / "train")
    assert train.manifest.chat_framing == f"user:{tpl}"
    doc = next(x for x in train.docs if "chat" in x.tags)
    toks = train.tokens[doc.first_row:doc.stop]
    assert toks[0] == 2 and toks[1] == 105 and (toks == 2).sum() == 1   # one <bos>, then <start_of_turn>
    proto = tomllib.loads((demo.out / "protocol.toml").read_text())
    assert proto["tokens"]["turn_end"] == 106                           # <end_of_turn>, not <eos> (1)
    assert {1, 2, 105, 106} <= set(proto["tokens"]["specials"])


def test_the_edit_verifies_live_bitwise(demo):
    check_verifies_live_bitwise(demo)


def test_report_carries_verify_bars_and_phrase_rates(demo):
    report = checked_report(demo)
    rates = report["phrase_rates"]
    assert [p["phrase"] for p in rates] == ["What is the", "What are"]
    assert all(p["base"]["replies"] == 3 and p["edited"]["replies"] == 3 for p in rates)
    assert report["corpus"] is None and set(report["seconds"]) >= {"data", "solve", "verify", "rules", "rates"}
    check_four_arms(demo, ["What is the", "What are"], 3)
