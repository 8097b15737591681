"""The persona solve stage on the bundled fixture (no engine): the off-decision KL bar and the KL
watch are in the protocol file, registered in the ledger, before the solve reads a row; the bars
the run reports stand on the rows off the decision, with the every-row mean reported beside them;
the protocol is the registered one after test was read."""
from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from exactedit import fixtures
from exactedit.evals.protocol.ledger import Ledger
from exactedit.evals.rates.style import Style
from exactedit.runs.persona import pipeline
from exactedit.runs.persona.config import PersonaConfig

FIXTURE = Path(fixtures.__file__).parent / "default"
STYLE_ID = 33                 # "!": in train, dev and test replies of the fixture (a sign-off's last token)


class _Stages:
    state = {"command": "exactedit persona (test)"}

    def outputs(self, name):
        return {}


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    import exactedit.runs.solve.head as head

    out = tmp_path_factory.mktemp("persona-solve")
    cfg = PersonaConfig(max_steps=20, min_ratio=0.2, lr=3e-3, watch_kl=True, hold="paragraph", device="cpu")
    r = SimpleNamespace(cfg=cfg, out=out, model=FIXTURE / "model.gguf", template=None,
                        style=Style.parse("signoff:!"), stages=_Stages(), tick=lambda label: None,
                        run=lambda name, key, outputs, fn: fn())
    sets = {s: {"dump": str(FIXTURE / "dumps" / s)} for s in ("train", "dev", "test", "anchors")}
    seen = {}
    real = head.solve_head

    def spy(hcfg, **kw):
        """What the protocol and the ledger hold when the solve is called, before it reads a row."""
        path = Path(kw["protocol"])
        seen["toml"] = tomllib.loads(path.read_text(encoding="utf-8"))
        seen["sha"] = hashlib.sha256(path.read_bytes()).hexdigest()
        with Ledger.open(kw["workspace"]) as ledger:
            seen["registered"] = [e.payload["sha256"] for e in ledger.entries("register")]
            seen["tests_before"] = len(ledger.entries("test"))
        seen["hold"] = hcfg.hold
        return real(hcfg, **kw)

    head.solve_head = spy
    try:
        rec = pipeline._solve(r, {"data": {"sets": sets, "edit_set": [STYLE_ID]}})
    finally:
        head.solve_head = real
    return out, rec, seen


def test_the_off_decision_bar_and_the_kl_watch_are_registered_before_the_solve(solved):
    out, rec, seen = solved
    bars, stopping = seen["toml"]["bars"], seen["toml"]["stopping"]
    assert bars["persona_decision"] == "reply_end" and bars["persona_max_kl_off"] == 0.005   # a sign-off ends a reply
    assert stopping["max_dev_kl_off"] == 0.005
    assert seen["registered"] == [seen["sha"]] and seen["tests_before"] == 0
    assert seen["hold"] == "paragraph" and rec["hold"] == "paragraph" and rec["decision"] == "reply_end"


def test_the_protocol_is_unchanged_after_test_is_read(solved):
    out, rec, seen = solved
    assert hashlib.sha256((out / "protocol.toml").read_bytes()).hexdigest() == seen["sha"]
    with Ledger.open(out / "ws") as ledger:
        tests = ledger.entries("test")
    if rec["shipped_edit"]:
        assert rec["test"]["status"] == "scored" and len(tests) == 1
        assert tests[0].payload["protocol_sha256"] == seen["sha"]


def test_the_reported_bars_stand_off_the_decision_rows(solved):
    _, rec, _ = solved
    held = "test" if rec["test"]["status"] == "scored" else "dev"
    by_key = {b["key"]: b for b in rec["bars"]}
    off, every = by_key[f"persona_kl_off:{held}"], by_key[f"persona_kl:{held}"]
    assert off["gating"] and off["threshold"] == 0.005 and "off the decision rows" in off["label"]
    assert not every["gating"] and every["passed"] is None and off["n"] < every["n"]
    assert by_key["persona_kl_anchors_off:anchors"]["gating"] and not by_key["persona_kl_anchors:anchors"]["gating"]


def test_the_trajectory_carries_the_dev_kl_off_the_decision_the_rule_watched(solved):
    _, rec, _ = solved
    traj = rec["trajectory"]
    assert [t["step"] for t in traj] == list(range(0, 21, 5))
    assert all(t["dev_kl_off"] is not None and 0.0 <= t["dev_kl_off"] for t in traj)
    if rec["chosen_step"] is not None:       # every checkpoint up to the chosen one stayed within the bar
        assert all(t["dev_kl_off"] <= 0.005 for t in traj if t["step"] <= rec["chosen_step"])
