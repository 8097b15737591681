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


# ---- replies.json: never a file discover would refuse to read back ------------------------------
def _fake_sampling(monkeypatch, texts: list[str]):
    """dataset build's model, engine and sampling replaced: each prompt's reply is the next of
    `texts`; capturing a dump fails (the refusal must come before it)."""
    from types import SimpleNamespace

    import numpy as np

    from exactedit.runs.data import dataset as ds_mod

    class Engine:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bos_if_added(self):
            return None

    chat = SimpleNamespace(prompt=lambda p: p, specials=SimpleNamespace(turn_end=0))
    monkeypatch.setattr(ds_mod, "model_chat", lambda *a, **k: chat)
    monkeypatch.setattr(ds_mod, "LlamaEngine", Engine)
    monkeypatch.setattr(ds_mod, "prompt_tokens", lambda *a: np.ones(1, np.int32))
    monkeypatch.setattr(ds_mod, "chunk_texts", lambda *a: [])
    monkeypatch.setattr(ds_mod, "reply_stops", lambda *a: ())
    monkeypatch.setattr(ds_mod, "sample_replies", lambda *a, **k: [])
    monkeypatch.setattr(ds_mod, "by_prompt", lambda gens, n: [[None] for _ in texts])
    monkeypatch.setattr(ds_mod, "reply_infos", lambda prompts, samples, chat: [
        SimpleNamespace(name=f"r{i}", prompt=i, seed=i, tokens=[1, 2], stop="turn_end", text=t)
        for i, t in enumerate(texts)])

    def capture(*a, **k):
        raise AssertionError("a dump was captured before the replies were checked")
    monkeypatch.setattr(ds_mod, "capture_dump", capture)


def test_dataset_build_refuses_replies_discover_would_not_read_before_any_capture(tmp_path, monkeypatch):
    """The repro: dataset build wrote a replies.json over discover's limits (here its characters of
    text, made small), which `discover --model-text` then refused; now refused after the sampling,
    before any dump, naming the limit and the options that make it smaller."""
    from exactedit.evals.discover import sources
    from exactedit.runs.data import dataset as ds_mod

    monkeypatch.setattr(sources, "LIMITS", sources.Limits(chars=50))
    _fake_sampling(monkeypatch, ["a reply of thirty characters.."] * 4)
    with pytest.raises(EngineError, match=r"replies\.json: replies: 120 characters of reply text, over discover's 50 "
                                          r"\(limit of one side\).*--max-new or --samples, or fewer prompts"):
        ds_mod.build_dataset("m.gguf", ["p1", "p2", "p3", "p4"], ["you can use"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_dataset_build_refuses_more_replies_than_discover_reads_before_sampling(tmp_path, monkeypatch):
    from exactedit.evals.discover import sources
    from exactedit.runs.data import dataset as ds_mod

    monkeypatch.setattr(sources, "LIMITS", sources.Limits(records=7))

    def model_chat(*a, **k):
        raise AssertionError("the model was read: the reply count is known before")
    monkeypatch.setattr(ds_mod, "model_chat", model_chat)
    with pytest.raises(EngineError, match=r"4 prompts x 2 samples: 8 records, over discover's 7.*fewer --samples"):
        ds_mod.build_dataset("m.gguf", ["p1", "p2", "p3", "p4"], ["you can use"], tmp_path / "out")


def test_what_replies_json_writes_discover_reads_back(tmp_path, monkeypatch):
    """Every limit, small: what `replies_json` accepts, `discover`'s reader reads with the same
    limits; what it refuses, the reader refuses too."""
    import json

    from hypothesis import given, settings, strategies as st

    from exactedit.evals.discover import sources
    from exactedit.evals.discover.sources import DiscoverError, Limits, model_texts
    from exactedit.runs.data.mine import replies_json

    @given(st.lists(st.text(alphabet="ab \u00e9\u4e2d", min_size=1, max_size=40).filter(str.strip), min_size=1,
                    max_size=6),
           st.integers(200, 1500), st.integers(2, 6), st.integers(10, 150), st.integers(100, 400))
    @settings(max_examples=80, deadline=None)
    def check(texts, file_bytes, records, chars, record):
        limits = Limits(file_bytes=file_bytes, line_bytes=record, chars=chars, records=records)
        monkeypatch.setattr(sources, "LIMITS", limits)
        recs = [{"side": "base", "name": f"r{i}", "prompt": "p", "seed": i, "tokens": [1, 22, 333], "stop": "turn_end",
                 "text": t, "set": "train"} for i, t in enumerate(texts)]
        path = tmp_path / "replies.json"
        try:
            text = replies_json(recs, path, "fewer")
        except EngineError:
            path.write_text(json.dumps(recs, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            with pytest.raises(DiscoverError):
                model_texts([path], limits=limits)
            return
        path.write_text(text, encoding="utf-8")
        assert [t.text for t in model_texts([path], limits=limits)] == texts

    check()


def test_mine_replies_are_refused_before_writing_where_discover_would_not_read_them(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from exactedit.evals.discover import sources
    from exactedit.runs.data.mine import write_replies

    monkeypatch.setattr(sources, "LIMITS", sources.Limits(file_bytes=300))
    reply = SimpleNamespace(name="r", prompt=0, seed=0, tokens=list(range(40)), stop="max_new", text="a reply")
    with pytest.raises(EngineError, match=r"r\.json: replies: \d+ bytes, over discover's 300 \(limit of one file\).*"
                                          r"give a smaller --max-new or --samples"):
        write_replies(SimpleNamespace(replies=[reply], edited_replies=[]), ["p"], tmp_path / "r.json")
    assert not list(tmp_path.iterdir())
    short = SimpleNamespace(**{**vars(reply), "tokens": [1]})
    write_replies(SimpleNamespace(replies=[short], edited_replies=[]), ["p"], tmp_path / "r.json")
    assert [t.text for t in sources.model_texts([tmp_path / "r.json"])] == ["a reply"]


@pytest.mark.parametrize("kw, says", [
    ({"chunk": 4096}, "DatasetConfig: chunk: 4096 tokens per text document, more than the context's n_ctx 2048"),
    ({"max_new": 2048}, "Sampling: max_new: 2048 leaves no room for a prompt in the context of n_ctx 2048 tokens"),
])
def test_dataset_build_refuses_what_the_context_cannot_hold_before_the_model_loads(tmp_path, monkeypatch, kw, says):
    """Adversarial pass: `--chunk 4096` sampled every reply, then failed capturing the first text
    chunk ("4096 tokens exceed n_ctx 2048"), leaving half the dumps; `--max-new 10**9` said
    "needs 1..-999997952 tokens"."""
    from exactedit.runs.data import dataset as ds_mod

    def model_chat(*a, **k):
        raise AssertionError("the model was read")
    monkeypatch.setattr(ds_mod, "model_chat", model_chat)
    cfg = DatasetConfig(mine=MineConfig(sampling=Sampling(max_new=kw.get("max_new", 8)), samples=1),
                        chunk=kw.get("chunk", 256))
    with pytest.raises(EngineError, match=says):
        ds_mod.build_dataset("m.gguf", ["p1", "p2", "p3", "p4"], ["you can use"], tmp_path / "out", config=cfg)
    assert not (tmp_path / "out").exists()
