"""`exactedit antislop`: the whole anti-slop loop on a GGUF, on llama.cpp, in resumable stages.

From the user's model (a path, or a public name), prompts, phrase list (a file, or discover's
JSON) and held-out rate prompts, into DIR:
0. preflight (runs/loop/preflight.py): what the run cannot do is refused before any generation
   (every setting, AntislopConfig.problems and runs/antislop/checks.py; the tail's architecture, the
   edited tensor's type, the chat template, a phrase whose final word is several tokens), in one
   error; and each banned word's ordinary uses in the texts and the corpus counted, the words bar
   (d) will not measure named (runs/antislop/checks.py `word_uses`: the run goes on, and ships);
1. `data`: the model's own replies (`dataset build`): train / held-out / collateral / anchor dumps,
   split by prompt -> DIR/data/;
2. `corpus`: teacher-forced windows of plain text around the banned words' uses (`dataset
   corpus`) -> DIR/corpus/ (skipped with corpus_tokens 0);
3. `solve`: a protocol for those dumps (held-out as dev; the bars; the model's own specials and turn
   end; the phrase tuples the data build found), registered and split in DIR/ws; `solve wfld` ->
   DIR/wfld/ (bars (a)-(g), strength per phrase chosen on dev); `eval score` on dev -> DIR/dev/;
4. `apply` -> DIR/edited.gguf, every other byte of the base kept;
5. `verify`: llama.cpp on base and edited files against the engine-faithful prediction on a
   held-out reply (bitwise where it passes) -> DIR/verify.json;
6. `rules`: the sampler rules for the same phrases compiled for the model (`shape compile
   --phrases`, a prefix penalty) -> DIR/rules.json, shipped beside edited.gguf;
7. `rates`: four arms (base, rules, weights, both) answer the held-out rate prompts with the same
   seeds and sampler chain (`shape rates`); phrase rates per arm against base with bootstrap
   intervals over prompts -> DIR/rates.json, DIR/replies.json;
8. `cost`: what the edit costs on ordinary text: KL and perplexity of edited vs base on the
   held-out replies and on the replies and plain text the solve never saw (exact tail, offline, from
   the dumps), lexical diversity (MATTR) of each arm's replies, the tokens whose rate moved ->
   DIR/cost.json;
then DIR/report.md, DIR/report.json and PNGs, with `new_slop` (discover on the weights arm's replies
against base's). Each stage is keyed by the sha256 of its inputs (runs/loop/stages.py):
rerunning with the same DIR continues where a run stopped and redoes a stage whose inputs changed
(removing the report files first: a run that fails after that leaves none describing the old state).
`exactedit demo --model NAME` is this run with the model's bundled inputs (runs/bundled/NAME/antislop/).
Each step is the library call behind its CLI command; nothing here prints.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from exactedit.runs.antislop.config import RATE_SEED, AntislopConfig, AntislopError
from exactedit.runs.loop.inputs import lines as _lines
from exactedit.runs.loop.stages import RunResult, StagedRun
from exactedit.files import atomic_write_text

Progress = Callable[[str, int, int], None]
STAGES = ("data", "corpus", "solve", "apply", "verify", "rules", "rates", "cost")
STATE = "antislop.json"      # the run's state file in DIR (runs/loop/stages.py)

__all__ = ["AntislopResult", "phrases_text", "run_antislop", "write_run_protocol"]


class AntislopResult(RunResult):
    """An antislop run's result (runs/loop/stages.py RunResult)."""

    @property
    def verified(self) -> bool:
        return bool(self.records["verify"]["passed"])


def write_run_protocol(path: Path, data: Path, name: str, specials: Sequence[int], turn_end: int,
                   tuples: Sequence[Sequence[int]], corpus: dict | None = None) -> Path:
    """The run's protocol (written by evals.protocol.protocol.write_protocol): the dataset's four
    dumps with fixed roles (held-out is dev), the corpus's dev and collateral parts (`corpus`: part
    -> dump path) as dev and collateral traces, the model's specials and turn end, the matched
    phrase tuples as ids (what `solve wfld` and `eval score` both read), the default split and bars.
    The corpus's solve part is no trace: the solve holds it, nothing scores it."""
    from exactedit.evals.protocol.protocol import SplitRule, TokenSets, Trace, write_protocol as write

    traces = [Trace(trace, (data / trace).resolve(), role, domain) for trace, role, domain in
              (("train", "train", ""), ("heldout", "dev", ""), ("collateral", "collateral", ""),
               ("anchors", "anchors", "anchors"))]
    traces += [Trace(f"corpus-{part}", Path(dump).resolve(), {"dev": "dev", "collateral": "collateral"}[part], "")
               for part, dump in (corpus or {}).items()]
    tokens = TokenSets(specials=tuple(int(s) for s in specials), turn_end=int(turn_end),
                       phrases=tuple(tuple(int(t) for t in tup) for tup in tuples))
    write(path, name, traces, split=SplitRule(), tokens=tokens,
          description="exactedit antislop: the model's own replies, split by prompt by dataset build.")
    return Path(path)


class _Run(StagedRun):
    """One run's inputs, resolved once (files read, hashed), and its stages."""

    def __init__(self, cfg: AntislopConfig, out: Path, progress: Progress | None, command: str):
        super().__init__(out, cfg.model, cfg.template(), cfg.text_files(), progress)
        self.cfg = cfg
        self.settings = cfg.engine_settings()      # data, corpus, rates (verify runs on the CPU backend)
        self.phrases = cfg.phrase_list()
        self.measured = tuple(dict.fromkeys(self.phrases + cfg.watched()))
        self.prompts = _lines(cfg.file("prompts"))
        self.rate_prompts = _lines(cfg.file("rate_prompts"))
        overlap = set(self.prompts) & set(self.rate_prompts)
        if overlap:
            raise AntislopError(f"{cfg.file('rate_prompts')}: {len(overlap)} prompts are also data prompts (e.g. "
                                f"{sorted(overlap)[0][:60]!r}): the rates must come from prompts the solve never saw")
        if not self.rate_prompts:
            raise AntislopError(f"{cfg.file('rate_prompts')}: no prompts")
        from exactedit.runs.antislop.report import REPORTS

        self.start(len(STAGES), command, STATE, REPORTS)     # refuses a directory not a run's first


def phrases_text(source, top: int | None, phrases: Sequence[str]) -> str:
    """DIR/phrases.txt, what `solve wfld` reads the phrases from: a comment naming their file (as
    ascii() writes it: a newline or a line separator in the name stays inside the comment, a byte
    no UTF-8 holds is escaped), then one phrase a line. Refused (AntislopError) unless it reads
    back as `phrases` (before: a name holding a newline put its second line among the phrases, a
    name of non-UTF-8 bytes was a UnicodeEncodeError)."""
    from exactedit.solvers.phrases import PhraseError, parse_phrases

    text = f"# from {ascii(str(source))}" + (f", top {top}" if top else "") + "\n" + "".join(p + "\n" for p in phrases)
    try:
        back = parse_phrases(text.splitlines(), "phrases.txt")
    except PhraseError as exc:
        back = exc
    if back != tuple(phrases):
        raise AntislopError(f"phrases.txt: the phrases would not read back as given ({back})")
    return text


def run_antislop(cfg: AntislopConfig, out, *, progress: Progress | None = None, command: str = "") -> AntislopResult:
    """Run (or continue) the loop in `out`; see the module doc."""
    from exactedit.runs.antislop.checks import file_problems, word_uses
    from exactedit.runs.antislop.report import write_reports
    from exactedit.runs.loop.preflight import preflight

    out = Path(out)
    r = _Run(cfg, out, progress, command or f"exactedit antislop --model {cfg.model} --out {out}")
    with r:                     # the run holds DIR until it returns or raises
        pre = preflight(r.model, r.phrases, chat_template=r.tpl_path, phrases_from=str(cfg.file("phrases")),
                        settings=file_problems(cfg, r.phrases))
        uses = word_uses(cfg, r.phrases)      # the words bar (d) will not measure, named before generation
        atomic_write_text(out / "phrases.txt", phrases_text(cfg.file("phrases"), cfg.top, r.phrases))
        rec = {"preflight": {**pre.to_dict(), "uses": uses.to_dict()}}
        rec["data"] = _data(r)
        rec["corpus"] = _corpus(r)
        rec["solve"] = _solve(r, rec)
        rec["apply"] = r.apply_stage(rec["solve"]["bundle"])
        rec["verify"] = r.verify_stage(rec["solve"]["bundle"], rec["apply"], r.out / "data" / "heldout",
                                       cfg.verify_tokens)
        rec["rules"] = _rules(r)
        rec["rates"] = _rates(r, rec)
        rec["cost"] = _cost(r, rec)
        seconds = r.stages.seconds()
        seconds = {k: seconds[k] for k in STAGES if k in seconds}
        files, report, text = write_reports(r.out, str(r.model), rec, seconds, ran=r.stages.ran,
                                            resumed=r.stages.resumed, progress=r.tick("report"))
        return AntislopResult(out, str(r.model), rec, report, text, files, tuple(r.stages.ran), tuple(r.stages.resumed))


def _data(r: _Run) -> dict:
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.runs.data.dataset import DatasetConfig, build_dataset
    from exactedit.runs.data.mine import MineConfig

    c = r.cfg

    def build():
        mine = MineConfig(sampling=Sampling(max_new=c.max_new, seed=c.seed), samples=c.samples, n_boot=0,
                          chat_template=r.tpl_path)
        ds = build_dataset(r.model, r.prompts, r.phrases, r.out / "data", texts=r.texts,
                           config=DatasetConfig(mine=mine), settings=r.settings, progress=r.tick("dataset"))
        return {**ds.to_dict(), "tuples": [list(t) for t in ds.tuples("train", "heldout")]}

    return r.run("data", {"prompts": list(r.prompts), "phrases": list(r.phrases), "texts": r.sha["texts"],
                          "samples": c.samples, "max_new": c.max_new, "seed": c.seed, **_offload(r)}, ["data"], build)


def _offload(r: _Run) -> dict:
    """The engine's n_gpu_layers as a stage input, only when layers are offloaded: a CPU run's keys are
    those of a run made before the setting existed (its stages resume)."""
    return {"gpu_layers": r.settings.n_gpu_layers} if r.settings.offloaded else {}


def _corpus(r: _Run) -> dict | None:
    c = r.cfg
    if not c.corpus_tokens:
        r.stages.skip("corpus")
        return None
    from exactedit.runs.data.corpus import build_corpus, english_digest

    def build():
        corpus = build_corpus(r.model, r.phrases, r.out / "corpus", config=c.corpus_config(r.tpl_path),
                              settings=r.settings, progress=r.tick("corpus"))
        return corpus.to_dict()

    return r.run("corpus", {"phrases": list(r.phrases), "max_tokens": c.corpus_tokens, "context": c.corpus_context,
                            "seed": c.seed, "english": english_digest(), **_offload(r)}, ["corpus"], build)


def _parts(rec: dict) -> dict[str, str]:
    """The corpus's dumps by part name (solve, dev, collateral); {} without a corpus."""
    return {p["name"]: p["dump"] for p in (rec["corpus"] or {}).get("parts", ()) if p.get("dump")}


def _solve(r: _Run, rec: dict) -> dict:
    import dataclasses

    from exactedit.runs.eval import workflow
    from exactedit.runs.solve.wfld import WfldInputs, solve_wfld
    from exactedit.evals.scoring.evaluate import ScoreConfig
    from exactedit.quant import gguf
    from exactedit.quant.model.specials import model_specials

    out, c = r.out, r.cfg
    tuples = rec["data"]["tuples"]
    if not tuples:
        raise AntislopError(f"none of the phrases of {out / 'phrases.txt'} occurs in the model's replies to the "
                            "data prompts: nothing to edit (pick phrases by measurement: `exactedit discover`, "
                            "`exactedit mine`)")
    parts = _parts(rec)
    keys = c.keys()
    wcfgs = {k: c.wfld_config(k) for k in keys}
    dest = {k: "wfld" if len(keys) == 1 else f"wfld-{k}" for k in keys}

    def solve():
        import shutil

        with gguf.open(r.model) as g:
            ms = model_specials(g, r.template)
        protocol = write_run_protocol(out / "protocol.toml", out / "data", f"antislop-{Path(str(r.model)).stem}",
                                  ms.guards, ms.turn_end, tuples,
                                  corpus={k: v for k, v in parts.items() if k in ("dev", "collateral")})
        ws = out / "ws"
        cmd = r.stages.state["command"]
        workflow.register(protocol, ws, cmd)
        workflow.split(protocol, ws, cmd)
        inputs = WfldInputs(model=str(r.model), phrases=str(out / "phrases.txt"), train=(str(out / "data" / "train"),),
                            heldout=(str(out / "data" / "heldout"),) + tuple(p for k, p in parts.items() if k == "dev"),
                            collateral=(str(out / "data" / "collateral"),)
                            + tuple(p for k, p in parts.items() if k == "collateral"),
                            anchors=(str(out / "data" / "anchors"),),
                            null=tuple(p for k, p in parts.items() if k == "solve"), protocol=str(protocol))
        t0 = time.perf_counter()
        solved = {k: solve_wfld(wcfgs[k], inputs, out / dest[k], workspace=ws, command=cmd,
                                progress=r.tick(f"solve wfld --key {k}")) for k in keys}
        solve_s = time.perf_counter() - t0
        choice = choose_key({k: wf.report for k, wf in solved.items()}) if len(keys) > 1 else None
        key = keys[0] if choice is None else choice["chosen"]
        if choice is not None:
            shutil.copytree(out / dest[key], out / "wfld")
        wf = solved[key]
        dev = workflow.score(protocol, ws, r.model, out / "dev", cmd, bundle=out / "wfld",
                             config=ScoreConfig(heldout_role="dev", bars="anti-slop"), known=wf.known,
                             progress=r.tick("eval score"))
        return {"protocol": str(protocol), "bundle": str(out / "wfld"), "verdict": wf.verdict, "report": wf.report,
                "key": key, "key_choice": choice, "solve_seconds": round(solve_s, 2),
                "dev_verdict": dev.report.verdict, "dev_report": str(dev.files.paths["json"])}

    outputs = ["protocol.toml", "ws", "wfld", "dev"] + ([dest[k] for k in keys] if len(keys) > 1 else [])
    return r.run("solve", {"data": r.stages.outputs("data"), "corpus": r.stages.outputs("corpus") if parts else None,
                           "phrases": list(r.phrases), "wfld": {k: dataclasses.asdict(w) for k, w in wcfgs.items()}
                           if len(keys) > 1 else dataclasses.asdict(wcfgs[keys[0]])},
                 outputs, solve)


def choose_key(reports: dict) -> dict:
    """Between edit kinds solved on the same data (key -> solve wfld's report), the one to ship,
    chosen on the solve side and dev only: first the kinds whose shipped edit passes bar (e) (the
    exact KL on the anchors, solve-side rows: the frontier that chooses the strength is a
    first-order estimate, the shipped bytes are not; on Qwen a gated edit whose Gauss-Newton
    rounds diverged had a frontier cut of 1.0 and KL 12 on the anchors), then the kinds whose
    chosen strength passes bar (d) on the dev uses, then the larger mean dev cut at that strength
    (its frontier point's `cut_all`); a tie keeps the first kind (dense). Where none passes, the
    larger cut, flagged. Returns each kind's numbers, the choice and why."""
    rows = {}
    for k, rep in reports.items():
        st = rep.get("strength") or {}
        chosen = st.get("chosen") or {}
        point = next((p for p in st.get("frontier") or () if p.get("strength") == chosen), None)
        e = [b for b in rep.get("bars") or () if str(b.get("name", "")).startswith("e_")]
        rows[k] = {"passed_d": bool(st.get("passed_d")), "strength": chosen,
                   "passed_e": all(b.get("pass") is True for b in e),
                   "anchors_kl": max((b["value"] for b in e if b.get("value") is not None), default=None),
                   "dev_cut": None if point is None else point.get("cut_all"),
                   "dev_collateral": None if point is None else point.get("collateral")}
    order = sorted(rows, key=lambda k: (not rows[k]["passed_e"], not rows[k]["passed_d"], -(rows[k]["dev_cut"] or 0.0),
                                        list(rows).index(k)))
    best = order[0]
    b = rows[best]
    if not b["passed_e"]:
        why = f"{best}: no kind's shipped edit passes (e) on the anchors; the first by (d) and dev cut, flagged"
    elif b["passed_d"]:
        why = f"{best}: its shipped edit passes (e) on the anchors, and (d) on dev with the larger mean dev cut"
    else:
        why = f"{best}: no kind passes (d) on dev; the larger mean dev cut among those passing (e), flagged"
    return {"kinds": rows, "chosen": best, "why": why, "passed_d": b["passed_d"] and b["passed_e"]}


def _rules(r: _Run) -> dict:
    from exactedit.native.shaping.compile import compile_file

    def compile_rules():
        return compile_file(None, r.model, r.out / "rules.json", phrases=r.phrases, bias=r.cfg.rules_bias,
                            chat_template=r.tpl_path).to_dict()

    from exactedit.solvers.shaping.compiled import VERSION

    # the compiled format's version in the key: a run directory holding rules of an older format
    # (version 1 missed code fences split over tokens) recompiles them and re-measures the rates
    return r.run("rules", {"phrases": list(r.phrases), "bias": r.cfg.rules_bias, "format": VERSION}, ["rules.json"],
                 compile_rules)


def _rates(r: _Run, rec: dict) -> dict:
    from exactedit.runs.antislop.arms import rate_arms

    c = r.cfg
    seeds = [c.seed + RATE_SEED + s for s in range(c.rate_samples)]

    def rates():
        return rate_arms(r.model, r.out / "rules.json", r.out / "edited.gguf", r.rate_prompts, r.measured, seeds,
                         max_new=c.max_new, n_boot=c.n_boot, out=r.out, progress=r.tick("rates (4 arms)"),
                         rules_mode=c.rules_mode, settings=r.settings)

    # the rules' mode joins the stage's inputs only when it is not the default (a run made before the
    # mode existed keeps its rates)
    mode = {"rules_mode": c.rules_mode} if c.rules_mode != "penalty" else {}
    return r.run("rates", {"edited": rec["apply"]["sha256"], "rules": r.stages.outputs("rules"),
                           "prompts": list(r.rate_prompts), "phrases": list(r.measured), "seeds": seeds,
                           "max_new": c.max_new, "n_boot": c.n_boot, **mode, **_offload(r)},
                 ["rates.json", "replies.json", "phrase-rates.png", "arms.png"], rates)


def _cost(r: _Run, rec: dict) -> dict:
    from exactedit.runs.loop.cost import edit_cost

    held = {"held-out replies (chat, dev)": r.out / "data" / "heldout",
            "collateral replies and plain text (never solved on)": r.out / "data" / "collateral"}
    coll = _parts(rec).get("collateral")
    if coll:
        held["corpus collateral windows (plain text, never solved on)"] = Path(coll)

    def cost():
        return edit_cost(r.model, rec["apply"]["edited"], held, r.out / "replies.json", r.out / "cost.json",
                         progress=r.tick("cost"))

    return r.run("cost", {"edited": rec["apply"]["sha256"], "data": r.stages.outputs("data"),
                          "corpus": r.stages.outputs("corpus") if coll else None,
                          "rates": r.stages.outputs("rates")}, ["cost.json"], cost)
