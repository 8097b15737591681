"""runs.loop.preflight: what `exactedit antislop` refuses before any generation, every problem in
one PreflightError naming its file and field. The tail and type refusals on the bundled hc4 fixture
and small synthetic GGUFs (which llama.cpp cannot load: that is listed too, never hidden); the
tokenizer and template checks live on SmolLM2-135M (its template in the GGUF, a tied Q8_0 head, a
Q4_1 ffn_down) and Gemma 3 270M (no template in its GGUF)."""
from __future__ import annotations

from pathlib import Path

import pytest

from exactedit.runs.loop.preflight import PreflightError, PreflightResult, preflight
from exactedit.quant.gguf.write import synthetic_model
from tests import oracles

# SmolLM2's tokenizer: " British" and " a" are one token each; " kaleidoscope" is " kale" "id" "oscope"
# and " cornucopia" " corn" "uc" "opia", " veritable" " ver" "itable"
GOOD = ["quintessentially British", "delve into"]
SPLIT = "truly a kaleidoscope"          # the ban one word earlier, "truly a", passes
SPLIT_TWICE = "a veritable cornucopia"  # one word earlier fails too


def refusal(model, phrases, **kw) -> PreflightError:
    with pytest.raises(PreflightError) as info:
        preflight(model, phrases, **kw)
    err = info.value
    assert str(err).count("\n  - ") == len(err.problems) > 0       # every problem is in the message
    return err


def fields(err: PreflightError) -> list[str]:
    return [p.field for p in err.problems]


def only(err: PreflightError, field: str):
    found = [p for p in err.problems if p.field == field]
    assert len(found) == 1, (field, [str(p) for p in err.problems])
    return found[0]


# ---- on fixture GGUFs (no public model needed) ---------------------------------------------------
def test_hc4_tail_is_refused():
    from exactedit.fixtures import DEFAULT_FIXTURE

    model = DEFAULT_FIXTURE / "model.gguf"
    err = refusal(model, GOOD)
    tail = only(err, "tail")
    assert tail.path == str(model) and "hc4" in tail.message and "rmsnorm tails only" in tail.message
    assert not any(f.startswith("tensor ") for f in fields(err))   # its Q6_K head and Q8_0 ffn_down are fine


def test_types_without_an_engine_matmul_are_refused_by_tensor(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", vocab=64, n=256, h=256, down_type="Q4_K", head_type="F16")
    err = refusal(w.path, GOOD)
    down, head = only(err, "tensor blk.1.ffn_down.weight"), only(err, "tensor output.weight")
    assert down.path == head.path == str(w.path)
    assert "Q4_K" in down.message and "solve wfld edits" in down.message
    assert "Q6_K" in down.message                                       # the supported types, named
    assert "F16" in head.message and "output head" in head.message
    assert "tail" not in fields(err)


def test_engine_types_pass(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", vocab=64, n=256, h=256, down_type="Q4_1", head_type="Q8_0", tied=True)
    err = refusal(w.path, GOOD)      # no template, and llama.cpp cannot load a synthetic model
    assert not any(f.startswith("tensor ") or f == "tail" for f in fields(err))


def test_missing_rms_eps_is_refused(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", vocab=64, down_type="Q8_0",
                        metadata={"llama.attention.layer_norm_rms_epsilon": "unset"})
    assert "missing" in only(refusal(w.path, GOOD), "llama.attention.layer_norm_rms_epsilon").message


def test_no_template_and_none_given(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", vocab=64)
    assert "--chat-template FILE" in only(refusal(w.path, GOOD), "tokenizer.chat_template").message


@pytest.mark.parametrize("source, why", [("{% if %}", "not a valid jinja2 template"), (None, "cannot read")])
def test_a_given_template_refused_names_its_file(tmp_path, source, why):
    w = synthetic_model(tmp_path / "m.gguf", vocab=64)
    tpl = tmp_path / "chat.jinja"
    if source is not None:
        tpl.write_text(source)
    err = refusal(w.path, GOOD, chat_template=tpl)
    p = only(err, "chat_template")
    assert p.path == str(tpl) and why in p.message.lower()
    assert "tokenizer.chat_template" not in fields(err)


def test_an_unreadable_model_and_the_phrase_list():
    err = refusal("/nonexistent/model.gguf", [])
    assert [(p.path, p.field) for p in err.problems] == [("/nonexistent/model.gguf", "file"), ("phrases", "phrases")]


def test_phrase_list_problems_are_all_listed(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", vocab=64)
    err = refusal(w.path, ["delve into", "", "delve   into", "one", 7], phrases_from="ban.txt")
    by_field = {p.field: p for p in err.problems if p.path == "ban.txt"}
    assert list(by_field) == ["phrases[1]", "phrases[2]", "phrases[3]", "phrases[4]"]
    assert "empty" in by_field["phrases[1]"].message
    assert "listed twice (first as phrases[0])" in by_field["phrases[2]"].message
    assert "one word" in by_field["phrases[3]"].message and "expected a string" in by_field["phrases[4]"].message
    assert "no phrases" in only(refusal(w.path, []), "phrases").message
    assert "one string" in only(refusal(w.path, "delve into"), "phrases").message


# ---- live: llama.cpp's tokenizer and the models' own templates -------------------------------------
@pytest.fixture(scope="module")
def smollm():
    return oracles.live_model("smollm")   # missing extra: a skip, or a failure in CI (tests/oracles.py)


@pytest.mark.live
def test_good_phrases_pass_with_what_was_learnt(smollm):
    r = preflight(smollm, GOOD)
    assert isinstance(r, PreflightResult)
    assert (r.tail, r.architecture, r.edited, r.edited_type, r.head, r.head_type, r.tied, r.template) == (
        "rmsnorm", "llama", "blk.29.ffn_down.weight", "Q4_1", "token_embd.weight", "Q8_0", True, "gguf")
    assert [(p.phrase, p.tokens) for p in r.phrases] == [
        ("quintessentially British", (" quint", "ess", "entially", " British")), ("delve into", (" delve", " into"))]
    assert r.to_dict()["phrases"][1]["final"] == r.phrases[1].final


@pytest.mark.live
def test_a_last_word_of_several_tokens_is_refused_by_name(smollm):
    err = refusal(smollm, [GOOD[0], SPLIT, SPLIT_TWICE], phrases_from="ban.txt")
    assert fields(err) == ["phrases[1]", "phrases[2]"]
    one, two = err.problems
    assert one.path == "ban.txt" and repr(SPLIT) in one.message and "' kaleidoscope'" in one.message
    assert "[' kale', 'id', 'oscope']" in one.message                   # the last word's tokens
    assert "ban one word earlier instead, 'truly a'" in one.message
    assert "[' corn', 'uc', 'opia']" in two.message and "'a veritable' fails the same test" in two.message


@pytest.mark.live
def test_every_problem_in_one_error(smollm, tmp_path):
    tpl = tmp_path / "broken.jinja"
    tpl.write_text("{% for m in messages %}{{ m.content }")
    err = refusal(smollm, [SPLIT, "delve into", "delve into", "x"], chat_template=tpl, phrases_from="ban.txt")
    assert [(p.path, p.field) for p in err.problems] == [
        (str(tpl), "chat_template"), ("ban.txt", "phrases[0]"), ("ban.txt", "phrases[2]"), ("ban.txt", "phrases[3]")]


@pytest.mark.live
def test_gemma_has_no_template_unless_given():
    from exactedit.runs.loop.inputs import BUNDLED

    gemma = oracles.live_model("gemma")
    p = only(refusal(gemma, ["delve into"]), "tokenizer.chat_template")
    assert p.path == str(gemma) and "--chat-template FILE" in p.message
    tpl = BUNDLED / "gemma" / "chat_template.jinja"   # the bundled one
    r = preflight(gemma, ["delve into"], chat_template=tpl)
    assert r.template == f"user:{tpl}"
    assert (r.tail, r.head_type, r.edited_type, r.tied) == ("rmsnorm", "Q8_0", "Q6_K", True)


# ---- preflight_head: what `exactedit persona` refuses before any generation -----------------------
def test_head_edit_refuses_a_tied_head_and_a_softcap(tmp_path):
    from exactedit.runs.loop.preflight import preflight_head

    w = synthetic_model(tmp_path / "m.gguf", vocab=64, n=256, h=256, tied=True, head_type="Q8_0",
                        metadata={"llama.final_logit_softcapping": 30.0})
    with pytest.raises(PreflightError) as info:
        preflight_head(w.path)
    got = {p.field: p for p in info.value.problems}
    assert "tied to the input embeddings" in got["token_embd.weight"].message
    assert "softcap" in got["llama.final_logit_softcapping"].message
    assert "tensor blk.1.ffn_down.weight" not in got        # a head edit never reads ffn_down's type


def test_head_edit_refuses_a_head_type_without_an_engine_matmul(tmp_path):
    from exactedit.runs.loop.preflight import preflight_head

    w = synthetic_model(tmp_path / "m.gguf", vocab=64, n=256, h=256, head_type="F16", down_type="Q4_K")
    with pytest.raises(PreflightError) as info:
        preflight_head(w.path)
    fields_ = [p.field for p in info.value.problems]
    assert "tensor output.weight" in fields_ and "tensor blk.1.ffn_down.weight" not in fields_


def test_head_edit_on_smollm_is_refused_for_its_tied_head(smollm):
    from exactedit.runs.loop.preflight import preflight_head

    with pytest.raises(PreflightError) as info:
        preflight_head(smollm)
    assert [p.field for p in info.value.problems] == ["token_embd.weight"]
