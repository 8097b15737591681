"""`last_ffn`: a file's last gated FFN read once for the three places that recompute a gated edit's
rewritten units (kld's edited side, verify live's prediction, the gated solve): its x and hidden
values are ffn_norm_engine's and ffn_hidden_engine's on the file's own tensors bit for bit, an
edit's rows are found and recomputed, and a type mismatch or an unlisted architecture is refused
when asked for, naming the tensors or the architecture."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.errors import QuantError
from exactedit.quant import gguf
from exactedit.solvers.tail.forward.ffn_hidden import ffn_hidden_engine, last_ffn
from exactedit.solvers.tail.forward.ffn_ops import ffn_norm_engine
from exactedit.solvers.tail.model import load_tail
from tests.solvers.l47.synth import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = build_world(tmp_path_factory.mktemp("last_ffn"), tail="gated")
    g = gguf.open(w["model"])
    tail = load_tail(g)
    return g, tail, read_dump(w["train"])


def test_the_last_ffn_is_the_files_own(world):
    g, tail, d = world
    down = tail.spec.names["ffn_down"]
    ffn = last_ffn(g, down, tail.spec.architecture, float(tail.spec.rms_eps))
    gate, up, norm = (down.replace("ffn_down", p) for p in ("ffn_gate", "ffn_up", "ffn_norm"))
    assert (ffn.gate, ffn.up) == (gate, up) and ffn.type_name == g.tensor(gate).type_name
    np.testing.assert_array_equal(ffn.gate_raw, g.read_raw(gate))
    w = np.asarray(g.read_rows(norm), np.float32).reshape(-1)
    R = np.asarray(d.R, np.float32)
    np.testing.assert_array_equal(ffn.x(R), ffn_norm_engine(R, w, float(tail.spec.rms_eps)))
    units = [0, 3, 5]
    ref = ffn_hidden_engine(R, w, float(tail.spec.rms_eps), np.asarray(g.read_raw(gate)), np.asarray(g.read_raw(up)),
                            ffn.type_name, units, act=ffn.act)
    np.testing.assert_array_equal(ffn.hidden(R, units), ref)


def test_an_edits_rows_are_found_and_recomputed(world):
    g, tail, d = world
    ffn = last_ffn(g, tail.spec.names["ffn_down"], tail.spec.architecture, float(tail.spec.rms_eps))
    gate, up = ffn.gate_raw.copy(), ffn.up_raw.copy()
    gate[2], up[4] = ffn.gate_raw[1], ffn.up_raw[0]
    assert ffn.changed(gate, up).tolist() == [2, 4]
    assert ffn.changed(ffn.gate_raw, ffn.up_raw).size == 0
    R = np.asarray(d.R, np.float32)
    got = ffn.hidden(R, [2, 4], gate_raw=gate, up_raw=up)
    np.testing.assert_array_equal(got[:, 0], ffn.hidden(R, [1], up_raw=np.where(np.arange(len(up))[:, None] == 1,
                                                                                 ffn.up_raw[2], ffn.up_raw))[:, 0])
    np.testing.assert_array_equal(got, ffn_hidden_engine(R, ffn.norm, ffn.eps, gate, up, ffn.type_name, [2, 4],
                                                         act=ffn.act))


def test_a_type_mismatch_and_an_unlisted_architecture_are_refused_when_asked_for(world):
    g, tail, _ = world
    ffn = last_ffn(g, tail.spec.names["ffn_down"], tail.spec.architecture, float(tail.spec.rms_eps))
    odd = dataclasses.replace(ffn, up_type="Q8_0")
    with pytest.raises(QuantError, match="ffn_gate.*ffn_up.*differ in type"):
        odd.type_name
    with pytest.raises(QuantError, match="general.architecture 'x'"):
        dataclasses.replace(ffn, architecture="x").act
