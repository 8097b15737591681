"""`exactedit persona`: a persona's style distilled into rank-1 output-row edits, measured as a rate.

From the user's model, a persona (system prompt), the style it shows (evals/rates/style.py), data
prompts and held-out rate prompts, into DIR, in resumable stages (runs/loop/stages.py):
1. `replies`: the model answers every data prompt twice over, with the persona's system prompt
   (the chosen side) and without it (the plain side, the reference); the style's rate on each side
   with a bootstrap interval over prompts: the measurement that says the persona shows the style
   and the plain model does not -> DIR/replies.json;
2. `data`: the prompts split train / dev / test (seeded by prompt); each persona reply framed with
   the *plain* prompt (the edit must bring the style without the persona prompt) is captured as a
   dump per split; the plain replies of the train prompts and half the plain texts are the anchors
   (the solve's KL term), the plain replies of dev and test prompts and the other texts the cost's
   text; the edit set S is the train split's most frequent initiation tokens (the token that starts
   the style: the decision, not the glyphs) -> DIR/data/;
3. `solve`: a protocol (the splits as fixed traces, S explicit, the style tokens = S, the seeds'
   stopping rule and bars, the KL bars over the rows off the style's decision rows: `Style.decision`,
   with the every-row mean reported beside them; with `watch_kl` the rule also stops where the dev KL
   off those rows passes the bar), registered and split in DIR/ws; `solve head --rank r --hold H`
   -> DIR/head/ (test scored once, at the step the rule chose; no step qualifies: no edit ships);
4. `apply` -> DIR/edited.gguf; 5. `verify`: llama.cpp on base and edited against the
   engine-faithful prediction, on a test document -> DIR/verify.json (both skipped with no edit);
6. `rates`: free generation on the rate prompts *without* the persona prompt, base and edited, and
   the persona-prompted base as the target, same seeds: the style rate per side with intervals
   and the paired change; turn ends, empty turns, the tokens whose rate moved -> DIR/rates.json;
7. `cost`: KL and perplexity of edited vs base on the plain replies and texts the solve never fitted
   and on the test persona documents, also split into the decision rows, the rows off them and the
   paragraph starts among those; MATTR per side -> DIR/cost.json;
then DIR/report.md, DIR/report.json and DIR/style-rates.png. Nothing here prints.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Callable, Sequence

from exactedit.evals.rates.style import RULES_VERSION
from exactedit.runs.persona.config import RATE_SEED, PersonaConfig, PersonaError
from exactedit.runs.loop.stages import RunResult, StagedRun
from exactedit.files import atomic_write_text

Progress = Callable[[str, int, int], None]
STAGES = ("replies", "data", "solve", "apply", "verify", "rates", "cost")
STATE = "persona.json"
SPLITS = ("train", "dev", "test")

__all__ = ["PersonaResult", "run_persona", "split_prompts"]


class PersonaResult(RunResult):
    """A persona run's result (runs/loop/stages.py RunResult)."""

    @property
    def shipped(self) -> bool:
        return bool(self.records["solve"]["shipped_edit"])


def split_prompts(prompts: Sequence[str], dev: float, seed: int) -> dict[str, list[int]]:
    """Prompt indices per split: a seeded order of the prompts' hashes, dev and test `dev` of them
    each (at least one each), train the rest."""
    order = sorted(range(len(prompts)), key=lambda i: hashlib.sha256(f"{seed}\0{prompts[i]}".encode()).hexdigest())
    k = max(1, round(dev * len(prompts)))
    if len(prompts) < 2 * k + 2:
        raise PersonaError(f"{len(prompts)} data prompts: too few to split into train, dev and test "
                           f"(give at least {2 * k + 2})")
    return {"dev": sorted(order[:k]), "test": sorted(order[k:2 * k]), "train": sorted(order[2 * k:])}


class _Run(StagedRun):
    def __init__(self, cfg: PersonaConfig, out: Path, progress: Progress | None, command: str):
        from exactedit.runs.loop.preflight import preflight_head

        super().__init__(out, cfg.model, cfg.template(), cfg.text_files(), progress)
        self.cfg = cfg
        self.system = cfg.persona()
        self.style = cfg.style_spec()
        self.style_key = [str(self.style), RULES_VERSION]      # a stage that reads the style redoes when its rules change
        self.preflight = preflight_head(self.model, chat_template=self.tpl_path, settings=cfg.model_problems)
        self.prompts = cfg.lines("prompts")
        self.rate_prompts = cfg.lines("rate_prompts")
        overlap = set(self.prompts) & set(self.rate_prompts)
        if overlap:
            raise PersonaError(f"{cfg.file('rate_prompts')}: {len(overlap)} prompts are also data prompts (e.g. "
                               f"{sorted(overlap)[0][:60]!r}): the rates must come from prompts the solve never saw")
        if not self.rate_prompts:
            raise PersonaError(f"{cfg.file('rate_prompts')}: no prompts")
        self.splits = split_prompts(self.prompts, cfg.dev, cfg.seed)
        from exactedit.runs.persona.report import REPORTS

        self.start(len(STAGES), command, state_file=STATE, finals=REPORTS)

    def chat(self):
        from exactedit.native.llamacpp.chat import model_chat

        return model_chat(self.model, template=self.tpl_path)


def run_persona(cfg: PersonaConfig, out, *, progress: Progress | None = None, command: str = "") -> PersonaResult:
    """Run (or continue) a persona run in `out`; see the module doc."""
    from exactedit.runs.persona.report import write_reports

    out = Path(out)
    r = _Run(cfg, out, progress, command or f"exactedit persona --model {cfg.model} --out {out}")
    with r:                     # the run holds DIR until it returns or raises
        rec = {"preflight": r.preflight.to_dict(), "replies": _replies(r)}
        rec["data"] = _data(r, rec)
        rec["solve"] = _solve_gated(r, rec) if cfg.edit == "gated" else _solve(r, rec)
        shipped = bool(rec["solve"]["shipped_edit"])
        bundle = rec["solve"]["bundle"]
        rec["apply"] = r.apply_stage(bundle) if shipped else r.stages.skip("apply")
        rec["verify"] = (r.verify_stage(bundle, rec["apply"], rec["data"]["sets"]["test"]["dump"], cfg.verify_tokens)
                         if shipped else r.stages.skip("verify"))
        rec["rates"] = _rates(r, rec)
        rec["cost"] = _cost(r, rec) if shipped else r.stages.skip("cost")
        seconds = r.stages.seconds()
        files, report, text = write_reports(out, str(r.model), rec, {k: seconds[k] for k in STAGES if k in seconds},
                                            ran=r.stages.ran, resumed=r.stages.resumed, system=r.system,
                                            style=str(r.style), config=dataclasses.asdict(cfg))
        return PersonaResult(out, str(r.model), rec, report, text, files, tuple(r.stages.ran), tuple(r.stages.resumed))


def _generate(r: _Run, model, prompts: Sequence[str], system: str | None, seeds: Sequence[int], label: str):
    """Per prompt, one sample per seed (generation's door, batched, to the model's own turn end;
    runs/data/mine.py's jobs and stop tokens)."""
    from exactedit.native.llamacpp.chat import prompt_tokens
    from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.llamacpp.sample import sample_replies
    from exactedit.runs.data.mine import MineConfig, by_prompt, reply_jobs, reply_stops

    chat = r.chat()
    with LlamaEngine(model, EngineSettings()) as engine:
        bos = engine.bos_if_added()
        ptoks = [prompt_tokens(engine, chat.prompt(p, system), bos) for p in prompts]
    mc = MineConfig(sampling=Sampling(max_new=r.cfg.max_new, seed=int(seeds[0])), samples=len(seeds), n_boot=0,
                    chat_template=r.tpl_path)
    with LlamaEngine(model, EngineSettings()) as engine:
        gens = sample_replies(engine, reply_jobs(ptoks, mc), stop_ids=reply_stops(chat, engine),
                              turn_end=chat.specials.turn_end, progress=r.tick(label))
    return chat, by_prompt(gens, mc.samples)


def reply_records(side: str, chat, prompts: Sequence[str], samples, style, split_of=None) -> list[dict]:
    """One JSON record per reply: side, prompt index, seed, why it stopped, its text and tokens, and
    where the style begins (None: not shown)."""
    eog = set(chat.specials.end_of_generation)
    out = []
    for i, row in enumerate(samples):
        for s in row:
            body = [int(t) for t in s.tokens if int(t) not in eog]
            text = chat.table.decode(body)
            out.append({"side": side, "prompt": i, "seed": int(s.seed), "stop": s.stop, "text": text,
                        "tokens": [int(t) for t in s.tokens], "style_at": style.at(text),
                        "empty": bool(s.tokens.size) and int(s.tokens[0]) in eog,
                        **({"split": split_of[i]} if split_of else {})})
    return out


def side_rates(records: Sequence[dict], n_boot: int, seed: int = 0) -> dict:
    """The style rate of one side's replies (bootstrap over prompts), its turn-end and empty-turn
    shares and mean length."""
    from exactedit.evals.rates.style import style_rate

    shows = [x["style_at"] is not None for x in records]
    prompts = [x["prompt"] for x in records]
    n = max(len(records), 1)
    return {"style": style_rate(shows, prompts, n_boot=n_boot, seed=seed).to_dict(),
            "turn_end": sum(x["stop"] == "turn_end" for x in records) / n,
            "empty": sum(bool(x["empty"]) for x in records) / n,
            "mean_tokens": sum(len(x["tokens"]) for x in records) / n}


def _replies(r: _Run) -> dict:
    from exactedit.evals.rates.style import rate_change

    c = r.cfg
    seeds = [c.seed + s for s in range(c.samples)]
    split_of = {i: name for name, idx in r.splits.items() for i in idx}

    def gen():
        records = []
        for side, system in (("persona", r.system), ("plain", None)):
            chat, samples = _generate(r, r.model, r.prompts, system, seeds, f"replies ({side})")
            records += reply_records(side, chat, r.prompts, samples, r.style, split_of)
        atomic_write_text(r.out / "replies.json", json.dumps(records, indent=1, ensure_ascii=False) + "\n")
        per = {side: [x for x in records if x["side"] == side] for side in ("persona", "plain")}
        shows = {side: [x["style_at"] is not None for x in v] for side, v in per.items()}
        return {"sides": {side: side_rates(v, c.n_boot) for side, v in per.items()},
                "gap": rate_change(shows["plain"], shows["persona"], [x["prompt"] for x in per["plain"]],
                                   n_boot=c.n_boot),
                "splits": {k: len(v) for k, v in r.splits.items()}}

    return r.run("replies", {"prompts": list(r.prompts), "system": r.system, "style": r.style_key,
                             "seeds": seeds, "max_new": c.max_new, "n_boot": c.n_boot, "dev": c.dev},
                 ["replies.json"], gen)


def _data(r: _Run, rec: dict) -> dict:
    from collections import Counter

    from exactedit.evals.rates.style import initiation
    from exactedit.native.llamacpp.capture import capture_dump
    from exactedit.native.llamacpp.chat import prompt_tokens, short_hash
    from exactedit.native.llamacpp.documents import labelled
    from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine
    from exactedit.runs.data.dataset import chunk_texts

    c = r.cfg

    def build():
        import numpy as np

        chat = r.chat()
        records = json.loads((r.out / "replies.json").read_text(encoding="utf-8"))
        with LlamaEngine(r.model, EngineSettings()) as engine:
            bos = engine.bos_if_added()
            plain = [prompt_tokens(engine, chat.prompt(p), bos) for p in r.prompts]
            chunks = chunk_texts(list(r.texts), engine, chat, 256)
        eog = set(chat.specials.end_of_generation)
        decode = chat.table.decode
        starts = {s: Counter() for s in SPLITS}
        docs = {s: [] for s in (*SPLITS, "anchors", "plain")}
        for x in records:
            i, split = x["prompt"], x["split"]
            toks = np.concatenate([plain[i], np.asarray(x["tokens"], np.int32)])
            name = f"{x['side']}-{short_hash(r.prompts[i])}-{x['seed']}"
            if x["side"] == "persona":
                hit = initiation(r.style, [t for t in x["tokens"] if t not in eog], decode)
                if hit is not None:
                    starts[split][hit[1]] += 1
                docs[split].append(labelled(chat, name, toks, source="persona", character=f"p-{short_hash(r.prompts[i])}",
                                            tags=("persona",) + (("style",) if hit else ()), kind="chat"))
            else:
                where = "anchors" if split == "train" else "plain"
                docs[where].append(labelled(chat, name, toks, source="plain", character=f"p-{short_hash(r.prompts[i])}",
                                            tags=("anchor",) if where == "anchors" else (), kind="chat"))
        for k, d in enumerate(chunks):
            where = "anchors" if k % 2 == 0 else "plain"
            docs[where].append(d if where == "plain" else
                               type(d)(d.name, d.tokens, d.source, d.character, (*d.tags, "anchor"), d.roles))
        if not starts["train"]:
            raise PersonaError(f"{r.out / 'replies.json'}: no train persona reply shows the style {str(r.style)!r}: "
                               "nothing to teach (pick a style the persona shows: the replies stage's rates)")
        edit = [t for t, _ in sorted(starts["train"].items(), key=lambda kv: (-kv[1], kv[0]))[:c.edit_count]]
        sets = {}
        for name, ds in docs.items():
            if not ds:
                continue
            cap = capture_dump(r.model, ds, r.out / "data" / name, progress=r.tick(f"capture {name}"),
                               extra_meta={"persona": {"set": name, "style": str(r.style)}, "chat": chat.to_dict()},
                               keep_logits=False)
            sets[name] = {"dump": str(cap.path), "docs": len(ds), "rows": int(cap.rows)}
        return {"sets": sets, "edit_set": edit, "edit_tokens": [chat.table.decode([t]) for t in edit],
                "initiations": {s: {chat.table.decode([t]): n for t, n in starts[s].most_common(8)} for s in SPLITS},
                "style_replies": {s: sum(starts[s].values()) for s in SPLITS}}

    return r.run("data", {"replies": r.stages.outputs("replies"), "texts": r.sha["texts"], "edit_count": c.edit_count,
                          "style": r.style_key},
                 ["data"], build)


def _solve_gated(r: _Run, rec: dict) -> dict:
    """`--edit gated`: one unit of the last FFN rewritten to fire at the style's decision rows
    (solvers/l47/gated/style.py), its strength chosen on dev within the protocol's bar off those
    rows, written as a bundle of three tensor edits (the unit's gate and up rows, ffn_down) ->
    DIR/gated/. No strength within the bar: no edit ships (as the head solve's rule)."""
    import numpy as np

    from exactedit.dumps import read_dump
    from exactedit.dumps.format import ROLE_NAMES
    from exactedit.evals.protocol.protocol import Bars
    from exactedit.files import file_sha256
    from exactedit.quant import gguf
    from exactedit.quant.model.specials import model_specials
    from exactedit.runs.solve.wfld import _ffn_name, gated_engine
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle
    from exactedit.solvers.l47.gated.config import DesignConfig
    from exactedit.runs.persona.reach import style_reach
    from exactedit.solvers.l47.gated.style import StyleInputs, solve_style_unit
    from exactedit.solvers.tail.model import load_tail

    c, out = r.cfg, r.out
    sets = rec["data"]["sets"]
    missing = [s for s in ("train", "dev", "test") if s not in sets]
    if missing:
        raise PersonaError(f"{out / 'data'}: no {', '.join(missing)} documents (give more prompts)")
    bars = Bars(persona_decision=r.style.decision)
    edit = tuple(int(t) for t in rec["data"]["edit_set"])
    # the specials the column keeps at the decision rows: all of them at a reply's start; at its
    # end (a sign-off, a kaomoji) the turn end is what the style takes the place of (the row where
    # an unedited reply stops), so it is lowered with the other tokens there
    yields_end = r.style.decision == "reply_end"

    def solve():
        tick = r.tick("solve gated") or (lambda done, total: None)
        with gguf.open(r.model) as g:
            ms = model_specials(g, r.template)
            tail = load_tail(g)
            x_of, quantize_row, activation, act = gated_engine(g, tail)
            down = g.tensor(tail.spec.names["ffn_down"])
            dumps = {s: read_dump(sets[s]["dump"]) for s in ("train", "dev", "anchors") if s in sets}
            named = {role: [(role, dumps[role])] for role in dumps}
            kept = tuple(t for t in ms.guards if not (yields_end and t in set(ms.end_of_generation)))
            inputs = StyleInputs(tail, named, ROLE_NAMES[r.style.decision], edit, kept,
                                 np.asarray(g.read_raw(down.name)), down.type_name, int(down.cols), x_of,
                                 quantize_row, activation, grid=tuple(c.gated_grid),
                                 headrooms=tuple(c.gated_headrooms), gate_lams=tuple(c.gated_ridges),
                                 max_kl_off=bars.persona_max_kl_off, design=DesignConfig(act=act))
            steps = 2 + len(set(c.gated_headrooms)) * (1 + len(set(c.gated_grid)))
            done = [0]

            def said(stage):
                done[0] += 1
                tick(min(done[0], steps), steps)
            reach = None            # the dev dump is there: its absence stopped the stage above
            if yields_end and ms.turn_end is not None:
                reach = style_reach(tail, dumps["dev"], int(ms.turn_end), edit, ROLE_NAMES[r.style.decision],
                                    bars.persona_max_kl_off)
            res = solve_style_unit(inputs, progress=said)
            edits = [TensorEdit(down.name, "tensor", down.type_name, (int(down.rows), int(down.cols)), res.down_raw)]
            for part, raw in (("ffn_gate", res.gate_raw), ("ffn_up", res.up_raw)):
                ti = g.tensor(_ffn_name(tail, part))
                edits.append(TensorEdit(ti.name, "rows", ti.type_name, (int(ti.rows), int(ti.cols)), raw,
                                        np.array([res.unit], np.int64)))
            refs = [InputRef("model", str(r.model), g.sha256())]
        refs += [InputRef(f"dump:{s}", str(sets[s]["dump"]), d.sha256()) for s, d in dumps.items()]
        summary = {**res.summary, "strength": res.strength, "headroom": res.headroom, "specials_kept": list(kept),
                   "reach": reach}
        if res.passed:
            write_bundle(out / "gated", solver="persona-gated", inputs=refs,
                         config={"grid": list(c.gated_grid), "headrooms": list(c.gated_headrooms),
                                 "ridges": list(c.gated_ridges),
                                 "max_kl_off": bars.persona_max_kl_off,
                                 "decision": bars.persona_decision, "edit_set": list(edit)}, edits=edits,
                         files={"report.json": json.dumps(summary, indent=1, allow_nan=False).encode("utf-8")},
                         overwrite=True)
        return {"edit": "gated", "shipped_edit": bool(res.passed), "bundle": str(out / "gated"), "bars": [],
                "edit_tokens": list(edit), "decision": bars.persona_decision, "gated": summary,
                "bundle_sha256": file_sha256(out / "gated" / "manifest.json") if res.passed else None}

    return r.run("solve", {"data": r.stages.outputs("data"), "edit": "gated", "grid": list(c.gated_grid),
                           "headrooms": list(c.gated_headrooms), "ridges": list(c.gated_ridges),
                           "turn_end_yields": yields_end,
                           "bars": dataclasses.asdict(bars)}, ["gated"], solve)


def _solve(r: _Run, rec: dict) -> dict:
    from exactedit.dumps import read_dump
    from exactedit.dumps.format import ROLE_NAMES
    from exactedit.evals.protocol.protocol import Bars, EditSetRule, TokenSets, Trace, write_protocol
    from exactedit.runs.eval import workflow
    from exactedit.runs.persona.reach import style_reach
    from exactedit.solvers.tail.model import load_tail
    from exactedit.runs.solve.head_report import result_json
    from exactedit.runs.solve.head import solve_head, write_head_bundle
    from exactedit.quant import gguf
    from exactedit.quant.model.specials import model_specials

    c, out = r.cfg, r.out
    sets = rec["data"]["sets"]
    missing = [s for s in SPLITS if s not in sets]
    if missing:
        raise PersonaError(f"{out / 'data'}: no {', '.join(missing)} documents (give more prompts)")
    hcfg = c.head_config()
    stopping, bars = c.stopping(), Bars(persona_decision=r.style.decision)    # registered before the solve

    def solve():
        edit = tuple(int(t) for t in rec["data"]["edit_set"])
        with gguf.open(r.model) as g:
            ms = model_specials(g, r.template)
            reach = None
            if r.style.decision == "reply_end" and ms.turn_end is not None:
                reach = style_reach(load_tail(g), read_dump(sets["dev"]["dump"]), int(ms.turn_end), edit,
                                    ROLE_NAMES[r.style.decision], bars.persona_max_kl_off)
        traces = [Trace(s, Path(sets[s]["dump"]).resolve(), s) for s in SPLITS]
        if "anchors" in sets:
            traces.append(Trace("anchors", Path(sets["anchors"]["dump"]).resolve(), "anchors", "anchors"))
        protocol = out / "protocol.toml"
        write_protocol(protocol, f"persona-{Path(str(r.model)).stem}", traces,
                       description=f"exactedit persona: style {r.style} taught to the head without the persona prompt",
                       stopping=stopping, bars=bars,
                       edit_set=EditSetRule("explicit", len(edit), edit),
                       tokens=TokenSets(specials=tuple(ms.guards), turn_end=int(ms.turn_end), style=edit))
        ws = out / "ws"
        cmd = r.stages.state["command"]
        workflow.register(protocol, ws, cmd)
        workflow.split(protocol, ws, cmd)
        res = solve_head(hcfg, model=r.model, train=[sets["train"]["dump"]], dev=[sets["dev"]["dump"]],
                         test=[sets["test"]["dump"]], protocol=protocol, workspace=ws, command=cmd, device=c.device,
                         progress=r.tick("solve head"))
        write_head_bundle(res, out / "head")
        full = result_json(res)
        finite = [t for t in full["trajectory"] if t["ratio"] is not None and t["ratio"] == t["ratio"]]
        best = max(finite, key=lambda t: t["ratio"], default=None)
        return {"shipped_edit": res.shipped_edit, "chosen_step": res.chosen_step, "edit_tokens": list(res.edit_tokens),
                "bundle": str(out / "head"), "bars": full["bars"], "splits": full["splits"], "anchors": full["anchors"],
                "test": full["test"], "rows_changed": res.rows_changed, "edit_norm_ratio": res.edit_norm_ratio,
                "best_ratio": None if best is None else {"step": best["step"], "ratio": best["ratio"]},
                "trajectory": [{"step": t["step"], "ratio": t["ratio"], "train": t["train"].get("style"),
                                "dev": t["dev"].get("style"), "dev_kl": t["dev_kl"], "dev_kl_off": t["dev_kl_off"]}
                               for t in full["trajectory"]],
                "seconds": full["seconds"], "stopping": full["stopping"], "hold": hcfg.hold,
                "hold_rows": full["term_rows"].get("hold", 0), "decision": bars.persona_decision, "reach": reach}

    return r.run("solve", {"data": r.stages.outputs("data"), "head": hcfg.to_json(),
                           "stopping": dataclasses.asdict(stopping), "bars": dataclasses.asdict(bars)},
                 ["protocol.toml", "ws", "head"], solve)


def _rates(r: _Run, rec: dict) -> dict:
    from exactedit.evals.rates.phrase_rates import Reply, token_shifts
    from exactedit.evals.rates.style import rate_change

    c = r.cfg
    seeds = [c.seed + RATE_SEED + s for s in range(c.rate_samples)]
    edited = rec["apply"]["edited"] if rec["apply"] else None

    def rates():
        import numpy as np

        sides = [("base", r.model, None)] + ([("edited", edited, None)] if edited else []) \
            + [("persona prompt", r.model, r.system)]
        records, chat = [], None
        for side, model, system in sides:
            chat, samples = _generate(r, model, r.rate_prompts, system, seeds, f"rates ({side})")
            records += reply_records(side, chat, r.rate_prompts, samples, r.style)
        atomic_write_text(r.out / "rate-replies.json", json.dumps(records, indent=1, ensure_ascii=False) + "\n")
        per = {s: [x for x in records if x["side"] == s] for s, _, _ in sides}
        obj = {"prompts": len(r.rate_prompts), "seeds": seeds, "sides": {s: side_rates(v, c.n_boot) for s, v in per.items()},
               "out_of_place": {s: {"replies": sum(r.style.paragraph_hits(x["text"]) > 0 for x in v),
                                    "paragraphs": sum(r.style.paragraph_hits(x["text"]) for x in v)}
                                for s, v in per.items()}}
        if edited:
            shows = {s: [x["style_at"] is not None for x in per[s]] for s in ("base", "edited")}
            obj["change"] = rate_change(shows["base"], shows["edited"], [x["prompt"] for x in per["base"]],
                                        n_boot=c.n_boot)
            as_reply = lambda x: Reply(x["prompt"], x["seed"], np.zeros(0, np.int32), np.asarray(x["tokens"]))  # noqa: E731
            obj["token_shifts"] = [s.to_dict() for s in token_shifts(
                [as_reply(x) for x in per["base"]], [as_reply(x) for x in per["edited"]],
                lambda t: chat.table.decode([t]))]
        atomic_write_text(r.out / "rates.json", json.dumps(obj, indent=1, default=str) + "\n")
        return obj

    return r.run("rates", {"edited": rec["apply"]["sha256"] if edited else None, "prompts": list(r.rate_prompts),
                           "system": r.system, "style": r.style_key, "seeds": seeds, "max_new": c.max_new,
                           "n_boot": c.n_boot}, ["rates.json", "rate-replies.json"], rates)


def _cost(r: _Run, rec: dict) -> dict:
    import numpy as np

    from exactedit.dumps import read_dump
    from exactedit.runs.loop.cost import edit_cost
    from exactedit.solvers.tail.decision import decision_rows, paragraph_starts, role_bits

    sets = rec["data"]["sets"]
    held = {"test persona replies (chat, scored once)": Path(sets["test"]["dump"])}
    if "plain" in sets:
        held["plain replies to dev/test prompts and plain text (never solved on)"] = Path(sets["plain"]["dump"])
    if "anchors" in sets:
        held["anchors: plain replies to train prompts and plain text (the solve's KL term)"] = \
            Path(sets["anchors"]["dump"])

    style, bits = tuple(int(t) for t in rec["data"]["edit_set"]), role_bits(r.style.decision)

    def cost():
        piece = r.chat().table.decode

        def parts(dump) -> dict:
            """The decision rows, the rows off them, and of those the paragraph starts."""
            d = read_dump(dump)
            roles, nxt, toks = np.asarray(d.roles), np.asarray(d.next), np.asarray(d.tokens)
            dec = decision_rows(roles, nxt, style, bits)
            para = paragraph_starts(toks, d.doc_index(), nxt, lambda t: piece([t]))
            return {f"decision rows ({r.style.decision}, style tokens)": dec, "off the decision rows": ~dec,
                    "paragraph starts off the decision rows": para & ~dec}

        return edit_cost(r.model, rec["apply"]["edited"], held, r.out / "rate-replies.json", r.out / "cost.json",
                         progress=r.tick("cost"), split=parts)

    return r.run("cost", {"edited": rec["apply"]["sha256"], "data": r.stages.outputs("data"),
                          "rates": r.stages.outputs("rates"), "parts": list(held),
                          "split": ["decision", r.style.decision, list(style), "paragraph", "perplexity"]}, ["cost.json"], cost)
