"""`exactedit demo --model qwen`, small: the real-model loop end to end on Qwen2.5-Coder-1.5B through
llama.cpp, with a few prompts and short replies so that it fits CI (a few minutes on 2 cores).
What must hold at any size: the edit verifies live (llama.cpp's logits on base and edited files equal
the engine-faithful prediction), every bar has a value and a verdict, the phrase rates come from
held-out prompts on both sides, and the report files are written."""
from __future__ import annotations

import json

import pytest

from tests import oracles
from tests.runs.demo_checks import check_four_arms, check_verifies_live_bitwise, checked_report

pytestmark = [pytest.mark.live, pytest.mark.slow]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    oracles.live_model("qwen")   # missing extra: a skip, or a failure in CI (tests/oracles.py)
    from exactedit.runs.antislop import AntislopConfig, run_antislop
    from exactedit.runs.loop.inputs import BUNDLED, lines as _lines

    d = tmp_path_factory.mktemp("real-demo")
    (d / "prompts.txt").write_text("\n".join(_lines(BUNDLED / "qwen" / "antislop" / "prompts.txt")[:8]) + "\n")
    (d / "rates.txt").write_text("\n".join(_lines(BUNDLED / "qwen" / "antislop" / "rate_prompts.txt")[:3]) + "\n")
    # the phrase list as `exactedit discover --model` writes it: the demo starts from discover's JSON
    (d / "found.json").write_text(json.dumps({"phrases": [
        {"phrase": "Here's an example", "z": 3.2, "ban_phrase": "Here's an"}, {"phrase": "example", "z": 3.1},
        {"phrase": "you can use", "z": 2.9}, {"phrase": "you can", "z": 2.8}]}))   # --top 2: the one word skipped
    cfg = AntislopConfig(prompts=str(d / "prompts.txt"), rate_prompts=str(d / "rates.txt"), samples=1,
                         phrases=str(d / "found.json"), top=2,
                         rate_samples=1, max_new=64, verify_tokens=64, n_boot=200, corpus_tokens=900)
    return run_antislop(cfg, d / "out")


def test_the_edit_verifies_live_bitwise(demo):
    check_verifies_live_bitwise(demo)


def test_report_carries_verify_bars_and_phrase_rates(demo):
    report = checked_report(demo)
    rates = report["phrase_rates"]
    assert [p["phrase"] for p in rates] == ["Here's an", "you can use", "Here's an example"]   # solved, then watched
    assert all(p["base"]["replies"] == 3 and p["edited"]["replies"] == 3 for p in rates)
    assert set(report["artefacts"]) >= {"base", "edited"}
    check_four_arms(demo, ["Here's an", "you can use", "Here's an example"], 3)


def test_rate_prompts_are_not_in_the_data(demo):
    from exactedit.dumps import read_dump
    from exactedit.native.llamacpp.chat import short_hash

    rate_chars = {f"p-{short_hash(p)}" for p in (demo.out.parent / "rates.txt").read_text().split("\n") if p}
    for name in ("train", "heldout", "collateral", "anchors"):
        assert not rate_chars & {doc.character for doc in read_dump(demo.out / "data" / name).docs}


def test_the_default_variant_corpus_holds_and_strength_on_dev(demo):
    """The demo's default solve: the corpus's three parts (solve held, dev choosing the strength,
    collateral scored by (d)), word holds, and the strength chosen per phrase on dev, with its
    frontier in report.json, report.md and frontier.png."""
    report = json.loads(demo.files["json"].read_text())
    parts = {p["name"]: p for p in report["corpus"]["parts"]}
    assert set(parts) == {"solve", "dev", "collateral"} and all(p["rows"] > 0 for p in parts.values())
    st = report["strength"]
    assert st["on"] == "dev" and st["frontier"] and set(st["chosen"]) == {"Here's an", "you can use"}
    assert demo.records["solve"]["report"]["conditions"]["word@plausible"] > 0
    names = {b["name"] for b in report["bars"]}
    assert any(n.startswith("d_low:") for n in names)
    coll = [b for b in report["bars"] if b["name"].startswith("d_low:")]
    assert sum(b["n"] for b in coll) > sum(report["corpus"]["parts"][2]["uses"].values()) - 1
    assert demo.files["frontier_png"].stat().st_size > 0
    assert "strength per phrase, chosen on dev" in demo.files["md"].read_text()


def test_new_slop_and_discovery_on_the_models_own_replies(demo):
    """report.json's `new_slop` (discover on the edited rate replies against the base ones), and
    discover on the model's own replies (the data's and the rates' base side, both replies files)
    against the bundled plain texts: Qwen's known phrases rank among the top."""
    from exactedit.evals.discover import discover, human_texts, model_texts
    from exactedit.runs.loop.inputs import BUNDLED

    report = json.loads(demo.files["json"].read_text())
    assert "new_slop" in report and "## new slop" in demo.files["md"].read_text()
    if report["new_slop"] is not None:
        assert report["new_slop"]["model"]["texts"] == 3 and report["new_slop"]["human"]["texts"] == 3
        assert report["new_slop"]["settings"]["background"] == "human"
    texts = model_texts([demo.out / "data" / "replies.json", demo.files["replies"]], sides=["base"])
    assert len(texts) == 8 + 3 and all(t.prompt for t in texts)
    d = discover(texts, human_texts([BUNDLED / "qwen" / "texts"]), top=30, min_z=2.0)
    found = {p.phrase.lower() for p in d.phrases}
    assert found & {"you can", "here's", "here's an example", "you can use", "in this", "an example"}, sorted(found)
    assert (demo.out / "phrases.txt").read_text().splitlines()[1:] == ["Here's an", "you can use"]
