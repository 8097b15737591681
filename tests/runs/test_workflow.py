"""The evals workflow end to end on a tiny model: register, split, score (bundle and shaping), test
once, blind once, the ledger's refusals and tamper detection, through the library and the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.runs.eval import workflow
from exactedit.evals.scoring.evaluate import EvalError, ScoreConfig
from exactedit.evals.protocol.ledger import Ledger, LedgerRefusal
from exactedit.evals.scoring.report import read_report
from tests.evals.world import ID, build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world") / "w")


def test_full_protocol_run(world, tmp_path):
    ws, out = tmp_path / "ws", tmp_path / "out"
    reg = workflow.register(world.protocol, ws, "register")
    assert reg.record.registered and set(reg.trace_sha256) == {"chat", "anchors", "collateral"}
    sp = workflow.split(world.protocol, ws, "split")
    assert sp.splits.counts() == {"train": 4, "dev": 2, "test": 2, "anchors": 1, "collateral": 1}
    assert workflow.split(world.protocol, ws, "split again").splits == sp.splits  # reruns give the same split

    dev = workflow.score(world.protocol, ws, world.model, out / "dev", "score", bundle=world.bundle)
    r = dev.report
    assert r.meta["bundle_sha256"] == dev.bundle_sha256 and not r.marker
    a, c = r.row("a_reduction"), r.row("c_reduction")
    assert a.n > 0 and c.n > 0 and a.base > a.edited  # the bundle lowers the rejected tokens' rows
    assert r.row("e_kld:plain").n > 0 and r.row(f"d_mean:{ID[' than']}").n > 0
    assert r.row("g_kld").n > 0 and r.row("f_flips").n > 0
    assert set(r.kld) >= {"role train", "role dev", "role anchors", "role collateral"}
    assert "role test" not in r.kld and "role blind" not in r.kld  # a dev run never reads test documents
    saved, sha = read_report(dev.files.paths["json"])
    assert [x.key for x in saved.rows] == [x.key for x in r.rows]
    assert np.allclose([x.number for x in saved.rows], [x.number for x in r.rows], rtol=0, atol=0, equal_nan=True)
    with Ledger.open(ws) as led:
        assert led.entries("score")[0].payload["report_sha256"] == sha

    first = workflow.score_test(world.protocol, ws, world.model, world.bundle, out / "test", "test")
    assert first.report.heldout_role == "test" and first.report.row("c_reduction").n > 0
    with pytest.raises(LedgerRefusal) as err:
        workflow.score_test(world.protocol, ws, world.model, world.bundle, out / "test2", "test")
    assert err.value.recorded["bars"] == json.loads(first.files.paths["json"].read_text())["bars"]

    signed = workflow.blind(world.model, world.bundle, world.blind, dev.files.paths["json"], ws, out / "blind",
                            "blind")
    assert signed.report.heldout_role == "blind" and len(signed.comparisons) == 4
    assert signed.files.paths["png"].exists()
    with pytest.raises(LedgerRefusal, match="already had its blind run"):
        workflow.blind(world.model, world.bundle, world.blind2, dev.files.paths["json"], ws, out / "b2", "blind")
    with Ledger.open(ws) as led:
        assert led.verify().ok
        kinds = [e.kind for e in led.entries()]
    assert kinds.count("blind") == 1 and kinds.count("test") == 1 and kinds.count("refusal") == 2
    assert not list((ws / "tmp").glob("*.gguf"))  # the edited copies are gone


def test_scoring_needs_registration_and_a_split(world, tmp_path):
    ws = tmp_path / "ws"
    with pytest.raises(LedgerRefusal, match="not registered"):
        workflow.score(world.protocol, ws, world.model, tmp_path / "o", "score")
    with pytest.raises(EvalError, match="eval split"):
        workflow.score(world.protocol, ws, world.model, tmp_path / "o", "score", unregistered=True)
    sp = workflow.split(world.protocol, ws, "split", unregistered=True)
    assert sp.record.marker.startswith("UNREGISTERED")
    r = workflow.score(world.protocol, ws, world.model, tmp_path / "o", "score", unregistered=True,
                       config=ScoreConfig(shapes=("prefix-penalty=6",)))
    assert r.report.marker.startswith("UNREGISTERED")
    assert r.files.paths["md"].read_text().startswith("> **UNREGISTERED")
    # the penalty acts exactly at its triggers: KL there, none elsewhere
    assert r.report.kld["triggers prefix-penalty"]["kld_mean"] > 0
    assert r.report.row("a_reduction").number > 0.9  # p(rejected) * e^-6, renormalized
    assert r.report.row("e_kld:plain").number == 0.0  # the anchor text holds no banned prefix: exactly 0
    with pytest.raises(EvalError, match="dev role"):
        workflow.score(world.protocol, ws, world.model, tmp_path / "o", "s", config=ScoreConfig(heldout_role="test"))


def test_shaping_guard_and_case_rule_on_chat(world, tmp_path):
    ws = tmp_path / "ws"
    workflow.register(world.protocol, ws, "register")
    workflow.split(world.protocol, ws, "split")
    r = workflow.score(world.protocol, ws, world.model, tmp_path / "o", "score",
                       config=ScoreConfig(shapes=("step0-guard=6", "persona-case"), persona_tag="chat", bars="all"))
    trig = r.report.kld
    assert trig["triggers step0-guard"]["rows"] == 4 + 2  # one step0 per chat document read (train + dev)
    assert trig["triggers persona-case"]["rows"] > trig["triggers step0-guard"]["rows"]
    assert r.report.row("a_reduction").number == pytest.approx(0.0, abs=1e-9)  # no slop rule: nothing moves


def test_cli_commands(world, tmp_path):
    ws, run = str(tmp_path / "ws"), CliRunner()
    res = run.invoke(main, ["eval", "register", str(world.protocol), "--workspace", ws, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["name"] == "world"
    res = run.invoke(main, ["eval", "split", "--protocol", str(world.protocol), "--workspace", ws])
    assert res.exit_code == 0 and "train" in res.output
    res = run.invoke(main, ["eval", "score", "--protocol", str(world.protocol), "--model", str(world.model),
                            "--bundle", str(world.bundle), "--out", str(tmp_path / "dev"), "--workspace", ws])
    assert res.exit_code == 0, res.output
    assert "(a)" in res.output and "KL role dev" in res.output
    args = ["eval", "test", "--protocol", str(world.protocol), "--model", str(world.model), "--bundle",
            str(world.bundle), "--out", str(tmp_path / "test"), "--workspace", ws]
    assert run.invoke(main, args).exit_code == 0
    again = run.invoke(main, args)
    assert again.exit_code != 0 and "recorded test result" in again.output and "read once" in again.output
    blind = ["eval", "blind", "--model", str(world.model), "--bundle", str(world.bundle), "--doc", str(world.blind),
             "--dev-report", str(tmp_path / "dev" / "dev-report.json"), "--workspace", ws]
    res = run.invoke(main, blind)
    assert res.exit_code == 0, res.output
    assert "SIGN-OFF" in res.output
    res = run.invoke(main, blind)
    assert res.exit_code != 0 and "already had its blind run" in res.output
    res = run.invoke(main, ["eval", "ledger", "--verify", "--workspace", ws])
    assert res.exit_code == 0 and "intact" in res.output
    res = run.invoke(main, ["eval", "ledger", "--workspace", ws, "--json"])
    assert [e["kind"] for e in json.loads(res.output)][:2] == ["register", "split"]
    with Ledger.open(ws) as led:
        led._conn.executescript("DROP TRIGGER entries_no_update;")
        led._conn.execute("UPDATE entries SET command = 'exactedit nothing' WHERE seq = 3")
    res = run.invoke(main, ["eval", "ledger", "--verify", "--workspace", ws])
    assert res.exit_code == 1 and "BROKEN at entry 3" in res.output
    res = run.invoke(main, ["eval", "split", "--protocol", str(world.protocol), "--workspace", ws])
    assert res.exit_code != 0 and "hash chain broken" in res.output


def test_bad_shape_flag_is_a_usage_error(world, tmp_path):
    res = CliRunner().invoke(main, ["eval", "score", "--protocol", str(world.protocol), "--model", str(world.model),
                                    "--shape", "lowercase", "--out", str(tmp_path), "--workspace", str(tmp_path)])
    assert res.exit_code == 2 and "unknown shaping rule" in res.output


# ---- concurrent runs, a read-only workspace ---------------------------------------------

def test_concurrent_runs_of_one_bundle_get_their_own_edited_model(world, tmp_path):
    ws = tmp_path / "ws"
    with workflow.edited_model(world.model, world.bundle, ws) as (a, sha_a), \
            workflow.edited_model(world.model, world.bundle, ws) as (b, sha_b):
        assert sha_a == sha_b and a != b and a.is_file() and b.is_file()
        assert a.read_bytes() == b.read_bytes()
    assert not a.exists() and not b.exists() and list((ws / "tmp").iterdir()) == []


@pytest.mark.parametrize("command", ["score", "test", "blind"])
def test_a_read_only_workspace_is_refused_before_any_work(world, tmp_path, monkeypatch, command):
    import os
    import tempfile

    from exactedit.evals.protocol.ledger import LedgerError

    ws, out = tmp_path / "ws", tmp_path / "out"
    workflow.register(world.protocol, ws, "register")
    workflow.split(world.protocol, ws, "split")
    dev = workflow.score(world.protocol, ws, world.model, out / "dev", "score", bundle=world.bundle)
    real = tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
        if dir is not None and os.path.samefile(dir, ws):
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **k)

    def no_work(*a, **k):
        raise AssertionError("computed in a workspace that cannot record it")

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(workflow, "score_traces", no_work)
    run = {"score": lambda: workflow.score(world.protocol, ws, world.model, out / "r", "score", bundle=world.bundle),
           "test": lambda: workflow.score_test(world.protocol, ws, world.model, world.bundle, out / "r", "test"),
           "blind": lambda: workflow.blind(world.model, world.bundle, world.blind, dev.files.paths["json"], ws,
                                           out / "r", "blind")}[command]
    with pytest.raises(LedgerError, match="not writable"):
        run()
    assert not (out / "r").exists()
    res = CliRunner().invoke(main, ["eval", "score", "--protocol", str(world.protocol), "--model", str(world.model),
                                    "--bundle", str(world.bundle), "--out", str(out / "r"), "--workspace", str(ws)])
    assert res.exit_code == 1 and "Traceback" not in res.output and "not writable" in res.output, res.output
    assert not (out / "r").exists()


def test_listing_the_ledger_of_a_read_only_workspace(world, tmp_path, monkeypatch):
    """`eval ledger` only reads: it lists a workspace it could not write."""
    import os
    import tempfile

    ws = tmp_path / "ws"
    workflow.register(world.protocol, ws, "register")
    real = tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
        if dir is not None and os.path.samefile(dir, ws):
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    res = CliRunner().invoke(main, ["eval", "ledger", "--workspace", str(ws), "--json"])
    assert res.exit_code == 0 and "register" in res.output, res.output
