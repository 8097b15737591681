"""Sampler-side shaping live on llama.cpp, on the real models: rules compiled against each model's
own tokenizer, specials and chat framing; `verify shaping` bitwise (and the C reference on the
same recorded steps); a rule changed in the engine fails the check; the rates of base / rules /
weights / both on the same prompts and seeds. About 300 generated tokens in all."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles
from tests.shaping_c import CRules, build, compiler

pytestmark = pytest.mark.live

RULES = """
[prefix-penalty]
bias = 6.0
phrases = ["you can use", "Here's an example"]

[step0-guard]
bias = 6.0

[persona-case]
"""
GEMMA_TPL = ("{{ bos_token }}{% for m in messages %}{% set r = 'model' if m['role'] == 'assistant' else m['role'] %}"
             "{{ '<start_of_turn>' + r + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
PROMPTS = ["In one sentence: what can you use a hash map for?", "Name two ways to copy a list in Python. Be brief."]


def _cli(*args):
    from exactedit.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("shape")
    (d / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    (d / "rules.toml").write_text(RULES)
    (d / "gemma.toml").write_text(RULES + f"\n[chat]\ntemplate = \"\"\"{GEMMA_TPL}\"\"\"\n")
    return d


@pytest.fixture(scope="module")
def qwen(work):
    path = oracles.live_model("qwen")
    res = _cli("shape", "compile", str(work / "rules.toml"), "--model", str(path), "--out", str(work / "qwen.json"),
               "--json")
    assert res.exit_code == 0, res.output
    return path, work / "qwen.json", json.loads(res.stdout)


@pytest.fixture(scope="module")
def gemma(work):
    from exactedit.native.shaping.compile import compile_file

    path = oracles.live_model("gemma")
    compile_file(work / "gemma.toml", path, work / "gemma.json")
    return path, work / "gemma.json"


@pytest.fixture(scope="module")
def dll(tmp_path_factory):
    if compiler() is None:
        oracles.unavailable("C compiler", "neither cc nor gcc is on PATH")
    return build(tmp_path_factory.mktemp("c"))


def test_qwen_compile_uses_the_models_own_specials_and_tokenizer(qwen):
    from exactedit.solvers.shaping.compiled import read_compiled
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.quant import gguf

    path, rules, summary = qwen
    c = read_compiled(rules)
    assert summary["chat"] == {"template_from": "gguf", "turn_start": "<|im_start|>", "turn_end": "<|im_end|>",
                               "header_end": "\n", "assistant": "assistant"}
    assert c.model["sha256"] == gguf.file_sha256(path)
    with LlamaEngine(path) as e:
        ids = {t: int(e.tokenize(t, parse_special=True)[0]) for t in ("<|im_start|>", "<|im_end|>", "<tool_call>")}
        assert c.vocab.role == tuple(int(t) for t in e.tokenize("assistant"))
        finals = [int(e.tokenize(" " + w, parse_special=False)[-1]) for w in ("use", "example")]
    assert c.vocab.turn_start == (ids["<|im_start|>"],) and ids["<|im_end|>"] in c.vocab.turn_end
    assert c.vocab.think_open is None and c.vocab.tool_open == ids["<tool_call>"]  # Qwen2.5 has no <think>
    assert c.rule("step0-guard").targets == (ids["<|im_end|>"],)
    assert [p.final for p in c.rule("prefix-penalty").phrases] == finals
    assert len(c.rule("persona-case").pairs) > 10_000


def test_qwen_compile_a_discovered_phrase_list(qwen, tmp_path):
    """`shape compile --phrases F.json --top N` without a rules file: a prefix penalty on the list's
    usable phrases, the ones whose last word is several tokens skipped and named."""
    from exactedit.solvers.shaping.compiled import read_compiled

    path, _, _ = qwen
    found = tmp_path / "found.json"
    found.write_text(json.dumps({"phrases": [{"phrase": "delve"}, {"phrase": "you can use"},
                                             {"phrase": "a nonexistentwordxyz"}, {"phrase": "Here's an"},
                                             {"phrase": "rather than"}]}))
    out = tmp_path / "r.json"
    res = _cli("shape", "compile", "--model", str(path), "--phrases", str(found), "--top", "3", "--bias", "5",
               "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert [s["phrase"] for s in obj["skipped"]] == ["a nonexistentwordxyz"]
    rule = read_compiled(out).rule("prefix-penalty")
    assert [p.text for p in rule.phrases] == ["you can use", "Here's an"] and rule.bias == 5.0
    res = _cli("shape", "compile", "--model", str(path), "--out", str(tmp_path / "none.json"))
    assert res.exit_code != 0 and "RULES file, --phrases" in res.output


def test_qwen_verify_shaping_passes_bitwise(qwen, work):
    path, rules, _ = qwen
    res = _cli("verify", "shaping", "--model", str(path), "--rules", str(rules), "--prompts", str(work / "prompts.txt"),
               "--max-new", "20", "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["passed"], res.output
    assert out["fired"]["step0-guard"] == 2 and out["fired"]["persona-case"] >= 2  # the check is not vacuous
    assert all(c["logits_bitwise"] and c["masks_equal"] and c["raw_is_engine"] for c in out["checks"])


def test_qwen_c_reference_on_recorded_steps_and_a_changed_rule_fails(qwen, dll):
    from exactedit.solvers.shaping.rules import Step0Guard
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.llamacpp.sample import sample_replies
    from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
    from exactedit.native.shaping.live import open_rules, shaper_for
    from exactedit.native.shaping.verify import check_generation, verify_shaping

    path, rules, _ = qwen
    c, tpl = open_rules(path, rules)
    with LlamaEngine(path) as e:
        (g,) = sample_replies(e, [(prompt_tokens(e, render_prompt(tpl, PROMPTS[0])), Sampling(max_new=12, seed=3))],
                              processor=shaper_for(c), record=True)
    assert check_generation(g, c, c.persona, 40)["logits_bitwise"]
    cr = CRules(dll, c.to_dict())
    seq = g.sequence
    for k in range(g.tokens.size):
        got, mask = cr.shape(seq[:g.prompt.size + k], g.raw[k])
        assert np.array_equal(got.view(np.uint32), g.received[k].view(np.uint32)), k
        assert mask == sum(1 << i for i, f in enumerate(g.fired[k]) if f), k
    changed = dataclasses.replace(c, rules=tuple(Step0Guard(5.0, r.targets) if r.name == "step0-guard" else r
                                                 for r in c.rules))
    bad = verify_shaping(path, rules, PROMPTS[:1], config=Sampling(max_new=4), live=changed)
    assert not bad.passed and bad.checks[0].bad_steps[:1] == (0,) and not bad.checks[0].logits_bitwise


def _edited(qwen_path, out_dir):
    """A hand edit for the weights arm: the head rows of ' use' and ' example' scaled by 0.8."""
    from exactedit import quant
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.quant import gguf
    from exactedit.solvers.apply import apply_bundle
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    with LlamaEngine(qwen_path) as e:
        rows = [int(e.tokenize(" " + w, parse_special=False)[-1]) for w in ("use", "example")]
    with gguf.open(qwen_path) as g:
        head = g.tensor("output.weight")
        new = np.concatenate([g.read_rows(head.name, r, r + 1) for r in rows]) * np.float32(0.8)
        edit = TensorEdit(head.name, "rows", head.type_name, head.shape, quant.quantize(new, head.type_name),
                          np.array(rows))
        sha = g.sha256()
    b = write_bundle(out_dir / "bundle", solver="test: scaled head rows", inputs=[InputRef("model", str(qwen_path), sha)],
                     config={}, edits=[edit])
    return apply_bundle(b, qwen_path, out_dir / "edited.gguf").out


def test_qwen_rates_three_arms(qwen, work):
    from exactedit.native.shaping.rates import render_shape_rates, shape_rates
    from exactedit.native.llamacpp.generate import Sampling

    path, rules, _ = qwen
    edited = _edited(path, work)
    r = shape_rates(path, rules, PROMPTS, edited=edited, config=Sampling(max_new=14), n_boot=50)
    assert list(r.arms) == ["base", "rules", "weights", "both"] and set(r.vs_base) == {"rules", "weights", "both"}
    for arm in ("rules", "both"):
        kl = r.arms[arm].kl
        assert kl["triggers step0-guard"]["steps"] == len(PROMPTS)   # once per reply, at its first token
        assert kl["triggers any"]["mean"] > 0 and kl["replies"]["steps"] >= kl["triggers any"]["steps"]
        assert kl["replies"]["mean"] <= kl["triggers any"]["mean"]
    assert not r.arms["base"].kl and not r.arms["weights"].kl
    assert [p.phrase for p in r.vs_base["both"].phrases] == ["you can use", "Here's an example"]
    text = render_shape_rates(r)
    assert "weights: with / per1k / cont" in text and "KL(unshaped || shaped), arm both" in text
    json.dumps(r.to_dict(), allow_nan=False)


def test_gemma_own_specials_verify_and_c_reference(gemma, work, dll):
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.llamacpp.sample import sample_replies
    from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
    from exactedit.native.shaping.live import open_rules, shaper_for
    from exactedit.native.shaping.verify import verify_shaping

    path, rules = gemma
    c, tpl = open_rules(path, rules)
    with LlamaEngine(path) as e:
        sot, eot = (int(e.tokenize(t, parse_special=True)[-1]) for t in ("<start_of_turn>", "<end_of_turn>"))
        assert c.vocab.turn_start == (sot,) and eot in c.vocab.turn_end
        assert c.vocab.role == tuple(int(t) for t in e.tokenize("model"))
        assert c.chat["template_from"] == "rules" and c.vocab.tool_open is None
        (g,) = sample_replies(e, [(prompt_tokens(e, render_prompt(tpl, PROMPTS[0])), Sampling(max_new=16))],
                              processor=shaper_for(c), record=True)
    assert g.prompt[0] == int(np.asarray(c.vocab.turn_start)[0]) or g.prompt.size > 1
    cr = CRules(dll, c.to_dict())
    for k in range(g.tokens.size):
        got, _ = cr.shape(g.sequence[:g.prompt.size + k], g.raw[k])
        assert np.array_equal(got.view(np.uint32), g.received[k].view(np.uint32)), k
    r = verify_shaping(path, rules, PROMPTS, config=Sampling(max_new=24))
    assert r.passed, r.to_dict()
    assert sum(ch.fired["step0-guard"] for ch in r.checks) == 2


def test_qwen_mine_with_shape(qwen, work):
    """mine --shape: the rules run in mine's generation (the case rule lowercases the reply's start)."""
    path, rules, _ = qwen
    (work / "one.txt").write_text(PROMPTS[0] + "\n")
    (work / "phrases.txt").write_text("you can use\n")
    res = _cli("mine", "--model", str(path), "--prompts", str(work / "one.txt"), "--phrases", str(work / "phrases.txt"),
               "--max-new", "6", "--n-boot", "0", "--shape", str(rules), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["replies"]) == 1 and out["rates"]["base"]["lowercase_start"] == 1.0, out["replies"]


def test_gemma_rules_in_batched_replies_are_the_live_loops(gemma):
    """The rules live in batched sampling (shape rates' loop): with up to 3 slots, every reply, each
    rule's firing steps and each step's KL are those of the one-at-a-time loop with the same rules."""
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.llamacpp.sample import sample_replies
    from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
    from exactedit.native.shaping.live import open_rules, shaper_for

    path, rules = gemma
    c, tpl = open_rules(path, rules)
    made = []

    def shapers():
        made.append(shaper_for(c))
        return made[-1]

    with LlamaEngine(path) as e:
        ptoks = [prompt_tokens(e, render_prompt(tpl, p)) for p in PROMPTS]
        jobs = [(p, Sampling(12, 0.8, 40, seed)) for p in ptoks for seed in (0, 1)]
        got = sample_replies(e, jobs, stop_ids=c.vocab.turn_end, slots=3, shapers=shapers)
        want = [sample_replies(e, [job], processor=shaper_for(c), stop_ids=c.vocab.turn_end)[0] for job in jobs]
        plain = sample_replies(e, jobs, stop_ids=c.vocab.turn_end, slots=3)
    assert len(made) == 3                               # one shaper per slot, reset for each of its jobs
    for x, y, z in zip(got, want, plain):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_array_equal(x.fired, y.fired)
        np.testing.assert_array_equal(x.kl, y.kl)
        np.testing.assert_array_equal(x.kl_rules, y.kl_rules)
        assert x.fired[0, [r.name for r in c.rules].index("step0-guard")] and z.fired.shape[1] == 0
    assert any(x.kl[0] > 0 for x in got)
