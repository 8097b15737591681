"""The real-model demo's pieces that need no engine: its protocol loads and resolves against a
token table, the bundled data files are there and sane, the config refuses what it cannot run."""
from __future__ import annotations

import pytest

from exactedit.evals.protocol import load_protocol, resolve_tokens
from exactedit.native.real_demo import DATA, RealDemoConfig, RealDemoError, _lines, write_protocol


def test_protocol_loads_with_fixed_roles_and_id_tokens(tmp_path):
    p = write_protocol(tmp_path / "protocol.toml", tmp_path / "data", "demo-x", specials=(3, 1), turn_end=2,
                       tuples=[(10, 11, 12), (20, 21)])
    proto = load_protocol(p)
    assert {t.name: t.role for t in proto.traces} == {"train": "train", "heldout": "dev",
                                                      "collateral": "collateral", "anchors": "anchors"}
    assert all(t.path == (tmp_path / "data" / t.name).resolve() for t in proto.traces)
    tokens = resolve_tokens(proto, [f"t{i}" for i in range(30)])
    assert tokens.phrases == ((10, 11, 12), (20, 21)) and tokens.turn_end == 2
    assert set(tokens.specials) == {1, 2, 3}
    assert set(tokens.collateral_words) == {12, 21}


def test_bundled_qwen_data_is_disjoint_and_sized():
    cfg = RealDemoConfig()
    prompts, rate = _lines(cfg.file("prompts")), _lines(cfg.file("rate_prompts"))
    assert len(prompts) >= 20 and len(rate) >= 10
    assert not set(prompts) & set(rate)            # the rate prompts built none of the data
    assert _lines(cfg.file("phrases")) and cfg.text_files()


def test_config_refuses_unknown_models_and_bad_sizes(tmp_path):
    with pytest.raises(RealDemoError, match="no bundled --phrases"):
        RealDemoConfig(model="nosuch").file("phrases")
    with pytest.raises(RealDemoError, match=">= 1"):
        RealDemoConfig(samples=0)
    assert RealDemoConfig(phrases=str(tmp_path / "p.txt")).file("phrases") == tmp_path / "p.txt"
    assert (DATA / "qwen" / "phrases.txt").is_file()
