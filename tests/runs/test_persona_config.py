"""`exactedit persona`'s inputs without an engine: the bundled persona, the settings' checks, the
split of the prompts by prompt."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from exactedit.runs.loop.inputs import BUNDLED
from exactedit.runs.persona.config import PersonaConfig, PersonaError, persona_defaults
from exactedit.runs.persona.pipeline import split_prompts


def test_the_bundled_qwen_persona_reads_and_its_files_exist():
    d = persona_defaults("qwen")
    assert d["style"] == "starter:Greetings" and '"Greetings!"' in d["system"]
    cfg = PersonaConfig.for_model("qwen")
    assert cfg.style_spec().shows("Greetings! A list holds items.")
    assert cfg.file("prompts") == BUNDLED / "qwen" / "persona" / "prompts.txt"
    prompts, rates = cfg.lines("prompts"), cfg.lines("rate_prompts")
    assert len(prompts) >= 40 and len(rates) >= 12 and not set(prompts) & set(rates)
    assert persona_defaults("gemma") == {} and persona_defaults("./x/qwen") == {}


def test_a_model_without_a_bundled_persona_names_what_is_missing():
    cfg = PersonaConfig(model="/models/mine.gguf")
    with pytest.raises(PersonaError, match="--system"):
        cfg.persona()
    with pytest.raises(PersonaError, match="--style"):
        cfg.style_spec()
    with pytest.raises(PersonaError, match="--prompts: not given"):
        cfg.file("prompts")
    with pytest.raises(PersonaError, match="--style: style 'bold'"):
        PersonaConfig(style="bold").style_spec()


@pytest.mark.parametrize("bad, what", [({"rank": 2}, "rank"), ({"dev": 0.5}, "dev"), ({"samples": 0}, "samples"),
                                       ({"system": " "}, "system"), ({"system": "x" * 4001}, "system"),
                                       ({"gated_grid": (0.0,)}, "gated_grid"), ({"gated_headrooms": ()}, "gated_headrooms"),
                                       ({"gated_headrooms": (4.0, 100.0)}, "gated_headrooms"),
                                       ({"gated_ridges": ()}, "gated_ridges"), ({"gated_ridges": (0.0,)}, "gated_ridges")])
def test_bad_settings_are_refused_by_name(bad, what):
    with pytest.raises(PersonaError, match=what):
        PersonaConfig(**bad)


def test_a_bad_persona_file_names_its_field(tmp_path, monkeypatch):
    import exactedit.runs.loop.inputs as inputs

    (tmp_path / "m" / "persona").mkdir(parents=True)
    monkeypatch.setattr(inputs, "BUNDLED", tmp_path)
    (tmp_path / "m" / "persona" / "persona.toml").write_text('style = 3\n')
    with pytest.raises(PersonaError, match="persona.toml: style: expected str"):
        persona_defaults("m")
    (tmp_path / "m" / "persona" / "persona.toml").write_text('colour = "red"\n')
    with pytest.raises(PersonaError, match="colour: not a setting here"):
        persona_defaults("m")
    (tmp_path / "m" / "persona" / "persona.toml").write_text('max_steps = 40\nlr = 1\n')
    assert persona_defaults("m") == {"max_steps": 40, "lr": 1.0}


@given(st.lists(st.text(min_size=1, max_size=8), min_size=6, max_size=40, unique=True),
       st.sampled_from([0.1, 0.2, 0.3]), st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_the_split_is_by_prompt_disjoint_whole_and_seeded(prompts, dev, seed):
    k = max(1, round(dev * len(prompts)))
    if len(prompts) < 2 * k + 2:
        with pytest.raises(PersonaError, match="too few"):
            split_prompts(prompts, dev, seed)
        return
    s = split_prompts(prompts, dev, seed)
    assert sorted(s["train"] + s["dev"] + s["test"]) == list(range(len(prompts)))
    assert len(s["dev"]) == len(s["test"]) == k and len(s["train"]) >= 2
    assert split_prompts(prompts, dev, seed) == s
    # a prompt's split depends on the prompt, not on its line: reversed input, same prompts per split
    rev = split_prompts(prompts[::-1], dev, seed)
    n = len(prompts)
    assert {prompts[n - 1 - i] for i in rev["test"]} == {prompts[i] for i in s["test"]}
