"""Checks every real-model demo's live test makes, whatever the model (test_live_real_demo.py: Qwen,
test_live_gemma_demo.py: Gemma 3 270M)."""
from __future__ import annotations

import json


def check_verifies_live_bitwise(demo) -> None:
    """The edit verifies live: llama.cpp's logits on base and edited files equal the prediction, bit for bit."""
    v = demo.records["verify"]
    assert v["passed"], [c["failures"] for c in v["checks"]]
    assert all(c["stats"]["bitwise"] for c in v["checks"])
    assert v["edit_effect"]["max_abs"] > 0              # the edit changed the engine's logits


def checked_report(demo) -> dict:
    """report.json, checked for what every demo's report carries: verify passed, every bar with a
    verdict, the targets."""
    report = json.loads(demo.files["json"].read_text())
    assert report["verify"]["passed"] is True
    assert report["bars"] and all("pass" in b and b["bar"] for b in report["bars"])
    assert {t["name"] for t in report["targets"]} >= {"bars (a)-(g)", "verify live (bitwise)",
                                                      "variant artefacts, edited replies"}
    return report


def check_four_arms(demo, phrases, replies_per_arm: int) -> None:
    """The rates come in four arms (base, rules, weights, both) on the same prompts and seeds, every
    reply's text in replies.json, edited.gguf and rules.json shipped side by side with their
    sha256 in the report, and the cost on ordinary text measured."""
    from exactedit.files import file_sha256

    report = json.loads(demo.files["json"].read_text())
    assert [row["phrase"] for row in report["arms"]] == list(phrases)
    for row in report["arms"]:
        assert all(row[a]["replies"] == replies_per_arm for a in ("base", "rules", "weights", "both"))
    replies = json.loads(demo.files["replies"].read_text())
    assert [x["side"] for x in replies] == [a for a in ("base", "rules", "weights", "both") for _ in range(replies_per_arm)]
    assert [(x["prompt"], x["seed"]) for x in replies if x["side"] == "base"] \
        == [(x["prompt"], x["seed"]) for x in replies if x["side"] == "both"]
    assert all(x["text"] for x in replies)
    shipped = report["shipped"]
    assert shipped["edited.gguf"] == file_sha256(demo.out / "edited.gguf")
    assert shipped["rules.json"] == file_sha256(demo.out / "rules.json")
    cost = report["cost"]
    assert cost["kl"] and all(k["rows"] > 0 and k["kld"]["mean"] >= 0 and k["ppl_base"] > 1 for k in cost["kl"].values())
    assert set(cost["diversity"]) == {"base", "rules", "weights", "both"}
    assert all(0 < d["mattr"] <= 1 for d in cost["diversity"].values())
    for key in ("md", "rates_png", "arms_png", "collateral_png"):
        assert demo.files[key].stat().st_size > 0

