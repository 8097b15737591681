"""The production engine contract: tokens/logits file layouts, the command template, the runner."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from exactedit.native.verify import strata
from exactedit.dumps import contract
from exactedit.dumps.contract import StrataError
from exactedit.native.verify.strata import EngineCommand
from tests.special_files import KINDS, WHY, special


def test_tokens_round_trip_and_layout(tmp_path):
    toks = np.array([0, 5, 151643, 7], np.int64)
    path = contract.write_tokens(tmp_path / "t.i32", toks)
    assert path.read_bytes() == np.array(toks, "<i4").tobytes()       # int32 LE, no header
    assert contract.read_tokens(path).tolist() == toks.tolist()
    with pytest.raises(StrataError, match="outside"):
        contract.read_tokens(path, vocab=1000)


@pytest.mark.parametrize("data", [b"", b"\x01\x02\x03", np.array([-1], "<i4").tobytes()])
def test_bad_tokens_files_are_refused(tmp_path, data):
    (tmp_path / "t").write_bytes(data)
    with pytest.raises(StrataError):
        contract.read_tokens(tmp_path / "t")


@pytest.mark.parametrize("kind", KINDS)
def test_special_tokens_files_are_refused_by_name(tmp_path, kind):
    """A FIFO as --tokens / --tokens-file was waited on for ever, /dev/zero read until memory ran out."""
    bad = special(tmp_path / "t.i32", kind)
    with pytest.raises(StrataError, match=re.escape(f"{bad}: --tokens: ") + ".*" + re.escape(WHY[kind])):
        contract.read_tokens(bad, field="--tokens")


def test_tokens_files_are_capped_at_max_tokens(tmp_path):
    """More ids than any one evaluation can hold (its [T, V] logits) are refused by the file's size,
    before a byte is read; MAX_TOKENS ids are read."""
    f = tmp_path / "t.i32"
    with open(f, "wb") as fh:
        fh.truncate(4 * contract.MAX_TOKENS + 4)           # sparse: id 0 everywhere
    with pytest.raises(StrataError, match=re.escape(f"{f}: tokens file: {4 * contract.MAX_TOKENS + 4} bytes, "
                                                    f"over the limit of {4 * contract.MAX_TOKENS}")):
        contract.read_tokens(f)
    with open(f, "r+b") as fh:
        fh.truncate(4 * contract.MAX_TOKENS)
    assert contract.read_tokens(f).size == contract.MAX_TOKENS


def test_logits_layout_and_size_check(tmp_path):
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = contract.write_logits(tmp_path / "l.f32", logits)
    assert path.read_bytes() == logits.astype("<f4").tobytes()       # row-major float32, no header
    assert np.array_equal(contract.read_logits(path, 3, 4), logits)
    with pytest.raises(StrataError, match="expected 64"):
        contract.read_logits(path, 4, 4)
    path.write_bytes(np.array([np.nan] * 12, "<f4").tobytes())
    with pytest.raises(StrataError, match="non-finite"):
        contract.read_logits(path, 3, 4)


def test_command_template_and_user_flags():
    cmd = EngineCommand.parse(None, "--threads 4")
    assert cmd.argv("m.gguf", "t.i32", "l.f32") == [
        "strata_window_cli", "--metal-gguf", "m.gguf", "--tokens-file", "t.i32", "--logits-out", "l.f32",
        "--threads", "4"]
    with pytest.raises(StrataError, match="exactly once"):
        EngineCommand.parse("engine --in {gguf} --tokens {tokens}")


_FAKE_ENGINE = """
import sys, numpy as np
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
toks = np.fromfile(args["--tokens-file"], "<i4")
out = np.zeros((toks.size, 10), "<f4"); out[np.arange(toks.size), toks % 10] = 1
out.tofile(args["--logits-out"])
"""


def test_run_engine_honours_the_contract(tmp_path):
    """A tiny engine honouring the contract (one-hot logits of each token) run as a subprocess."""
    script = tmp_path / "engine.py"
    script.write_text(_FAKE_ENGINE)
    cmd = EngineCommand((sys.executable, str(script), "--metal-gguf", "{gguf}", "--tokens-file", "{tokens}",
                         "--logits-out", "{logits}"))
    run = strata.run_engine(cmd, "m.gguf", np.array([3, 14, 7]), 10, tmp_path)
    assert run.logits.argmax(1).tolist() == [3, 4, 7]
    with pytest.raises(StrataError, match="expected 132 = 4 \\* 3 positions"):
        strata.run_engine(cmd, "m.gguf", np.array([3, 14, 7]), 11, tmp_path)


def test_failing_engine_is_reported(tmp_path):
    def runner(argv, **kw):
        return subprocess.CompletedProcess(argv, 3, "", "metal: device lost")

    with pytest.raises(StrataError, match="device lost"):
        strata.run_engine(EngineCommand(), "m.gguf", [1], 10, tmp_path, runner=runner)
