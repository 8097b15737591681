"""The integrity audit's attacks, each now a clean refusal or a detected failure, through the
library and the CLI: tampered field data under an untouched manifest (every evals command), a
re-chained ledger rewrite (caught by the anchors outputs recorded), and a second blind run from a
fresh workspace (refused by the user-level registry)."""
from __future__ import annotations

import json
import shutil
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.dumps import DumpFormatError
from exactedit.runs.eval import workflow
from exactedit.evals.protocol.anchors import export_head, verify_ledger
from exactedit.evals.protocol.ledger import HEAD_NAME, Ledger, LedgerError, LedgerRefusal, entry_hash
from tests.evals.world import build_world


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world") / "w")


@pytest.fixture
def world(pristine, tmp_path):
    """A private copy: these tests tamper with its files."""
    shutil.copytree(pristine.root, tmp_path / "w")
    root = tmp_path / "w"
    return type(pristine)(root, root / "model.gguf", root / "protocol.toml", root / "bundle", root / "blind",
                          root / "blind2")


def scale_r(dump):
    """The audit's tamper: R scaled by 3 and 50 of its columns zeroed, manifest untouched."""
    r = np.load(dump / "R.npy")
    r[..., :50] = 0.0
    np.save(dump / "R.npy", (3 * r).astype("<f4"))


def refresh_manifest(dump):
    """A smarter tamper: the manifest's field hash rewritten to match the new bytes."""
    from exactedit.files import file_sha256

    m = json.loads((dump / "manifest.json").read_text())
    m["sha256"]["R"] = file_sha256(dump / "R.npy")
    (dump / "manifest.json").write_text(json.dumps(m))


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(res, *needles):
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    for n in needles:
        assert n in res.output, res.output


# ---- 1. a dump's identity covers its data --------------------------------------------------------

def test_register_refuses_tampered_fields(world, tmp_path):
    scale_r(world.root / "chat")
    with pytest.raises(DumpFormatError) as err:
        workflow.register(world.protocol, tmp_path / "ws", "register")
    assert err.value.field == "R" and err.value.path == str(world.root / "chat")
    refused(cli("eval", "register", world.protocol, "--workspace", tmp_path / "ws2"),
            f"{world.root / 'chat'}: R: R.npy: sha256")


@pytest.mark.parametrize("command", ["split", "score", "test"])
def test_commands_after_registration_refuse_tampered_fields(world, tmp_path, command):
    ws = tmp_path / "ws"
    workflow.register(world.protocol, ws, "register")
    if command != "split":
        workflow.split(world.protocol, ws, "split")
    scale_r(world.root / "chat")
    args = {"split": ["eval", "split", "--protocol", world.protocol],
            "score": ["eval", "score", "--protocol", world.protocol, "--model", world.model, "--bundle",
                      world.bundle, "--out", tmp_path / "o"],
            "test": ["eval", "test", "--protocol", world.protocol, "--model", world.model, "--bundle",
                     world.bundle, "--out", tmp_path / "o"]}[command]
    refused(cli(*args, "--workspace", ws), f"{world.root / 'chat'}: R: R.npy: sha256", "differs from the manifest's")
    refresh_manifest(world.root / "chat")  # consistent again, but not the registered dump
    refused(cli(*args, "--workspace", ws), "trace 'chat' changed since the protocol was registered")
    with Ledger.open(ws) as led:
        assert not led.entries("score") and not led.entries("test") and led.entries("refusal")


def test_blind_refuses_a_tampered_document(world, tmp_path):
    ws = tmp_path / "ws"
    workflow.register(world.protocol, ws, "register")
    workflow.split(world.protocol, ws, "split")
    dev = workflow.score(world.protocol, ws, world.model, tmp_path / "dev", "score", bundle=world.bundle)
    scale_r(world.blind)
    refused(cli("eval", "blind", "--model", world.model, "--bundle", world.bundle, "--doc", world.blind,
                "--dev-report", dev.files.paths["json"], "--workspace", ws),
            f"{world.blind}: R: R.npy: sha256")
    with Ledger.open(ws) as led:
        assert not led.entries("blind")


# ---- 2 + 3. ledger anchors, and one-shot across workspaces ---------------------------------------

def _signed_off(world, tmp_path):
    ws, out = tmp_path / "ws", tmp_path / "out"
    workflow.register(world.protocol, ws, "register")
    workflow.split(world.protocol, ws, "split")
    dev = workflow.score(world.protocol, ws, world.model, out / "dev", "score", bundle=world.bundle)
    workflow.score_test(world.protocol, ws, world.model, world.bundle, out / "test", "test")
    blind_args = ["eval", "blind", "--model", world.model, "--bundle", world.bundle, "--doc", world.blind,
                  "--dev-report", dev.files.paths["json"], "--out", out / "blind", "--workspace", ws]
    assert cli(*blind_args).exit_code == 0
    refused(cli(*blind_args), "already had its blind run")  # a refusal entry after the sign-off
    return ws, out, dev, blind_args


def rechain_without(ws, kinds):
    """The audit's rewrite: drop the append-only triggers, delete entries, renumber and re-chain
    the rest, rewrite ledger.head. The chain alone then verifies."""
    conn = sqlite3.connect(ws / "ledger.sqlite", isolation_level=None)
    conn.executescript("DROP TRIGGER entries_no_update; DROP TRIGGER entries_no_delete;")
    q = ",".join("?" * len(kinds))
    conn.execute(f"DELETE FROM entries WHERE kind IN ({q})", tuple(kinds))
    rows = conn.execute("SELECT * FROM entries ORDER BY seq").fetchall()
    conn.execute("DELETE FROM entries")
    prev = "0" * 64
    for i, (_, time, kind, command, inputs, payload, _, _) in enumerate(rows, start=1):
        h = entry_hash(i, time, kind, command, inputs, payload, prev)
        conn.execute("INSERT INTO entries VALUES (?,?,?,?,?,?,?,?)", (i, time, kind, command, inputs, payload, prev, h))
        prev = h
    conn.close()
    (ws / HEAD_NAME).write_text(f"{len(rows)} {prev}\n")
    with Ledger.open(ws) as led:
        assert led.verify().ok  # the chain by itself is fooled


def test_outputs_record_the_ledger_head(world, tmp_path):
    ws, out, dev, _ = _signed_off(world, tmp_path)
    with Ledger.open(ws) as led:
        score_e, test_e = led.entries("score")[0], led.entries("test")[0]
        claim = led.entries("blind")[0]
    meta = lambda p: json.loads(p.read_text())["meta"]["ledger_head"]  # noqa: E731
    assert meta(out / "dev" / "dev-report.json")["seq"] == score_e.seq - 1  # written just before its entry
    assert meta(out / "test" / "test-report.json")["seq"] == test_e.seq  # written after its entry
    head = meta(out / "blind" / "signoff.json")
    assert (head["seq"], head["hash"]) == (claim.seq, claim.hash)
    res = cli("eval", "ledger", "--verify", "--against", out, "--workspace", ws, "--json")
    assert res.exit_code == 0, res.output
    v = json.loads(res.output)
    assert v["ok"] and {a["what"] for a in v["anchors"]} == {"dev report", "test report", "sign-off",
                                                              "blind registry claim"}


def test_rechained_rewrite_is_caught_and_the_blind_rerun_refused(world, tmp_path):
    ws, out, _, blind_args = _signed_off(world, tmp_path)
    exported = export_head(ws, tmp_path / "ledger-head.json")
    rechain_without(ws, ("blind", "blind-result", "refusal"))
    # without --against, the user-level registry's record of the claim is an anchor already
    res = cli("eval", "ledger", "--verify", "--workspace", ws)
    refused(res, "hash chain intact", "NOT BACKED", "blind registry claim",
            "first output the ledger no longer backs")
    # against the outputs and the exported head: the sign-off is named, the dev report still backed
    res = cli("eval", "ledger", "--verify", "--against", out, "--against", exported.path, "--workspace", ws)
    refused(res, f"first output the ledger no longer backs: {out / 'blind' / 'signoff.json'}")
    v = verify_ledger(ws, [out, exported.path])
    by = {a.anchor.what: a for a in v.anchors}
    assert by["dev report"].backed and by["test report"].backed
    assert not by["sign-off"].backed and not by["exported head"].backed
    assert "rewritten" in by["sign-off"].reason or "cut off" in by["sign-off"].reason
    # and the same sign-off does not run again: the registry remembers it across the rewrite
    refused(cli(*blind_args), "already had its blind run", "registry run 1")


def test_deleting_a_score_entry_unbacks_its_report(world, tmp_path):
    ws, out = tmp_path / "ws", tmp_path / "out"
    workflow.register(world.protocol, ws, "register")
    workflow.split(world.protocol, ws, "split")
    workflow.score(world.protocol, ws, world.model, out / "dev", "score", bundle=world.bundle)
    assert verify_ledger(ws, [out]).ok
    rechain_without(ws, ("score",))  # the report's head (before its entry) is untouched
    v = verify_ledger(ws, [out])
    assert not v.ok and "no score entry records this report" in v.first_unbacked.reason


def test_truncation_is_caught_by_an_exported_head(world, tmp_path):
    ws = tmp_path / "ws"
    workflow.register(world.protocol, ws, "register")
    workflow.split(world.protocol, ws, "split")
    res = cli("eval", "ledger", "--workspace", ws, "--export", tmp_path / "head.json")
    assert res.exit_code == 0 and "head entry 2" in res.output
    rechain_without(ws, ("split",))
    refused(cli("eval", "ledger", "--verify", "--against", tmp_path / "head.json", "--workspace", ws),
            "exported head", "entries were cut off")


def test_a_fresh_workspace_cannot_sign_off_again(world, tmp_path):
    ws, out, dev, _ = _signed_off(world, tmp_path)
    fresh = tmp_path / "fresh"
    workflow.register(world.protocol, fresh, "register")
    workflow.split(world.protocol, fresh, "split")
    dev2 = workflow.score(world.protocol, fresh, world.model, tmp_path / "dev2", "score", bundle=world.bundle)
    with pytest.raises(LedgerRefusal, match="already had its blind run"):
        workflow.blind(world.model, world.bundle, world.blind, dev2.files.paths["json"], fresh, tmp_path / "b", "b")
    refused(cli("eval", "blind", "--model", world.model, "--bundle", world.bundle, "--doc", world.blind2,
                "--dev-report", dev2.files.paths["json"], "--workspace", fresh),
            "bundle", "already had its blind run", str(ws.resolve()))
    with Ledger.open(fresh) as led:
        assert not led.entries("blind") and len(led.entries("refusal")) == 2


def test_against_cannot_pass_vacuously(world, tmp_path):
    ws = tmp_path / "ws"
    workflow.register(world.protocol, ws, "register")
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain.json").write_text("{}")
    refused(cli("eval", "ledger", "--verify", "--against", tmp_path / "empty", "--workspace", ws),
            "no file under it holds a ledger head")
    refused(cli("eval", "ledger", "--verify", "--against", tmp_path / "plain.json", "--workspace", ws),
            "holds no ledger head")
    assert cli("eval", "ledger", "--against", tmp_path / "plain.json", "--workspace", ws).exit_code == 2


def test_export_refuses_a_broken_chain(world, tmp_path):
    ws = tmp_path / "ws"
    workflow.register(world.protocol, ws, "register")
    (ws / HEAD_NAME).write_text("9 " + "0" * 64 + "\n")
    with pytest.raises(LedgerError, match="hash chain broken"):
        export_head(ws, tmp_path / "h.json")
    assert not (tmp_path / "h.json").exists()
