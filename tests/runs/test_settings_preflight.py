"""Every setting of `exactedit antislop` (and `demo --model`, the same run) and `exactedit persona`
checked before any generation, all problems in one error (issue 38.4), seeds in llama.cpp's range
(38.7), and the banned words bar (d) will not measure named before the run (38.11, issue 43). No
model is loaded and nothing generates here: the run functions are replaced by ones that fail."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from exactedit.native.llamacpp.generate import SEED_LIMIT
from exactedit.runs.antislop.config import RATE_SEED, AntislopConfig, AntislopError
from exactedit.runs.persona.config import PersonaConfig, PersonaError

NAN = math.nan


def _refused(cls, error, **kw) -> str:
    with pytest.raises(error) as info:
        cls(**kw)
    return str(info.value)


# ---- antislop: the config, every setting at once -------------------------------------------------
def test_every_bad_antislop_setting_is_listed_in_one_error():
    msg = _refused(AntislopConfig, AntislopError, rules_bias=6.1, ridge=NAN, strength_grid=(2.0, -1.0), seed=-1)
    assert "4 settings refused, before any generation" in msg and msg.count("\n  - ") == 4
    for flag in ("--rules-bias", "--ridge", "--strength-grid", "--seed"):
        assert flag in msg


@pytest.mark.parametrize("kw, says", [
    ({"rules_bias": 6.1}, "6.1 is not a float32 number"),         # refused, not rounded: the report says what ships
    ({"rules_bias": 6.1}, "e.g. 6.125 or 6"),
    ({"rules_bias": math.inf}, "rules_bias (--rules-bias): expected a finite number"),
    ({"rules_bias": 0.0}, "> 0"),
    ({"ridge": NAN}, "ridge (--ridge): WfldConfig.ridge must be a finite number"),
    ({"ridge": -1.0}, "WfldConfig.ridge must be >= 0"),
    ({"strength_grid": (2.0, -1.0)}, "strength_grid (--strength-grid): WfldConfig.strength_grid"),
    ({"gated_strength_grid": (5.0,)}, "gated_strength_grid: WfldConfig.strength_grid"),   # no flag: not named as one
    ({"background": "all"}, "background: WfldConfig.background"),
    ({"key": "nope"}, "key (--key): expected one of"),
    ({"word_holds": -1}, "word_holds (--word-holds): expected an integer >= 0"),
    ({"top": 0}, "top (--top): expected an integer >= 1"),
    ({"samples": 0}, ">= 1"),
    ({"seed": -1}, "-1 is outside llama.cpp's seeds"),
    ({"seed": 2**32 + 7}, "wraps"),
    ({"seed": SEED_LIMIT - RATE_SEED - 1}, "the rate replies the seeds up to"),
])
def test_each_bad_antislop_setting_is_refused_by_name(kw, says):
    assert says in _refused(AntislopConfig, AntislopError, **kw)


def test_the_seeds_at_the_edge_of_the_range_and_exact_biases_are_taken():
    last = SEED_LIMIT - 1 - RATE_SEED - (2 - 1)                 # rate_samples 2: its last reply's seed is the limit's last
    assert AntislopConfig(seed=last).seed == last
    assert "rate replies" in _refused(AntislopConfig, AntislopError, seed=last + 1)
    assert "data replies" in _refused(AntislopConfig, AntislopError, seed=SEED_LIMIT - 2, samples=3, rate_samples=1)
    assert AntislopConfig(rules_bias=6.5).rules_bias == 6.5 and AntislopConfig(strength_grid=()).strength_grid == ()


def test_the_corpus_stage_builds_the_config_the_check_built(tmp_path):
    from exactedit.runs.antislop.checks import file_problems

    cfg = AntislopConfig(corpus_context=20, seed=3)
    c = cfg.corpus_config("tpl.jinja")
    assert (c.max_tokens, c.context, c.seed, c.chat_template) == (cfg.corpus_tokens, 20, 3, "tpl.jinja")
    (p,) = file_problems(AntislopConfig(model="/m.gguf", corpus_context=600, **_files(tmp_path)), ["you can use"])
    assert p.field == "corpus_context" and "max_window" in p.message
    assert file_problems(AntislopConfig(model="/m.gguf", corpus_context=600, corpus_tokens=0, **_files(tmp_path)),
                         ["you can use"]) == []                       # no corpus stage: nothing to build


# ---- persona: the config -------------------------------------------------------------------------
@pytest.mark.parametrize("kw, says", [
    ({"lr": NAN}, "lr (--lr): expected a finite number in (0, inf), got nan"),
    ({"lr": math.inf}, "lr (--lr)"),
    ({"w_kl": -1.0}, "w_kl: expected a finite number"),
    ({"max_steps": 3}, "stopping needs 1 <= every <= max_steps"),         # the solve stage's StoppingRule, built now
    ({"seed": -1}, "-1 is outside llama.cpp's seeds"),
    ({"seed": SEED_LIMIT - RATE_SEED}, "the rate replies the seeds up to"),
    ({"device": "tpu"}, "device (--device)"),
    ({"dev": NAN}, "dev: expected a finite number in (0, 0.5)"),
])
def test_each_bad_persona_setting_is_refused_by_name(kw, says):
    assert says in _refused(PersonaConfig, PersonaError, **kw)


def test_every_bad_persona_setting_is_listed_in_one_error():
    msg = _refused(PersonaConfig, PersonaError, lr=NAN, seed=-1, samples=0)
    assert "3 settings refused" in msg and msg.count("\n  - ") == 3
    assert PersonaConfig().head_config().lr == PersonaConfig().lr and PersonaConfig().stopping().metric == "style"


# ---- the commands: refused before any run starts ------------------------------------------------
@pytest.fixture
def no_run(monkeypatch):
    import exactedit.runs as runs

    def fail(*a, **k):
        raise AssertionError("the run started: a bad setting reached generation")
    monkeypatch.setattr(runs, "run_antislop", fail)
    monkeypatch.setattr(runs, "run_persona", fail)


@pytest.mark.parametrize("command", ["antislop", "demo"])
def test_antislop_and_demo_refuse_every_bad_flag_at_once(tmp_path, no_run, command):
    """`antislop` on a GGUF path with the user's files, `demo --model qwen` with the bundled ones:
    the same refusal, before the run (which would locate the model, hash it and generate)."""
    from exactedit import cli
    from exactedit.fixtures import DEFAULT_FIXTURE

    if command == "antislop":
        files = _files(tmp_path)
        args = ["antislop", "--model", str(DEFAULT_FIXTURE / "model.gguf"), "--phrases", files["phrases"],
                "--prompts", files["prompts"], "--rate-prompts", files["rate_prompts"]]
    else:
        args = ["demo", "--model", "qwen"]
    r = CliRunner().invoke(cli.main, args + ["--out", str(tmp_path / "o"), "--rules-bias", "6.1", "--ridge", "nan",
                                             "--strength-grid", "2,-1", "--seed", "-1"])
    assert r.exit_code == 1, r.output
    assert "4 settings refused, before any generation" in r.output and "AssertionError" not in r.output
    assert not (tmp_path / "o").exists()


def test_persona_refuses_lr_nan_before_the_run(tmp_path, no_run):
    from exactedit import cli
    from exactedit.fixtures import DEFAULT_FIXTURE

    r = CliRunner().invoke(cli.main, ["persona", "--model", str(DEFAULT_FIXTURE / "model.gguf"), "--out",
                                      str(tmp_path / "o"), "--lr", "nan", "--seed", "-1"])
    assert r.exit_code == 1 and "2 settings refused" in r.output and "--lr" in r.output, r.output


# ---- upper bounds: counts that were a memory or time bomb after the generation ----------------
def test_persona_edit_count_and_rank_out_of_range_are_refused_before_the_run(tmp_path, no_run):
    """The repro: `--edit-count 10**12 --rank 10**9` passed every check (rank <= edit_count) and the
    solve allocated its n x 10**9 B after the whole generation."""
    from exactedit import cli
    from exactedit.fixtures import DEFAULT_FIXTURE

    r = CliRunner().invoke(cli.main, ["persona", "--model", str(DEFAULT_FIXTURE / "model.gguf"), "--out",
                                      str(tmp_path / "o"), "--edit-count", str(10**12), "--rank", str(10**9),
                                      "--samples", str(10**9)])
    assert r.exit_code == 1 and "3 settings refused, before any generation" in r.output, r.output
    assert "edit_count (--edit-count): 1000000000000 is more than 1024" in r.output
    assert "rank (--rank): expected 1 <= rank <= edit_count (at most 1024), got 1000000000" in r.output
    assert "samples (--samples): 1000000000 is more than 256" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cls, error, kw, says", [
    (PersonaConfig, PersonaError, {"rate_samples": 257}, "rate_samples (--rate-samples): 257 is more than 256"),
    (PersonaConfig, PersonaError, {"n_boot": 10**12}, "n_boot: 1000000000000 is more than 10000"),
    (PersonaConfig, PersonaError, {"edit_count": 1025, "rank": 1}, "edit_count (--edit-count): 1025 is more"),
    (PersonaConfig, PersonaError, {"edit_count": 4, "rank": 5}, "expected 1 <= rank <= edit_count (4), got 5"),
    (AntislopConfig, AntislopError, {"samples": 10**9}, "samples (--samples): 1000000000 is more than 256"),
    (AntislopConfig, AntislopError, {"n_boot": 10**6}, "n_boot: 1000000 is more than 10000"),
])
def test_counts_past_their_bound_are_refused_by_name(cls, error, kw, says):
    assert says in _refused(cls, error, **kw)
    assert PersonaConfig(edit_count=1024, rank=1024, samples=256, n_boot=10_000).rank == 1024


def test_the_model_bounds_rank_null_k_and_edit_count_in_the_preflight(tmp_path):
    """What only the model bounds, checked with its head read and listed first in preflight's one
    error: the solve refused `null_k >= n` only after the generation, and rank past n was an n x rank
    allocation."""
    from exactedit.quant.gguf.write import synthetic_model
    from exactedit.runs.loop.preflight import PreflightError, preflight_head

    w = synthetic_model(tmp_path / "m.gguf", vocab=64, n=256, h=256, head_type="Q8_0")
    cfg = PersonaConfig(model=str(w.path), edit_count=1000, rank=300, null_k=256)
    with pytest.raises(PreflightError) as info:
        preflight_head(w.path, settings=cfg.model_problems)
    got = [(p.field, p.message) for p in info.value.problems][:3]
    assert got == [("rank (--rank)", "300 is more than 256, the model's width n = 256: the edit's B is n x rank"),
                   ("null_k", "256 is more than 255, the model's width n = 256 less one: the null space must leave "
                              "the edit a direction"),
                   ("edit_count (--edit-count)", "1000 is more than 64, the model's 64 tokens (the head's rows)")]
    assert PersonaConfig(rank=256, null_k=255, edit_count=256).model_problems(256, 64) == \
        [("edit_count (--edit-count)", "256 is more than 64, the model's 64 tokens (the head's rows)")]
    assert PersonaConfig(rank=4, edit_count=64).model_problems(256, 64) == []


def test_the_persona_run_hands_the_model_bounds_to_its_preflight(tmp_path):
    """run_persona: refused by the preflight (the model's sizes), before the ledger or any generation."""
    from exactedit.quant.gguf.write import synthetic_model
    from exactedit.runs.loop.preflight import PreflightError
    from exactedit.runs.persona.pipeline import run_persona

    w = synthetic_model(tmp_path / "m.gguf", vocab=64, n=256, h=256, head_type="Q8_0")
    cfg = PersonaConfig(model=str(w.path), system="You are terse.", style="kaomoji", rank=300, edit_count=300)
    with pytest.raises(PreflightError, match=r"rank \(--rank\): 300 is more than 256") as info:
        run_persona(cfg, tmp_path / "o")
    assert "edit_count (--edit-count): 300 is more than 64" in str(info.value)
    assert not (tmp_path / "o").exists()


# ---- preflight: the settings that need their files, in the model's error -------------------------
def _files(tmp_path, same_sense: str | None = None) -> dict:
    (tmp_path / "p.txt").write_text("you can use\nhere is an\n")
    (tmp_path / "q.txt").write_text("write a list\nexplain sorting\n")
    (tmp_path / "r.txt").write_text("write a poem\n")
    out = {"phrases": str(tmp_path / "p.txt"), "prompts": str(tmp_path / "q.txt"), "rate_prompts": str(tmp_path / "r.txt")}
    if same_sense is not None:
        (tmp_path / "ss.txt").write_text(same_sense)
        out["same_sense"] = str(tmp_path / "ss.txt")
    return out


def test_file_settings_are_problems_of_the_one_preflight_error(tmp_path):
    """A same-sense phrase the run does not ban (solve wfld refused it after generation) and a
    same-sense file that does not parse, beside the model's own problems (the hc4 fixture's tail),
    in one PreflightError, before any stage: no data/ directory."""
    from exactedit.fixtures import DEFAULT_FIXTURE
    from exactedit.runs.antislop.checks import file_problems
    from exactedit.runs.antislop.pipeline import run_antislop
    from exactedit.runs.loop.preflight import PreflightError

    model = str(DEFAULT_FIXTURE / "model.gguf")
    cfg = AntislopConfig(model=model, corpus_tokens=0, **_files(tmp_path, "rather than = instead of\n"))
    (p,) = file_problems(cfg, cfg.phrase_list())
    assert p.field == "same_sense" and "['rather than'] are not phrases of the run" in p.message
    with pytest.raises(PreflightError) as info:
        run_antislop(cfg, tmp_path / "out")
    fields = [x.field for x in info.value.problems]
    assert fields[0] == "same_sense" and "tail" in fields
    assert not (tmp_path / "out" / "data").exists()
    (tmp_path / "b").mkdir()
    bad = AntislopConfig(model=model, **_files(tmp_path / "b", "no equals sign here\n"))
    (p,) = file_problems(bad, bad.phrase_list())
    assert p.field == "solve wfld --key dense" and "PHRASE=WORD" in p.message


# ---- the banned words' uses, counted before generation -------------------------------------------
def test_count_uses_is_whole_words_after_a_space_less_the_phrases():
    from exactedit.runs.antislop.checks import count_uses

    text = "you can use it. we use this; You can use that. uses, used, reuse, use."
    assert count_uses(text, " use", ["you can use"]) == 2                     # " use" x4, two of them the phrase
    assert count_uses(text, " use", ["you can use"], capitalized=False) == 3
    assert count_uses("a snippet", " snippet", ["a code snippet"]) == 1


def test_a_word_no_text_and_no_corpus_part_uses_is_named_before_generation(tmp_path):
    from exactedit.runs.antislop.checks import word_uses
    from exactedit.runs.data.corpus import Source

    cfg = AntislopConfig(model="/m.gguf", **_files(tmp_path))
    phrases = ("you can use", "here is a snippet")
    sources = [Source(f"doc{i}", "We use it. They use them. I use this. To use it. Use: we use. " * 3)
               for i in range(8)]
    texts = ["we use the oven, and I use the car. " * 10]
    check = word_uses(cfg, phrases, corpus_sources=sources, texts=texts)
    by = {w.word: w for w in check.words}
    assert check.min_uses == 5 and check.limit == 0.3
    assert by[" use"].texts == 20 and by[" use"].dev >= 5 and by[" use"].collateral >= 5
    assert by[" snippet"].dev == by[" snippet"].collateral == by[" snippet"].texts == 0
    (warning,) = check.warnings
    assert warning.startswith("' snippet' ('here is a snippet')") and "held to 0.3" in warning
    assert "--texts with ordinary uses of 'snippet'" in warning and "data prompts whose replies use" in warning
    json.dumps(check.to_dict())
    none = word_uses(AntislopConfig(model="/m.gguf", corpus_tokens=0, **_files(tmp_path)), phrases,
                     corpus_sources=[], texts=texts)
    assert {w.word for w in none.words if not w.measured(5)} == {" use", " snippet"}   # no corpus: dev has none


def test_the_report_names_the_unmeasured_word_and_what_would_measure_it():
    from exactedit.runs.antislop.report import unmeasured_md, unmeasured_words

    wf = {"strength": {"unmeasured": {" snippet": 0}, "limited": {"here is a snippet": 0.3}, "min_uses": 5},
          "words": [{"word": "' snippet'", "id": 7, "phrases": ["here is a snippet"]},
                    {"word": "' use'", "id": 9, "phrases": ["you can use"]}],
          "bars": [{"name": "d_mean:7", "pass": False, "n": 2}, {"name": "d_low:7", "pass": False, "n": 2},
                   {"name": "d_mean:9", "pass": True, "n": 40}]}
    pre = {"uses": {"words": [{"word": " snippet", "phrases": ["here is a snippet"], "dev": 0, "collateral": 1,
                               "texts": 3, "corpus": {}}]}}
    got = unmeasured_words(wf, pre)
    assert list(got) == ["' snippet'"]
    row = got["' snippet'"]
    assert (row["dev_uses"], row["collateral_uses"], row["limited_to"]) == (0, 2, {"here is a snippet": 0.3})
    assert row["foreseen"] == {"dev": 0, "collateral": 1, "texts": 3} and "--texts" in row["measure_with"]
    text = "\n".join(unmeasured_md(got))
    assert "NOT MEASURED" in text and "' snippet': 0 uses dev, 2 uses collateral" in text and "at most 0.3" in text
    assert unmeasured_words({"bars": [{"name": "d_mean:9", "pass": True, "n": 40}]}) == {} and unmeasured_md({}) == []
