"""The real-model demo's pieces that need no engine: its protocol loads and resolves against a
token table, the bundled data files are there and sane, the config refuses what it cannot run."""
from __future__ import annotations

import pytest

from exactedit.evals.protocol.protocol import load_protocol, resolve_tokens
from exactedit.runs.antislop.config import AntislopConfig, AntislopError
from exactedit.runs.loop.inputs import BUNDLED, lines as _lines
from exactedit.runs.antislop.pipeline import write_run_protocol


def test_protocol_loads_with_fixed_roles_and_id_tokens(tmp_path):
    p = write_run_protocol(tmp_path / "protocol.toml", tmp_path / "data", "demo-x", specials=(3, 1), turn_end=2,
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
    cfg = AntislopConfig()
    prompts, rate = _lines(cfg.file("prompts")), _lines(cfg.file("rate_prompts"))
    assert len(prompts) >= 20 and len(rate) >= 10
    assert not set(prompts) & set(rate)            # the rate prompts built none of the data
    assert _lines(cfg.file("phrases")) and cfg.text_files()


def test_config_refuses_unknown_models_and_bad_sizes(tmp_path):
    with pytest.raises(AntislopError, match="--phrases: not given"):
        AntislopConfig(model="nosuch").file("phrases")
    with pytest.raises(AntislopError, match=">= 1"):
        AntislopConfig(samples=0)
    assert AntislopConfig(phrases=str(tmp_path / "p.txt")).file("phrases") == tmp_path / "p.txt"
    assert (BUNDLED / "qwen" / "antislop" / "phrases.txt").is_file()


def test_demo_targets_judge_each_issue_target():
    from exactedit.runs.antislop.report import demo_targets

    rates = [{"phrase": "you can use", "base": {"continuation": 0.5}, "edited": {"continuation": 0.1}},
             {"phrase": "Here's an", "base": {"continuation": 0.8}, "edited": {"continuation": 0.4}},
             {"phrase": "Here's an example", "base": {"continuation": 1.0}, "edited": {"continuation": 0.0}}]
    bars = [{"bar": "(a)", "name": "a", "pass": True}, {"bar": "(d)", "name": "d", "label": "' use'", "pass": False}]
    stops = {"base": ["turn_end", "max_new", "max_new"], "weights": ["max_new"] * 3}
    both = [{**p, "edited": {"continuation": 0.0}} for p in rates]
    got = {t["name"]: t for t in demo_targets({"weights": rates, "both": both}, ["you can use", "Here's an"], bars,
                                              True, {"weights": [object()]}, stops)}
    assert got["continuation cut 'you can use'"]["pass"] and abs(got["continuation cut 'you can use'"]["value"] - 0.8) < 1e-12
    assert not got["continuation cut \"Here's an\""]["pass"]                     # 0.5 < 0.7
    assert "continuation cut \"Here's an example\"" not in got                   # watched, not solved
    assert got["continuation cut \"Here's an\", weights + rules"]["pass"]         # the stacked arm, judged apart
    assert not got["bars (a)-(g)"]["pass"] and got["bars (a)-(g)"]["failed"] == ["(d) ' use'"]
    assert got["verify live (bitwise)"]["pass"]
    assert not got["variant artefacts, edited replies"]["pass"]
    assert got["turn-end rate (replies ending at the turn end)"]["pass"]        # 1 -> 0: within one reply
    none = demo_targets({"weights": [{"phrase": "x", "base": {"continuation": None}, "edited": {"continuation": 0.0}}]},
                        ["x"], [], False, {}, {"base": [], "weights": []})
    assert not none[0]["pass"] and none[0]["value"] is None


def test_same_sense_file_parses_and_names_its_bad_line(tmp_path):
    good = tmp_path / "ss.txt"
    good.write_text("# paraphrases\nyou can use = utilize, employ\n", encoding="utf-8")
    assert AntislopConfig(same_sense=str(good)).same_sense_words() == (("you can use", ("utilize", "employ")),)
    bad = tmp_path / "bad.txt"
    bad.write_text("you can use utilize\n", encoding="utf-8")
    with pytest.raises(AntislopError, match=r"bad\.txt.*PHRASE=WORD"):
        AntislopConfig(same_sense=str(bad)).same_sense_words()


def _former_protocol_text(data, name, specials, turn_end, tuples) -> str:
    """The demo's protocol as it was written before by string concatenation (the reference)."""
    lines = [f'name = "{name}"',
             'description = "exactedit antislop: the model\'s own replies, split by prompt by dataset build."', ""]
    for trace, role, domain in [("train", "train", ""), ("heldout", "dev", ""), ("collateral", "collateral", ""),
                                ("anchors", "anchors", "anchors")]:
        lines += ["[[traces]]", f'name = "{trace}"', f'path = "{(data / trace).resolve()}"', f'role = "{role}"']
        lines += ([f'domain = "{domain}"'] if domain else []) + [""]
    lines += ["[split]", 'by = ["source", "character"]', "seed = 0", "train = 0.6", "dev = 0.2", "test = 0.2",
              "same_doc_heldout = 0.33", "", "[tokens]",
              f"specials = {[int(s) for s in specials]}", f"turn_end = {int(turn_end)}",
              "phrases = [" + ", ".join(str([int(t) for t in tup]) for tup in tuples) + "]", ""]
    return "\n".join(lines)


def test_protocol_is_the_one_string_concatenation_wrote(tmp_path):
    """Written by the protocol module now: the same Protocol as the former text (only the bytes,
    hence the sha256, differ)."""
    from dataclasses import replace

    args = (tmp_path / "data", "demo-x", (3, 1), 2, [(10, 11, 12), (20, 21)])
    old = tmp_path / "old.toml"
    old.write_text(_former_protocol_text(*args), encoding="utf-8")
    new = load_protocol(write_run_protocol(tmp_path / "protocol.toml", *args))
    assert replace(new, path=old, sha256="") == replace(load_protocol(old), sha256="")


def test_dataset_tuples_are_one_mining_of_the_sets():
    """DatasetResult.tuples: the sets' tuples, sorted, as one mine over their dumps lists them."""
    from types import SimpleNamespace as NS

    from exactedit.runs.data.dataset import DatasetResult

    r = DatasetResult("out", {}, (), (), mining={"train": NS(tuples=((5, 6), (1, 2, 3))),
                                                 "heldout": NS(tuples=((1, 2, 3), (0, 9))),
                                                 "anchors": NS(tuples=((7, 7),))})
    assert r.tuples("train", "heldout") == ((0, 9), (1, 2, 3), (5, 6))
    assert r.tuples("collateral") == () and "mining" not in r.to_dict()


def test_bundled_gemma_data_template_and_defaults():
    """Gemma 3 270M's GGUF has no chat template: the demo brings one, and its own settings."""
    from exactedit.runs.data.dataset import DatasetConfig, split_prompts

    cfg = AntislopConfig.for_model("gemma")
    prompts, rate = _lines(cfg.file("prompts")), _lines(cfg.file("rate_prompts"))
    assert len(prompts) >= 24 and len(rate) >= 12 and not set(prompts) & set(rate)
    assert all(len(p.split()) >= 2 for p in _lines(cfg.file("phrases"))) and len(cfg.text_files()) >= 3
    groups = split_prompts(prompts, DatasetConfig())
    assert min(len(v) for v in groups.values()) >= 3           # every set has prompts of its own
    tpl = cfg.template()
    assert tpl.path == str(BUNDLED / "gemma" / "chat_template.jinja") and "<start_of_turn>" in tpl.source
    assert (cfg.max_new, cfg.corpus_tokens) == (96, 3000)       # defaults.toml, not the class's 160 / 12,000
    assert AntislopConfig.for_model("gemma", max_new=7, samples=None).max_new == 7   # given beats the file
    assert AntislopConfig.for_model("qwen").template() is None  # Qwen's GGUF has its own
    # its defaults.toml sets the edit kind only (the gated edit, chosen on dev: docs/real-model.md)
    assert AntislopConfig.for_model("qwen") == AntislopConfig(key="gated")


@pytest.mark.parametrize("text,match", [("max_new = 'x'\n", "max_new: expected int"),
                                        ("samples = true\n", "samples: expected int"),
                                        ("nosuch = 1\n", "nosuch: not a setting"),
                                        ("model = 'qwen'\n", "model: not a setting"),
                                        ("strength_grid = [1, 'a']\n", "strength_grid: expected a list"),
                                        ("max_new = \n", "cannot read as TOML")])
def test_a_bad_defaults_file_names_the_file_and_field(tmp_path, monkeypatch, text, match):
    from exactedit.runs.loop import inputs

    (tmp_path / "m" / "antislop").mkdir(parents=True)
    (tmp_path / "m" / "antislop" / "defaults.toml").write_text(text)
    monkeypatch.setattr(inputs, "BUNDLED", tmp_path)
    with pytest.raises(AntislopError, match=match) as e:
        AntislopConfig.for_model("m")
    assert str(tmp_path / "m" / "antislop" / "defaults.toml") in str(e.value)
    (tmp_path / "m" / "antislop" / "defaults.toml").write_text("ridge = 1\nstrength_grid = [1, 0.5]\n")
    cfg = AntislopConfig.for_model("m")
    assert type(cfg.ridge) is float and cfg.ridge == 1.0 and cfg.strength_grid == (1.0, 0.5)


def test_texts_given_as_a_directory_stand_for_its_txt_files(tmp_path):
    from exactedit.runs.antislop.config import AntislopConfig
    from exactedit.runs.loop.inputs import text_files

    (tmp_path / "texts").mkdir()
    for name in ("b.txt", "a.txt", "notes.md"):
        (tmp_path / "texts" / name).write_text("x")
    (tmp_path / "c.txt").write_text("y")
    got = text_files([str(tmp_path / "texts"), str(tmp_path / "c.txt")], None)
    assert got == (tmp_path / "texts" / "a.txt", tmp_path / "texts" / "b.txt", tmp_path / "c.txt")
    assert AntislopConfig(model="/m.gguf", texts=(str(tmp_path / "texts"),)).text_files() == got[:2]
    assert text_files(None, None) == ()


def test_the_edit_kind_is_chosen_on_dev():
    """choose_key reads the shipped edit's bar (e) on the anchors (solve side) and the dev frontier:
    (e) passing first, then (d) passing, then the larger mean dev cut at the chosen strength; a
    tie keeps dense; none passing: the larger cut, flagged."""
    from exactedit.runs.antislop.pipeline import choose_key

    def rep(passed, cut, s=1.0, e_ok=True):
        chosen = {"Here's an": s}
        return {"bars": [{"name": "e_kld:anchors", "value": 1e-4 if e_ok else 12.1, "pass": e_ok}],
                "strength": {"chosen": chosen, "passed_d": passed,
                             "frontier": [{"strength": {"Here's an": 0.2}, "cut_all": 0.01},
                                          {"strength": chosen, "cut_all": cut, "collateral": {}}]}}

    c = choose_key({"dense": rep(True, 0.05), "gated": rep(True, 0.8)})
    assert c["chosen"] == "gated" and c["passed_d"] and c["kinds"]["gated"]["dev_cut"] == 0.8
    assert choose_key({"dense": rep(True, 0.05), "gated": rep(False, 0.9)})["chosen"] == "dense"
    assert choose_key({"dense": rep(True, 0.3), "gated": rep(True, 0.3)})["chosen"] == "dense"
    none = choose_key({"dense": rep(False, 0.1), "gated": rep(False, 0.4)})
    assert none["chosen"] == "gated" and not none["passed_d"] and "flagged" in none["why"]
    # a frontier that promises everything, a shipped edit that broke the model: not chosen
    broken = choose_key({"dense": rep(True, 0.15), "gated": rep(True, 1.0, s=4.0, e_ok=False)})
    assert broken["chosen"] == "dense" and broken["kinds"]["gated"]["anchors_kl"] == 12.1
    worst = choose_key({"dense": rep(True, 0.15, e_ok=False), "gated": rep(True, 1.0, e_ok=False)})
    assert not worst["passed_d"] and "(e)" in worst["why"]
    assert AntislopConfig(key="auto").keys() == ("dense", "gated")
    with pytest.raises(AntislopError, match="key"):
        AntislopConfig(key="sideways")


def test_the_gated_headroom_reaches_the_solve_and_a_bad_one_is_refused_by_its_flag():
    c = AntislopConfig(key="gated", gated_headroom=16.0)
    assert c.wfld_config("gated").gated_headroom == 16.0
    assert AntislopConfig().wfld_config("gated").gated_headroom == 4.0
    for bad in (0.0, 65.0, float("nan")):
        with pytest.raises(AntislopError, match="--gated-headroom"):
            AntislopConfig(key="gated", gated_headroom=bad)


def test_the_gated_ridges_reach_the_solve_and_bad_ones_are_refused_by_name():
    """One ridge by default (chosen on the 21-phrase run's dev); a grid, from the model's
    defaults.toml or the class, reaches solve wfld, where one is chosen per phrase on dev."""
    assert AntislopConfig().wfld_config("gated").gated_ridges == (1e-3,)
    c = AntislopConfig(key="gated", gated_ridges=(1e-3, 1e-1, 1.0))
    assert c.wfld_config("gated").gated_ridges == (1e-3, 1e-1, 1.0)
    for bad in ((), (0.0,), (1e-3, float("inf")), (1e3,)):
        with pytest.raises(AntislopError, match="gated_ridges"):
            AntislopConfig(key="gated", gated_ridges=bad)
