"""dataset build's split by prompt (pure) and its warnings; the live build is in test_live_workflow.py."""
from __future__ import annotations

import pytest

from exactedit.runs.data.dataset import DatasetConfig, SetSummary, _warn, split_prompts
from exactedit.runs.data.mine import MineConfig
from exactedit.native.llamacpp.generate import Sampling
from exactedit.native.llamacpp.engine import EngineError


def test_split_is_by_prompt_stable_and_complete():
    prompts = [f"prompt {i}" for i in range(20)]
    cfg = DatasetConfig(heldout=0.25, collateral=0.15, anchor=0.15)
    g = split_prompts(prompts, cfg)
    assert {k: len(v) for k, v in g.items()} == {"train": 9, "heldout": 5, "collateral": 3, "anchor": 3}
    assert sorted(i for v in g.values() for i in v) == list(range(20))
    assert split_prompts(prompts, cfg) == g                          # stable across runs
    assert split_prompts(list(reversed(prompts)), cfg)["heldout"] == sorted(19 - i for i in g["heldout"])
    assert split_prompts(prompts, DatasetConfig(mine=MineConfig(sampling=Sampling(max_new=256, seed=1), samples=2, n_boot=0))) != g        # the seed reorders
    small = split_prompts(["a", "b", "c", "d"], cfg)
    assert all(len(v) == 1 for v in small.values())                 # each asked-for group gets one


def test_config_validation():
    with pytest.raises(EngineError, match="shares"):
        DatasetConfig(heldout=0.5, collateral=0.3, anchor=0.2)


def test_warnings_name_the_bar():
    s = SetSummary("collateral", "d", 3, 100, {"collateral": 3, "chat": 3}, {}, {}, {" use": 2, " example": 12}, 0, 0)
    assert _warn(s) == ["collateral: 2 legitimate uses of ' use' (< 10: bar (d) for this word stands on little)"]
    a = SetSummary("anchors", "d", 2, 100, {"anchor": 2, "chat": 2}, {}, {}, {}, 0, 0)
    assert any("no 'plain'" in w for w in _warn(a)) and any("special-token holds" in w for w in _warn(a))
    h = SetSummary("heldout", "d", 2, 300, {"chat": 2}, {"you can use": 3}, {"you can use": 3}, {}, 1, 1)
    assert len(_warn(h)) == 2 and "(c)" in _warn(h)[0] and "(f)" in _warn(h)[1]


def test_text_chunks_with_uses_go_in_turn_to_collateral_train_and_anchors():
    from exactedit.runs.data.dataset import text_sets

    docs = [f"c{k}" for k in range(8)]
    got = text_sets(docs, {0, 1, 2, 3, 5, 7})
    assert got == {"collateral": ["c0", "c3"], "train": ["c1", "c5"], "anchors": ["c2", "c7", "c4", "c6"]}
    assert text_sets(docs[:2], set()) == {"collateral": [], "train": [], "anchors": ["c0", "c1"]}


def test_a_refused_template_stops_mine_and_dataset_build_unless_a_fallback_is_named(tmp_path, monkeypatch):
    """`mine` and `dataset build` read the model's chat through model_chat with the configured
    fallback: none by default (a refused template stops them before any engine loads), `chatml` when
    named; dataset build hands its fallback to the mine config it samples with."""
    from exactedit.runs.data import dataset as ds_mod
    from exactedit.runs.data import mine as mine_mod
    from exactedit.runs.data.dataset import DatasetConfig
    from exactedit.runs.data.mine import MineConfig

    seen = []

    class Refused(Exception):
        pass

    def model_chat(path, fallback=None, template=None):
        seen.append(fallback if template is None else (fallback, template))
        raise Refused(fallback)

    monkeypatch.setattr(mine_mod, "model_chat", model_chat)
    monkeypatch.setattr(ds_mod, "model_chat", model_chat)
    with pytest.raises(Refused):
        mine_mod.run_mine("m.gguf", ["a prompt"], ["you can use"], None, config=MineConfig())
    with pytest.raises(Refused):
        mine_mod.run_mine("m.gguf", ["a prompt"], ["you can use"], None, config=MineConfig(chat_fallback="chatml"))
    with pytest.raises(Refused):
        ds_mod.build_dataset("m.gguf", ["p1", "p2", "p3", "p4"], ["you can use"], tmp_path / "out",
                             config=DatasetConfig(mine=MineConfig(chat_fallback="chatml")))
    with pytest.raises(Refused):      # a given template reaches model_chat from both commands
        mine_mod.run_mine("m.gguf", ["a prompt"], ["you can use"], None, config=MineConfig(chat_template="t.jinja"))
    with pytest.raises(Refused):
        ds_mod.build_dataset("m.gguf", ["p1", "p2", "p3", "p4"], ["you can use"], tmp_path / "out",
                             config=DatasetConfig(mine=MineConfig(chat_template="t.jinja")))
    assert seen == [None, "chatml", "chatml", (None, "t.jinja"), (None, "t.jinja")]
    assert DatasetConfig().mine.samples == 2 and DatasetConfig().mine.sampling.max_new == 256
    assert DatasetConfig().record() == {"samples": 2, "max_new": 256, "temperature": 0.8, "top_k": 40, "seed": 0,
                                        "heldout": 0.25, "collateral": 0.15, "anchor": 0.15, "chunk": 256,
                                        "capitalized": True, "chat_fallback": None, "chat_template": None}
