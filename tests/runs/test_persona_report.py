"""A persona run's report from its stages' records, without an engine: the targets, the text and the
PNG, for a run whose rule shipped an edit and for one whose rule shipped none."""
from __future__ import annotations

import copy
import json

import pytest

from exactedit.runs.persona.report import REPORTS, persona_targets, write_reports


def _side(shown, n, turn_end=0.9):
    return {"style": {"replies": n, "showing": shown, "rate": shown / n, "ci": [0.0, 1.0]},
            "turn_end": turn_end, "empty": 0.0, "mean_tokens": 60.0}


def _split(name, style):
    return {"name": name, "rows": 100, "docs": 4, "kl_mean": 0.001, "kl_p99": 0.01, "kl_max": 0.1, "top1_agree": 1.0,
            "special_flips": 0, "turn_ends": 3, "turn_end_p_base": 0.9, "turn_end_p_edit": 0.9,
            "gains": {"all": 0.1, "style": style, "n_style": 4, "ordinary": -0.001, "n_ordinary": 90}}


def _bar(label, number, threshold, op, passed):
    return {"key": label, "bar": "persona", "label": label, "number": number, "threshold": threshold, "op": op,
            "passed": passed, "n": 4, "ci": [None, None], "scope": "test"}


SHIPPED = {
    "preflight": {"head": "output.weight", "tied": False},
    "replies": {"sides": {"persona": _side(12, 12), "plain": _side(0, 12)}, "gap": {"change": 1.0, "ci": [1.0, 1.0]},
                "splits": {"train": 8, "dev": 2, "test": 2}},
    "data": {"sets": {"train": {"dump": "t", "docs": 8, "rows": 600}}, "edit_set": [9], "edit_tokens": ["Greetings"],
             "initiations": {"train": {"Greetings": 8}, "dev": {"Greetings": 2}, "test": {"Greetings": 2}},
             "style_replies": {"train": 8, "dev": 2, "test": 2}},
    "solve": {"shipped_edit": True, "chosen_step": 80, "rows_changed": 1, "edit_norm_ratio": 0.6, "bundle": "head",
              "best_ratio": {"step": 5, "ratio": 1.05}, "stopping": {"every": 5, "max_steps": 80, "min_ratio": 0.75},
              "splits": [_split("train", 18.0), _split("dev", 17.5)], "anchors": [_split("anchors", None)],
              "test": {"status": "scored", "ledger_entry": 3, "report": _split("test", 18.2)},
              "bars": [_bar("style-token gain ratio test/train", 1.01, 0.7, ">=", True),
                       _bar("mean KL, test documents", 0.06, 0.005, "<=", False)]},
    "apply": {"edited": "edited.gguf", "sha256": "ab" * 32},
    "verify": {"passed": True, "checks": [{"stats": {"bitwise": True}}, {"stats": {"bitwise": True}}],
               "edit_effect": {"max_abs": 22.7}},
    "rates": {"prompts": 4, "seeds": [10000], "sides": {"base": _side(0, 4), "edited": _side(3, 4),
                                                        "persona prompt": _side(4, 4)},
              "change": {"change": 0.75, "ci": [0.5, 1.0]},
              "token_shifts": [{"text": "Greetings", "base_per_1k": 0.0, "edited_per_1k": 12.0}]},
    "cost": {"kl": {"plain": {"rows": 300, "kld": {"mean": 0.04, "p99": 0.3, "max": 9.0}, "same_top": 0.99,
                              "ppl_base": 12.0, "ppl_edited": 12.5,
                              "split": {"reply-start rows": {"rows": 4, "mean": 5.6, "max": 9.0},
                                        "other rows": {"rows": 296, "mean": 0.003, "max": 2.0}}}},
             "diversity": {"base": {"mattr": 0.39}, "edited": {"mattr": 0.40}}},
}


def test_a_shipped_edit_reports_its_targets_rates_and_kl_split(tmp_path):
    files, report, text = write_reports(tmp_path, "m.gguf", copy.deepcopy(SHIPPED), {"solve": 10.0},
                                        ran=["solve"], system="Be a butler.", style="starter:Greetings",
                                        config={"rank": 1})
    got = {t["target"]: t for t in report["targets"]}
    assert got["an edit ships (the protocol's stopping rule)"]["passed"] is True
    assert got["mean KL, test documents"]["passed"] is False
    assert got["verify live (bitwise)"]["passed"] is True
    assert got["style rate without the persona prompt, edited - base (95% CI above 0)"]["passed"] is True
    assert "chosen step 80" in text and "edited          3/4 = 0.75" in text
    assert "reply-start rows: 4 rows, KL mean 5.6" in text and "other rows: 296 rows, KL mean 0.003" in text
    assert report["shipped"]["edited.gguf"] == "ab" * 32
    assert json.loads((tmp_path / "report.json").read_text())["targets"] == report["targets"]
    assert (tmp_path / "style-rates.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "report.md").read_text() == text
    assert {p.name for p in tmp_path.iterdir()} == set(REPORTS)     # what a redone stage removes (runs/loop/stages.py)


def test_no_edit_shipped_says_so_and_measures_only_base_and_the_persona(tmp_path):
    rec = copy.deepcopy(SHIPPED)
    rec["solve"].update(shipped_edit=False, chosen_step=None, rows_changed=0)
    rec["solve"]["test"] = {"status": "no edit", "ledger_entry": None, "report": None}
    rec["apply"] = rec["verify"] = rec["cost"] = None
    rec["rates"]["sides"].pop("edited")
    rec["rates"]["sides"]["base"]["style"]["ci"] = [float("nan"), None]     # no interval (n_boot 0, one prompt)
    for k in ("change", "token_shifts"):
        rec["rates"].pop(k)
    _, report, text = write_reports(tmp_path, "m.gguf", rec, {}, system="s", style="kaomoji", config={"rank": 1})
    assert "the rule shipped no edit" in text and "shipped" not in report
    targets = persona_targets(rec)
    assert targets[0]["passed"] is False
    assert not any("verify" in t["target"] or "edited - base" in t["target"] for t in targets)
    assert (tmp_path / "style-rates.png").is_file()


def test_the_off_decision_bar_decides_and_the_every_row_kl_is_reported(tmp_path):
    """Issue 42: with the decision rows registered, the KL target is the bar off them; the every-row
    mean is reported beside it (no pass); the style out of its place and the perplexity on text the
    solve never fitted are targets of their own."""
    rec = copy.deepcopy(SHIPPED)
    rec["solve"]["bars"] = [_bar("mean KL, test documents, off the decision rows", 0.004, 0.005, "<=", True),
                            {**_bar("mean KL, test documents, every row (reported)", 0.06, 0.005, "<=", None),
                             "gating": False}]
    rec["solve"].update(hold="paragraph", hold_rows=120, decision="step0",
                        trajectory=[{"step": 80, "ratio": 1.0, "train": 18.0, "dev": 17.5, "dev_kl": 0.05,
                                     "dev_kl_off": 0.003}])
    rec["solve"]["stopping"]["max_dev_kl_off"] = 0.005
    rec["rates"]["out_of_place"] = {"base": {"replies": 0, "paragraphs": 0}, "edited": {"replies": 1, "paragraphs": 1}}
    rec["cost"]["kl"] = {"plain replies and plain text (never solved on)": {**rec["cost"]["kl"]["plain"],
                                                                            "ppl_base": 12.0, "ppl_edited": 12.06}}
    _, report, text = write_reports(tmp_path, "m.gguf", rec, {}, system="s", style="starter:Greetings",
                                    config={"rank": 1})
    got = {t["target"]: t for t in report["targets"]}
    assert got["mean KL, test documents, off the decision rows"]["passed"] is True
    assert got["mean KL, test documents, every row (reported)"]["passed"] is None
    assert got["no style out of its place in free generation (a later paragraph's start, an earlier one's end)"][
        "passed"] is False
    ppl = got["perplexity on text the solve never fitted within 1% of base"]
    assert ppl["value"] == pytest.approx(0.005) and ppl["passed"] is True
    assert "every row (reported)" in text and "reported" in text.split("every row (reported)")[1].splitlines()[0]
    assert "anchors held in the KL term: paragraph (120 rows)" in text
    assert "off the decision rows passes 0.005" in text and "off the decision rows 0.00300" in text
    assert "out of place (a later paragraph's start / an earlier one's end): 1 paragraphs in 1 replies" in text


def test_the_perplexity_bar_is_off_the_decision_rows_and_every_row_is_reported(tmp_path):
    """The cost split carries each side's perplexity per row set: the 1% bar reads the rows off the
    decision rows (a plain reply opens otherwise at its start, where the style is raised by design),
    the every-row rise is reported beside it and decides nothing."""
    rec = copy.deepcopy(SHIPPED)
    split = {"decision rows (step0, style tokens)": {"rows": 24, "mean": 14.0, "max": 30.2,
                                                     "ppl_base": 3.0, "ppl_edited": 9.0e6},
             "off the decision rows": {"rows": 2796, "mean": 5.8e-8, "max": 2e-5,
                                       "ppl_base": 9.9, "ppl_edited": 9.9004}}
    rec["cost"]["kl"] = {"plain replies and plain text (never solved on)": {
        **rec["cost"]["kl"]["plain"], "ppl_base": 9.989, "ppl_edited": 11.274, "split": split}}
    _, report, text = write_reports(tmp_path, "m.gguf", rec, {}, system="s", style="starter:Greetings",
                                    config={"rank": 1})
    got = {t["target"]: t for t in report["targets"]}
    off = got["perplexity off the decision rows on text the solve never fitted within 1% of base"]
    assert off["value"] == pytest.approx(0.0004 / 9.9) and off["passed"] is True
    every = got["perplexity on every row of that text (the decision rows included), reported"]
    assert every["value"] == pytest.approx(11.274 / 9.989 - 1) and every["passed"] is None
    line = [ln for ln in text.splitlines() if "every row of that text" in ln][0]
    assert line.rstrip().endswith("reported")
    assert "off the decision rows: 2796 rows, KL mean 5.8e-08, max 2e-05, perplexity 9.9000 -> 9.9004" in text
