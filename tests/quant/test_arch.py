"""quant.model.arch: tails recognized from the tensors present, shapes checked, and `exactedit inspect`."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gguf import GGUFValueType

from exactedit.quant import gguf
from exactedit.quant.model.arch import HC4_RMS_EPS, detect_tail, render_summary, summarize
from exactedit.errors import GGUFFormatError
from exactedit.quant.gguf.write import MetaValue, TensorData, synthetic_model, write_gguf

F32 = TensorData.from_f32


def test_rmsnorm_untied(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", vocab=50, n=256, h=64, layers=3,
                        metadata={"llama.final_logit_softcapping": MetaValue(GGUFValueType.FLOAT32, 30.0)})
    with gguf.open(w.path) as g:
        t = detect_tail(g)
    assert (t.kind, t.layer, t.n, t.vocab, t.h, t.tied) == ("rmsnorm", 2, 256, 50, 64, False)
    assert t.names == {"output_norm": "output_norm.weight", "head": "output.weight",
                       "ffn_down": "blk.2.ffn_down.weight"}
    assert t.tensor("head").type_name == "Q6_K" and t.tensor("ffn_down").shape == (256, 64)
    assert t.rms_eps == pytest.approx(1e-5) and t.logit_softcap == 30.0 and t.architecture == "llama"
    with pytest.raises(KeyError, match="roles"):
        t.tensor("hc_up")


def test_rmsnorm_tied_with_post_ffn_norm(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": F32(rng.standard_normal((10, 32))),
               "blk.0.ffn_down.weight": F32(rng.standard_normal((32, 16))),
               "blk.11.ffn_down.weight": F32(rng.standard_normal((32, 8))),
               "blk.11.post_ffw_norm.weight": F32(np.ones(32)),
               "output_norm.weight": F32(np.ones(32))}
    w = write_gguf(tmp_path / "g.gguf", {"general.architecture": "gemma2"}, tensors)
    with gguf.open(w.path) as g:
        t = detect_tail(g)
    assert t.tied and t.names["head"] == "token_embd.weight" and (t.layer, t.h, t.vocab) == (11, 8, 10)
    assert t.names["post_ffn_norm"] == "blk.11.post_ffw_norm.weight" and t.rms_eps is None


def test_hc4(tmp_path):
    w = synthetic_model(tmp_path / "h.gguf", tail="hc4", vocab=40, n=256, h=64, layers=2, d_lo=32)
    with gguf.open(w.path) as g:
        t = detect_tail(g)
    assert (t.kind, t.layer, t.n, t.vocab, t.h, t.streams, t.d_lo) == ("hc4", 1, 256, 40, 64, 4, 32)
    assert t.rms_eps == HC4_RMS_EPS and not t.tied
    assert t.names == {"hc_norm": "output_hc_norm.weight", "hc_down": "output_hc_down.weight",
                       "hc_up": "output_hc_up.weight", "head": "output.weight",
                       "ffn_down": "blk.1.ffn_down_shexp.weight"}
    assert t.tensor("hc_down").shape == (40, 1024) and t.tensor("hc_down").type_name == "BF16"
    json.dumps(t.to_dict())


def test_nextn_layers_are_not_the_last_layer(tmp_path):
    w = synthetic_model(tmp_path / "h.gguf", tail="hc4", vocab=16, n=256, h=32, layers=3,
                        metadata={"hc4test.nextn_predict_layers": MetaValue(GGUFValueType.UINT32, 1)})
    with gguf.open(w.path) as g:
        assert detect_tail(g).layer == 1


def _hc4_tensors(n=32, s=4, d_lo=8, **override):
    t = {"output_hc_norm.weight": F32(np.ones((s, n))), "output_hc_down.weight": F32(np.ones((d_lo, s * n))),
         "output_hc_up.weight": F32(np.ones((s * n, d_lo))), "output.weight": F32(np.ones((5, n))),
         "blk.3.ffn_down_shexp.weight": F32(np.ones((n, 16)))}
    t.update(override)
    return {k: v for k, v in t.items() if v is not None}


@pytest.mark.parametrize("tensors,match", [
    ({"a.weight": F32(np.ones(32))}, "neither hc4 .* nor rmsnorm"),
    (_hc4_tensors(**{"output_hc_up.weight": None}), "but not output_hc_up.weight"),
    (_hc4_tensors(**{"output_hc_up.weight": F32(np.ones((128, 9)))}), "output_hc_down.weight.*expected"),
    (_hc4_tensors(**{"output_hc_norm.weight": F32(np.ones(32))}), r"expected \(streams, n\)"),
    (_hc4_tensors(s=2), r"output_hc_norm.weight: 2 residual streams; hc4 mixes exactly 4"),
    (_hc4_tensors(s=8), r"8 residual streams; hc4 mixes exactly 4 .*1/4"),
    (_hc4_tensors(**{"output.weight": F32(np.ones((5, 16)))}), r"tensor output.weight.*expected \(V, 32\)"),
    (_hc4_tensors(**{"blk.3.ffn_down_shexp.weight": None}), "no blk.N.ffn_down_shexp.weight"),
    (_hc4_tensors(**{"output.weight": None}), "no output.weight and no token_embd.weight"),
    ({"output_norm.weight": F32(np.ones(32)), "output.weight": F32(np.ones((5, 32)))},
     "no blk.N.ffn_down.weight"),
    ({"output_norm.weight": F32(np.ones(32)), "output.weight": F32(np.ones((5, 32))),
      "blk.0.ffn_down.weight": F32(np.ones((16, 32)))}, r"blk.0.ffn_down.weight.*expected \(32, h\)"),
])
def test_unrecognized_tails(tmp_path, tensors, match):
    w = write_gguf(tmp_path / "x.gguf", {"general.architecture": "x"}, tensors)
    with gguf.open(w.path) as g, pytest.raises(GGUFFormatError, match=match):
        detect_tail(g)


def test_summarize_and_render(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", vocab=20, n=256, h=32, layers=1,
                        metadata={"tokenizer.chat_template": "x" * 500})
    s = summarize(w.path)
    assert s.sha256 == w.sha256 and s.tensor_count == 5 and s.tail.kind == "rmsnorm" and s.tail_error is None
    meta = dict(s.metadata)
    assert meta["tokenizer.ggml.tokens"] == "[STRING x 20]" and meta["llama.block_count"] == "1"
    assert meta["tokenizer.chat_template"].endswith("... (502 chars)")
    text = render_summary(s)
    assert "rmsnorm: layer 0, n 256, V 20, h 32" in text and "output.weight" in text and w.sha256 in text
    json.dumps(s.to_dict())
    bare = write_gguf(tmp_path / "bare.gguf", {"k": 1}, {"a.weight": F32(np.ones(32))})
    s = summarize(bare.path)
    assert s.tail is None and "neither hc4" in s.tail_error and "not recognized" in render_summary(s)


def test_cli_inspect(tmp_path):
    from exactedit.cli import main

    w = synthetic_model(tmp_path / "h.gguf", tail="hc4", vocab=16, n=256, h=32, layers=1)
    runner = CliRunner()
    r = runner.invoke(main, ["inspect", str(w.path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["tail"]["kind"] == "hc4" and d["sha256"] == w.sha256
    assert d["tail"]["tensors"]["head"] == {"name": "output.weight", "type": "Q6_K", "shape": [16, 256]}
    r = runner.invoke(main, ["inspect", str(w.path)])
    assert r.exit_code == 0 and "hc4: layer 0" in r.output
    (tmp_path / "bad.gguf").write_bytes(b"nope")
    r = runner.invoke(main, ["inspect", str(tmp_path / "bad.gguf")])
    assert r.exit_code != 0 and "header" in r.output and "Traceback" not in r.output


def test_cli_inspect_names_a_stream_count_it_refuses(tmp_path):
    from exactedit.cli import main

    w = write_gguf(tmp_path / "s8.gguf", {"general.architecture": "x"}, _hc4_tensors(s=8))
    r = CliRunner().invoke(main, ["inspect", str(w.path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["tail"] is None and "8 residual streams; hc4 mixes exactly 4" in d["tail_error"]
