"""Checks every real-model demo's live test makes, whatever the model (test_live_real_demo.py: Qwen,
test_live_gemma_demo.py: Gemma 3 270M)."""
from __future__ import annotations

import json


def check_verifies_live_bitwise(demo) -> None:
    """The edit verifies live: llama.cpp's logits on base and edited files equal the prediction, bit for bit."""
    assert demo.verify.passed, [c.failures for c in demo.verify.checks]
    assert all(c.stats.bitwise for c in demo.verify.checks)
    assert demo.verify.edit_effect.max_abs > 0          # the edit changed the engine's logits


def checked_report(demo) -> dict:
    """report.json, checked for what every demo's report carries: verify passed, every bar with a
    verdict, the targets."""
    report = json.loads(demo.files["json"].read_text())
    assert report["verify"]["passed"] is True
    assert report["bars"] and all("pass" in b and b["bar"] for b in report["bars"])
    assert {t["name"] for t in report["targets"]} >= {"bars (a)-(g)", "verify live (bitwise)",
                                                      "variant artefacts, edited replies"}
    return report
