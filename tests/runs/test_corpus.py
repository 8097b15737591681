"""dataset corpus (runs/data/corpus.py) without an engine: the stdlib docstring walker (skips,
bounds, order), uses and slop contexts by the shared matcher on the synthetic word table, window
cutting and merging, the split by source document, the round-robin budget, and the plan on a
synthetic corpus; capture_dump's keep_logits. The live build on SmolLM2 is test_live_corpus.py."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.native.llamacpp.engine import EngineError
from exactedit.runs.data.corpus import (CorpusConfig, Source, merge, phrase_words, plan, scan, select, split_sources,
    stdlib_sources, text_sources, window)
from exactedit.solvers.phrases import PhraseMatcher, TokenBytes
from exactedit.solvers.tail.model import TokenTable
from tests.solvers.l47 import synth


@pytest.fixture(scope="module")
def table():
    tokens, types = synth.vocab()
    return TokenTable(tuple(tokens), tuple(types), "bpe")


@pytest.fixture(scope="module")
def ids():
    return synth.Ids()


@pytest.fixture(scope="module")
def matcher(table):
    return PhraseMatcher(synth.PHRASES, TokenBytes(table))


def test_stdlib_walker_takes_docstrings_in_order_and_skips(tmp_path):
    def put(rel, text):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    put("b.py", '"""Module b.\n\n\n\n   Indented   line.   """\nclass C:\n    """Class C."""\n'
                '    def f(self):\n        """Method f."""\n    async def g(self):\n        """Coroutine g."""\n')
    put("a/x.py", 'def h():\n    """Function h."""\n')
    put("a/none.py", "x = 1\n")
    put("bad.py", '"""Broken."""\ndef (:\n')
    put("big.py", '"""Big."""\n' + "#" * 2000 + "\n")
    for skip in ("test", "tests", "idlelib", "lib2to3", "site-packages", "pkg/tests"):
        put(f"{skip}/s.py", '"""Skipped."""\n')
    put("notes.txt", '"""Not python."""\n')
    got = stdlib_sources(tmp_path, max_file_bytes=1000)
    assert [s.name for s in got] == ["stdlib:a/x.py", "stdlib:b.py"]
    assert got[1].text == "Module b.\n\nIndented   line.\n\nClass C.\n\nMethod f.\n\nCoroutine g."
    assert stdlib_sources(tmp_path, max_file_bytes=1000) == got                 # deterministic
    assert [s.name for s in stdlib_sources(tmp_path)][:2] == ["stdlib:a/x.py", "stdlib:b.py"]
    assert "stdlib:big.py" in [s.name for s in stdlib_sources(tmp_path)]      # under the default bound


def test_the_real_stdlib_gives_prose_sources():
    got = stdlib_sources()
    names = [s.name for s in got]
    assert len(got) > 100 and names == sorted(names)
    assert "stdlib:json/decoder.py" in names
    assert not any("/test/" in n or n.startswith(("stdlib:test/", "stdlib:idlelib/")) for n in names)
    assert all(s.text.strip() for s in got)


def test_text_sources_are_named_by_file_and_checked(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "t.txt").write_text("one text")
    (tmp_path / "u.txt").write_text("other")
    assert text_sources([tmp_path / "a" / "t.txt", tmp_path / "u.txt"]) == [Source("t.txt", "one text"),
                                                                           Source("u.txt", "other")]
    (tmp_path / "t.txt").write_text("same name")
    with pytest.raises(EngineError, match="also named"):
        text_sources([tmp_path / "a" / "t.txt", tmp_path / "t.txt"])
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(EngineError, match="UTF-8"):
        text_sources([tmp_path / "bin.txt"])


def test_words_are_the_phrases_final_tokens(table, ids):
    assert phrase_words(table, ["rather than", "end to end"]) == tuple(sorted(ids(" than", " end")))


def test_scan_excludes_slop_contexts_by_the_shared_matcher(ids, matcher):
    w = np.asarray(sorted(ids(" than", " end")))
    toks = ids.text("we do more than this rather than it. the end to end test is at the end")
    uses, word, slop = scan(toks, w, matcher)
    nxt = np.asarray(toks)[1:]
    # " than" after "more": a use; after "rather": the phrase's context; " end" after "the": a use (twice),
    # the second " end" of "end to end" is a context
    assert sorted(np.asarray(toks)[uses + 1].tolist()) == sorted(ids(" than", " end", " end"))
    assert [int(nxt[r]) for r in slop] == ids(" than", " end")
    assert np.array_equal(w[word], np.asarray(toks)[uses + 1])
    assert not set(uses.tolist()) & set(slop.tolist())


def test_window_and_merge():
    cfg = CorpusConfig(context=4, after=2, max_window=12)
    assert window(10, 100, cfg) == (7, 14)          # rows 7..10 of context, the word at 11, 2 more
    assert window(1, 100, cfg) == (0, 5) and window(97, 100, cfg) == (94, 100)
    assert merge([(7, 14), (0, 5), (12, 19)], 12) == [(0, 5), (7, 19)]
    assert merge([(0, 5), (5, 9)], 12) == [(0, 9)]                  # touching spans merge
    assert merge([(0, 10), (5, 15)], 12) == [(0, 10), (10, 15)]     # too long: no token twice
    assert merge([(0, 10), (2, 8)], 12) == [(0, 10)]


def test_split_is_by_source_stable_and_cut_by_shares():
    names = [f"stdlib:m{i}.py" for i in range(40)]
    cfg = CorpusConfig()
    g = split_sources(names, cfg)
    assert {k: len(v) for k, v in g.items()} == {"solve": 20, "dev": 10, "collateral": 10}
    assert sorted(i for v in g.values() for i in v) == list(range(40))
    assert split_sources(names, cfg) == g
    assert split_sources(names[::-1], cfg)["dev"] == sorted(39 - i for i in g["dev"])
    assert split_sources(names, CorpusConfig(seed=1)) != g
    assert all(len(v) == 1 for v in split_sources(names[:3], cfg).values())
    with pytest.raises(EngineError, match="shares"):
        CorpusConfig(solve=0.5, dev=0.5, collateral=0.25)
    with pytest.raises(EngineError, match="max_window"):
        CorpusConfig(context=48, after=8, max_window=40)


def test_round_robin_budget_does_not_starve_the_rare_word():
    cfg = CorpusConfig(context=4, after=1, max_window=64)      # a window is 6 tokens away from the edges
    common = [(0, r) for r in range(10, 1000, 20)]             # 50 uses, far apart
    rare = [(1, 10), (1, 50)]
    spans, taken = select([common, rare], [1000, 100], 70, cfg)
    assert taken == [9, 2] and sum(b - a for s in spans.values() for a, b in s) == 66
    spans, taken = select([rare, common], [1000, 100], 70, cfg)
    assert taken == [2, 9]
    spans, taken = select([common, rare], [1000, 100], 1000, cfg)
    assert taken == [50, 2]                                     # the rare word runs out, the other goes on
    # a use inside a window already taken costs nothing and takes no window
    spans, taken = select([[(0, 10)], [(0, 11)]], [100], 100, cfg)
    assert taken == [1, 0] and spans == {0: [(7, 13)]}
    # overlapping windows merge and cost only their union
    spans, taken = select([[(0, 10), (0, 13)]], [100], 10, cfg)
    assert taken == [2] and spans == {0: [(7, 16)]}
    assert select([common], [1000], 5, cfg) == ({}, [0])      # nothing fits


def test_plan_on_a_synthetic_corpus(ids, matcher):
    words = {ids(" than")[0]: " than", ids(" end")[0]: " end"}
    sentences = ["we do more than this.", "the end is today.", "rather than this, we go.", "end to end now."]
    sources = [Source(f"s{k}", " ".join(sentences[(k + j) % 4] for j in range(3 + k % 5))) for k in range(24)]
    tokens = [np.asarray(ids.text(s.text), np.int32) for s in sources]
    cfg = CorpusConfig(context=5, after=2, max_window=64, max_tokens=240)
    p = plan(sources, tokens, words, matcher, cfg)
    assert plan(sources, tokens, words, matcher, cfg) == p                      # deterministic
    assert [x.name for x in p.parts] == ["solve", "dev", "collateral"]
    assert [x.budget for x in p.parts] == [120, 60, 60]
    assert [x.assigned for x in p.parts] == [12, 6, 6]
    seen = [set(x.sources) for x in p.parts]
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])   # no source in two parts
    for x in p.parts:
        assert 0 < x.rows <= x.budget and x.windows == len(p.windows[x.name])
        assert x.uses[" than"] > 0 and x.uses[" end"] > 0
        assert abs(x.taken[" than"] - x.taken[" end"]) <= 1 or min(x.taken.values()) == 0
        # uses inside the windows, recounted row by row: next token a word, no phrase prefix before it
        n = 0
        for d, a, b in p.windows[x.name]:
            t = tokens[d][a:b]
            for r in range(t.size - 1):
                if int(t[r + 1]) in words and matcher.match_row(t, r, int(t[r + 1]), 0) is None:
                    n += 1
        assert n == sum(x.uses.values())
    assert p.corpus["sources"] == 24 and p.corpus["slop_contexts"] > 0


def test_capture_keep_logits_is_a_keyword_defaulting_to_true():
    import inspect

    from exactedit.native.llamacpp.capture import capture_dump

    param = inspect.signature(capture_dump).parameters["keep_logits"]
    assert param.default is True and param.kind is inspect.Parameter.KEYWORD_ONLY


def test_build_refuses_an_existing_out(tmp_path):
    from exactedit.runs.data.corpus import build_corpus

    with pytest.raises(EngineError, match="exists"):
        build_corpus("m.gguf", ["you can use"], tmp_path)


def test_cli_dataset_corpus_wires_flags_and_reports_config_errors_cleanly(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from exactedit import cli
    from exactedit.runs.data import corpus as corpus_mod

    (tmp_path / "m.gguf").write_bytes(b"")
    (tmp_path / "p.txt").write_text("you can use\n")
    args = ["dataset", "corpus", "--model", str(tmp_path / "m.gguf"), "--phrases", str(tmp_path / "p.txt"),
            "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(cli.main, args + ["--solve", "0.9"])
    assert res.exit_code == 1 and "shares" in res.output and "Traceback" not in res.output
    seen = {}

    def fake(model, phrases, out, *, texts, config, settings, overwrite, progress):
        seen.update(phrases=phrases, texts=texts, config=config, overwrite=overwrite)
        return corpus_mod.CorpusResult(tmp_path / "out", {" use": 7}, {"sources": 1, "tokens": 9, "uses": {" use": 1},
                                       "slop_contexts": 0}, (), (), {}, {})

    monkeypatch.setattr(corpus_mod, "build_corpus", fake)
    res = CliRunner().invoke(cli.main, args + ["--max-tokens", "600", "--context", "16", "--seed", "3", "--json",
                                               "--texts", str(tmp_path / "p.txt")])
    assert res.exit_code == 0, res.output
    assert seen["config"] == CorpusConfig(max_tokens=600, context=16, seed=3) and seen["phrases"] == ["you can use"]
    assert seen["texts"] == [str(tmp_path / "p.txt")]
    assert '"words"' in res.output


def test_a_words_uses_are_taken_from_the_callers_texts_first(ids, matcher):
    """The budget takes a word's uses by source rank (texts, then general English, then the stdlib):
    with room for a few windows only, every window of each part comes from the texts while they
    have uses, and the uses are counted by source kind."""
    words = {ids(" than")[0]: " than"}
    line = "we do more than this. " * 6
    sources = ([Source(f"std{k}", line, "stdlib") for k in range(12)] + [Source(f"en{k}", line, "english")
                                                                      for k in range(12)]
               + [Source(f"t{k}", line) for k in range(12)])
    tokens = [np.asarray(ids.text(s.text), np.int32) for s in sources]
    cfg = CorpusConfig(context=3, after=1, max_window=64, max_tokens=48)
    p = plan(sources, tokens, words, matcher, cfg)
    kind = {s.name: s.kind for s in sources}
    for x in p.parts:
        assert x.windows > 0 and {kind[n] for n in x.sources} == {"text"}, x
        assert x.by_kind == {"text": x.uses}
    assert p.corpus["kinds"] == {"text": 12, "english": 12, "stdlib": 12}
    # without the texts, general English comes before the stdlib
    p = plan(sources[:24], tokens[:24], words, matcher, cfg)
    assert all({kind[n] for n in x.sources} == {"english"} for x in p.parts)
    # with a budget for everything, every kind is windowed and the counts add up
    p = plan(sources, tokens, words, matcher, CorpusConfig(context=3, after=1, max_window=64, max_tokens=100_000))
    for x in p.parts:
        assert set(x.by_kind) == {"text", "english", "stdlib"}
        assert sum(k[" than"] for k in x.by_kind.values()) == x.uses[" than"]


def test_corpus_sources_order_and_switches(tmp_path):
    from exactedit.runs.data.corpus import corpus_sources, english_digest, english_sources

    eng = tmp_path / "english"
    eng.mkdir()
    (eng / "02-b.txt").write_text("second")
    (eng / "01-a.txt").write_text("first")
    (eng / "notes.md").write_text("not a source")
    (tmp_path / "mine.txt").write_text("my own text")
    std = tmp_path / "std"
    std.mkdir()
    (std / "m.py").write_text('"""Docs."""\n')
    got = corpus_sources(CorpusConfig(), [tmp_path / "mine.txt"], stdlib_root=std, english_root=eng)
    assert [(s.name, s.kind) for s in got] == [("mine.txt", "text"), ("english:01-a.txt", "english"),
                                               ("english:02-b.txt", "english"), ("stdlib:m.py", "stdlib")]
    assert [s.name for s in corpus_sources(CorpusConfig(english=False, stdlib=False), [tmp_path / "mine.txt"],
                                           stdlib_root=std, english_root=eng)] == ["mine.txt"]
    d = english_digest(eng)
    (eng / "01-a.txt").write_text("First")
    assert english_digest(eng) != d and len(d) == 64
    assert english_sources(tmp_path / "missing") == []


def test_the_bundled_general_english_corpus_is_there_and_ordinary():
    """The bundled corpus (runs/bundled/english/) ships: many documents of ordinary prose, each a
    readable UTF-8 source, with ordinary uses of words the slop phrases end in, and none of the
    clichés it is written to avoid."""
    import re

    from exactedit.runs.data.corpus import english_sources

    got = english_sources()
    assert len(got) >= 30 and all(s.kind == "english" and s.name.startswith("english:") for s in got)
    text = "\n".join(s.text for s in got).lower()
    assert len(text.split()) >= 25_000
    for word in ("an", "use", "example", "do", "list", "code", "way", "here", "following"):
        assert len(re.findall(rf"\b{word}\b", text)) >= 5, word
    for word in ("snippet", "explanation"):          # rare in any English: a few uses, in ordinary senses
        assert len(re.findall(rf"\b{word}\b", text)) >= 3, word
    for cliche in ("delve", "tapestry", "testament to", "it's important to note", "i hope this helps"):
        assert cliche not in text, cliche


def test_the_antislop_report_shows_the_corpus_budget_and_uses_per_word_by_source():
    from exactedit.runs.antislop.report import corpus_md

    part = {"name": "dev", "budget": 3000, "windows": 4, "rows": 120, "uses": {" use": 5, " do": 0},
            "taken": {" use": 3, " do": 0}, "by_kind": {"text": {" use": 2, " do": 0}, "english": {" use": 3, " do": 0}}}
    old = {**part, "name": "solve"}
    del old["by_kind"]                                   # a record written before the kinds were counted
    md = corpus_md({"corpus": {"sources": 52, "kinds": {"text": 2, "english": 40, "stdlib": 10}}, "parts": [old, part],
                    "warnings": ["dev: 0 uses of ' do' (fewer than 10)"]})
    text = "\n".join(md)
    assert "52 sources, 2 text, 40 english, 10 stdlib" in text
    assert "| dev | 3000 | 4 | 120 | ' use' 5 (3; text 2; english 3); ' do' 0 (0; text 0; english 0) |" in text
    assert "| solve | 3000 | 4 | 120 | ' use' 5 (3); ' do' 0 (0) |" in text
    assert md[-1] == "warning: dev: 0 uses of ' do' (fewer than 10)"


def test_the_stdlib_walker_reads_pydocs_topics_one_source_each_without_running_them(tmp_path):
    (tmp_path / "pydoc_data").mkdir()
    (tmp_path / "pydoc_data" / "topics.py").write_text(
        "# Autogenerated\ntopics = {'b': 'Second topic.\\n\\n\\n\\nMore.', 'a': 'First topic.', 'c': '', 1: 'x',\n"
        "          'd': f'{1}'}\nimport os; os.remove(__file__)\n")
    got = stdlib_sources(tmp_path)
    assert [(s.name, s.text, s.kind) for s in got] == [
        ("stdlib:pydoc_data/topics.py#a", "First topic.", "stdlib"),
        ("stdlib:pydoc_data/topics.py#b", "Second topic.\n\nMore.", "stdlib")]
    assert (tmp_path / "pydoc_data" / "topics.py").exists()                  # parsed, never run
    real = [s for s in stdlib_sources() if s.name.startswith("stdlib:pydoc_data/topics.py#")]
    assert len(real) > 20 and all(s.text for s in real)
