"""Compiled rules exported for other engines (solvers/shaping/export.py) on the shaping world (a
ChatML model whose phrases have several spellings): vLLM's bad words are the rule's forms;
transformers' sequence bias lists exactly the prefix tokenizations the rule matches (a brute force
over the rule's pieces), the model's own first, each one where the live rule fires, at the rule's
bias; the banned-strings list as lines or JSON and koboldcpp's cap; the grammar refuses the phrases;
what cannot be exported is named; outputs are written whole or not at all."""
from __future__ import annotations

import json

import pytest

from exactedit.solvers.phrases import ends_at_boundary, phrase_forms, split_last_word
from exactedit.solvers.shaping.compiled import write_compiled
from exactedit.solvers.shaping.export import (KOBOLD_MAX_BANS, VLLM_MAX_BAD_WORDS, ExportConfig, ExportError, Phrase,
                                               banned_strings, export_rules, penalty_phrases, prefix_tokenizations,
                                               render_export, vllm_body)
from exactedit.solvers.shaping.rules import Shaper
from tests.shaping_world import ID, TEXTS, chat, compiled, tokenize
from tests.gbnf_check import gbnf_accepts, naive_accepts, parse_gbnf


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    c = compiled(d)
    write_compiled(c, d / "rules.json")
    return c, d / "rules.json"


def test_vllm_bad_words_are_the_rule_forms(world, tmp_path):
    c, path = world
    r = export_rules(path, tmp_path / "v.json", ExportConfig("vllm"))
    body = json.loads((tmp_path / "v.json").read_text())
    assert body == {"bad_words": ["you can use", "You can use", "end to end", "End to end", "rather than",
                                  "Rather than"]}
    assert (r.phrases, r.entries, r.not_exported, r.warnings) == (3, 6, ("step0-guard", "persona-case"), ())
    assert "-inf" in render_export(r) and r.to_dict()["model"]["sha256"] == c.model["sha256"]
    many = [Phrase(f"X{i} y", 0, 6.0, {}) for i in range(VLLM_MAX_BAD_WORDS // 2 + 1)]     # one form each
    assert vllm_body(many[:-1])[1] == () and "VLLM_MAX_NUM_BAD_WORDS" in vllm_body(many)[1][0]


def _brute(prefix: bytes, pieces: dict[int, bytes]) -> set[tuple[int, ...]]:
    """Every tuple of pieces spelling `prefix` as the rule matches it, by a plain search: a first
    piece that is the prefix's start or ends with it after a word boundary, then pieces that spell
    the rest exactly."""
    out = set()

    def extend(seq, pos):
        if pos == len(prefix):
            out.add(seq)
        for t, b in pieces.items():
            if pos < len(prefix) and prefix.startswith(b, pos):
                extend(seq + (t,), pos + len(b))

    for t, b in pieces.items():
        for k in range(1, min(len(b), len(prefix)) + 1):
            if b.endswith(prefix[:k]) and (len(b) == k or ends_at_boundary(b[:-k])):
                extend((t,), k)
    return out


def test_prefix_tokenizations_are_exactly_the_rule_spellings(world):
    pen = world[0].rules[0]
    for p in pen.phrases:
        for form in phrase_forms(p.text, True):
            prefix = split_last_word(form)[0].encode()
            want = _brute(prefix, pen.pieces)
            total, seqs = prefix_tokenizations(prefix, pen.pieces, 10_000)
            assert total == len(want) == len(seqs) and set(seqs) == want, form
            assert [len(s) for s in seqs] == sorted(len(s) for s in seqs)
            if form == "you can use":
                assert seqs[0] == tuple(tokenize(" you can", False))     # the model's own spelling first
            capped = prefix_tokenizations(prefix, pen.pieces, 2)
            assert capped == (total, seqs[:2])


def test_hf_sequence_bias_fires_where_the_rule_fires(world, tmp_path):
    c, path = world
    r = export_rules(path, tmp_path / "h.json", ExportConfig("hf", max_tokenizations=1000))
    entries = json.loads((tmp_path / "h.json").read_text())["sequence_bias"]
    assert r.entries == len(entries) and not r.warnings and all(b == -6.0 for _, b in entries)
    finals = {p.final for p in c.rules[0].phrases}
    for ids, _ in entries:
        assert ids[-1] in finals
        sh = Shaper([c.rules[0]], c.vocab)
        for tok in chat(*[TEXTS[t] for t in ids[:-1]]):
            sh.push(tok)
        assert ids[-1] in sh.hits()[0], [TEXTS[t] for t in ids]
    assert [ID[" you"], ID[" can"], ID[" use"]] in [e[0] for e in entries]
    assert [ID["(you"], ID[" ca"], ID["n"], ID[" use"]] in [e[0] for e in entries]
    assert {d["phrase"]: d["tokenizations"] == d["emitted"] for d in r.detail} == {
        "you can use": True, "end to end": True, "rather than": True}


def test_hf_cap_is_reported(world, tmp_path):
    r = export_rules(world[1], tmp_path / "h.json", ExportConfig("hf", max_tokenizations=1))
    assert r.entries == sum(d["emitted"] for d in r.detail) and "max-tokenizations 1" in r.warnings[0]
    assert "of" in render_export(r) and any(d["emitted"] < d["tokenizations"] for d in r.detail)


@pytest.mark.parametrize("name, style, want", [
    ("b.txt", None, "you can use\nend to end\nrather than\n"),
    ("b.json", None, '[\n "you can use",\n "end to end",\n "rather than"\n]\n'),
    ("b.txt", "json", '[\n "you can use",\n "end to end",\n "rather than"\n]\n'),
    ("b.json", "lines", "you can use\nend to end\nrather than\n"),
])
def test_banned_strings_lines_or_json(world, tmp_path, name, style, want):
    r = export_rules(world[1], tmp_path / name, ExportConfig("banned-strings", list_style=style))
    assert (tmp_path / name).read_text() == want and r.entries == 3 and not r.warnings


def test_banned_strings_warns_past_koboldcpp_cap():
    many = [Phrase(f"w{i} x", 0, 6.0, {}) for i in range(KOBOLD_MAX_BANS + 1)]
    text, n, warn = banned_strings(many, "lines")
    assert n == KOBOLD_MAX_BANS + 1 and text.count("\n") == n and str(KOBOLD_MAX_BANS) in warn[0]
    assert banned_strings(many[:-1], "json")[2] == ()


@pytest.mark.parametrize("case", ["rules", "fold"])
def test_gbnf_refuses_the_phrases(world, tmp_path, case):
    r = export_rules(world[1], tmp_path / "g.gbnf", ExportConfig("gbnf", case=case))
    rules = parse_gbnf((tmp_path / "g.gbnf").read_text())
    assert r.states == r.entries == len(rules) - 1
    phrases = [p.text for p in world[0].rules[0].phrases]
    for s in ("So you can use it", "You can use", "end to end.", "the end to endpoint", "(rather than",
              "you can us", "Rather Than", "YOU CAN USE"):
        assert gbnf_accepts(rules, s) == naive_accepts(s, phrases, case), s


def test_nothing_to_export_and_bad_configs(tmp_path):
    c = compiled(tmp_path, "[step0-guard]\nbias = 6.0\n")
    write_compiled(c, tmp_path / "r.json")
    assert penalty_phrases(c) == ((), ("step0-guard",))
    with pytest.raises(ExportError, match="no prefix-penalty rule"):
        export_rules(tmp_path / "r.json", tmp_path / "o.json", ExportConfig("vllm"))
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "o.json.tmp").exists()
    for bad in ({"format": "ollama"}, {"format": "gbnf", "case": "upper"}, {"format": "hf", "max_tokenizations": 0},
                {"format": "banned-strings", "list_style": "csv"}):
        with pytest.raises(ValueError):
            ExportConfig(**bad)


def test_a_failed_export_leaves_the_previous_output(world, tmp_path):
    """The grammar's cap refuses before a byte is written: the old file stays, no .tmp is left."""
    from exactedit.solvers.shaping.gbnf import GrammarError

    out = tmp_path / "g.gbnf"
    out.write_text("previous\n")
    with pytest.raises(GrammarError, match="more than 3 automaton states"):
        export_rules(world[1], out, ExportConfig("gbnf", max_states=3))
    assert out.read_text() == "previous\n" and not (tmp_path / "g.gbnf.tmp").exists()
    export_rules(world[1], out, ExportConfig("gbnf"))
    assert out.read_text().startswith("# exactedit shape export") and not (tmp_path / "g.gbnf.tmp").exists()
