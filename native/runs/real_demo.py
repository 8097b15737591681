"""`exactedit demo --model qwen|gemma`: the whole anti-slop loop on a real model, on llama.cpp.

The model's chat template is its GGUF's own, or a Jinja2 file (`chat_template`, else the bundled
native/runs/data/NAME/chat_template.jinja: Gemma 3 270M's file carries none); it renders every
prompt, and the turn framing, turn end and specials of the data and the protocol are read off it.
The settings are RealDemoConfig's defaults, overridden per model by the bundled
native/runs/data/NAME/defaults.toml (`RealDemoConfig.for_model`; chosen on dev data).

1. the data, from the model's own replies (`dataset build`): train / held-out / collateral /
   anchor dumps, split by prompt;
2. a protocol for those dumps (held-out as dev; the bars; the model's own specials and turn end;
   the phrases as the token tuples the dataset build's matcher found in train and held-out),
   registered and split in DIR/ws;
3. `solve wfld` under that protocol -> DIR/wfld/ (bars (a)-(g), shipping residuals, alternatives):
   it solves on the protocol's tuples, the ones `eval score` (6) reads;
4. `apply` -> DIR/edited.gguf, every other byte of the base kept;
5. `verify live`: llama.cpp on base and edited files against the engine-faithful offline prediction,
   on a held-out reply (bitwise where it passes);
6. `eval score` of the bundle on dev -> DIR/dev/;
7. phrase rates in free generation on held-out prompts that built none of the data, base vs
   edited, same prompts and seeds (`mine --edited`), for the solved phrases and the watched ones
   (`watch`: e.g. the whole phrase when the solve bans its prefix), and the variant artefacts in
   those replies;
8. new slop: `exactedit discover` on the edited rate replies against the base ones (what took the
   banned phrases' place);
9. DIR/report.md, DIR/report.json (`verify`, `bars`, `phrase_rates`, `artefacts`, `targets`,
   `new_slop`, ...), DIR/replies.json (every rate reply's text and prompt, base and edited), and PNGs
   (rates before / after per phrase, per-word collateral).
The phrases may be a phrases file or discover's JSON (`top`); the list solved for is written to
DIR/phrases.txt.
Each step is the library call behind its CLI command; nothing here prints.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from exactedit.quant.errors import ExacteditError
from exactedit.quant.files import atomic_write_text
from exactedit.evals.scoring.collateral import collateral_lines
from exactedit.solvers.wfld.report import strength_lines

DATA = Path(__file__).resolve().parent / "data"
Progress = Callable[[str, int, int], None]

__all__ = ["RealDemoConfig", "RealDemoResult", "real_demo_report", "run_real_demo"]


class RealDemoError(ExacteditError):
    """The real-model demo cannot run (an output directory in the way, a model without data)."""


def _lines(path) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as fh:
        return tuple(line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#"))


@dataclass(frozen=True)
class RealDemoConfig:
    """What the demo runs on. Files default to the bundled ones for the model (native/runs/data/NAME/)."""

    model: str = "qwen"
    prompts: str | None = None          # one prompt per line: the solve's data
    rate_prompts: str | None = None     # one prompt per line: held-out, for the phrase rates only
    phrases: str | None = None          # one banned phrase per line, or discover's JSON
    top: int | None = None              # the first `top` phrases of `phrases` (discover's JSON: its usable ones)
    watch: str | None = None            # phrases measured in generation too, not solved for (optional)
    same_sense: str | None = None       # PHRASE=WORD[,WORD] per line: paraphrases held, never raised (optional)
    texts: tuple[str, ...] | None = None  # plain texts (legitimate uses, plain anchors)
    samples: int = 2                    # replies per data prompt
    rate_samples: int = 2               # replies per rate prompt
    max_new: int = 160
    seed: int = 0
    verify_tokens: int = 192            # tokens of the held-out reply verify live runs
    n_boot: int = 1000
    ridge: float = 0.01                 # solve wfld's background ridge (docs/real-model.md: the dev rule)
    background: str = "anchors+train"   # solve wfld's background rows (docs/real-model.md: measured on dev)
    corpus_tokens: int = 12_000         # prefill budget of the teacher-forced corpus (dataset corpus); 0: none
    corpus_context: int = 32            # tokens of context before each use in a corpus window
    key: str = "dense"                  # solve wfld --key (docs/real-model.md: chosen on dev)
    word_holds: int = 2000              # solve wfld --word-holds (every plausible row of the solve side)
    strength_grid: tuple[float, ...] = (1.0, 0.8, 0.6, 0.45, 0.3, 0.2)   # solve wfld --strength-grid (per phrase, on dev)
    chat_template: str | None = None    # a Jinja2 chat template file (default: the bundled chat_template.jinja, if any)

    @classmethod
    def for_model(cls, model: str = "qwen", **given) -> "RealDemoConfig":
        """The config for `model`: the fields `given` (None: not given), else the model's bundled
        defaults.toml, else the class defaults."""
        return cls(model=model, **{**model_defaults(model), **{k: v for k, v in given.items() if v is not None}})

    def __post_init__(self):
        if min(self.samples, self.rate_samples, self.max_new, self.verify_tokens) < 1:
            raise RealDemoError("samples, rate_samples, max_new and verify_tokens must be >= 1")
        if self.corpus_tokens < 0 or self.word_holds < 0:
            raise RealDemoError("corpus_tokens and word_holds must be >= 0")

    def wfld_config(self):
        """solve wfld's settings of the demo."""
        from exactedit.solvers.wfld.config import WfldConfig

        try:
            return WfldConfig(ridge=self.ridge, background=self.background, same_sense=self.same_sense_words(),
                              key=self.key, word_holds=self.word_holds, strength_grid=tuple(self.strength_grid))
        except ValueError as exc:
            raise RealDemoError(str(exc)) from None

    def file(self, name: str) -> Path:
        given = getattr(self, name)
        if given is not None:
            return Path(given)
        path = DATA / self.model / f"{name}.txt"
        if not path.is_file():
            raise RealDemoError(f"no bundled --{name.replace('_', '-')} for model {self.model!r} "
                                f"(bundled: {sorted(p.name for p in DATA.iterdir())}); give the file")
        return path

    def phrase_list(self) -> tuple[str, ...]:
        """The phrases solved for: the phrases file's lines, or discover's JSON's usable entries
        (each at its measured ban point), the first `top` of them."""
        from exactedit.solvers.phrases import PhraseError, load_phrases

        try:
            return load_phrases(self.file("phrases"), self.top)
        except PhraseError as exc:
            raise RealDemoError(str(exc)) from None

    def watched(self) -> tuple[str, ...]:
        """The extra phrases of the rate measurement: --watch, else the bundled watch.txt, else none."""
        if self.watch is None and not (DATA / self.model / "watch.txt").is_file():
            return ()
        return _lines(self.file("watch"))

    def same_sense_words(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """solve wfld's same-sense words: --same-sense, else the bundled same_sense.txt, else none."""
        if self.same_sense is None and not (DATA / self.model / "same_sense.txt").is_file():
            return ()
        from exactedit.solvers.wfld.config import parse_same_sense

        path = self.file("same_sense")
        try:
            return tuple(parse_same_sense(line) for line in _lines(path))
        except ValueError as exc:
            raise RealDemoError(f"{path}: {exc}") from None

    def template(self):
        """The chat template the demo renders with (quant.chat_template.GivenTemplate): --chat-template,
        else the bundled chat_template.jinja; None: the GGUF's own."""
        from exactedit.native.llamacpp.chat import given_template

        path = self.chat_template
        if path is None and (DATA / self.model / "chat_template.jinja").is_file():
            path = DATA / self.model / "chat_template.jinja"
        return None if path is None else given_template(path)

    def text_files(self) -> tuple[Path, ...]:
        if self.texts is not None:
            return tuple(Path(t) for t in self.texts)
        folder = DATA / self.model / "texts"
        return tuple(sorted(folder.glob("*.txt"))) if folder.is_dir() else ()


DEFAULTS_FILE = "defaults.toml"
_TUPLES = {"strength_grid": float, "texts": str}


def model_defaults(model: str) -> dict:
    """The bundled per-model settings (native/runs/data/NAME/defaults.toml: RealDemoConfig field =
    value), {} when the model has none. An unknown field or a wrong type names the file and field."""
    import dataclasses
    import tomllib

    path = DATA / model / DEFAULTS_FILE
    if not path.is_file():
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RealDemoError(f"{path}: cannot read as TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(RealDemoConfig)}
    out = {}
    for key, value in raw.items():
        if key not in fields or key == "model":
            raise RealDemoError(f"{path}: {key}: not a setting of the demo (one of {sorted(set(fields) - {'model'})})")
        default = fields[key].default
        if key in _TUPLES:
            if not isinstance(value, list) or not all(isinstance(v, (_TUPLES[key], int)) for v in value):
                raise RealDemoError(f"{path}: {key}: expected a list of {_TUPLES[key].__name__}, got {value!r}")
            value = tuple(_TUPLES[key](v) for v in value)
        elif default is not None and (isinstance(value, bool) != isinstance(default, bool) or (
                not isinstance(value, type(default))
                and not (isinstance(default, float) and isinstance(value, int)))):
            raise RealDemoError(f"{path}: {key}: expected {type(default).__name__}, got {value!r}")
        out[key] = float(value) if isinstance(default, float) else value
    return out


@dataclass(frozen=True, eq=False)
class RealDemoResult:
    out: Path
    model: str
    dataset: object          # native.runs.dataset.DatasetResult
    protocol: Path
    wfld: object             # evals.runs.wfld_run.WfldResult
    applied: object          # solvers.apply.ApplyResult
    verify: object           # native.verify.live.VerifyReport
    dev: object              # evals.runs.workflow.ScoreResult
    rates: object            # native.runs.mine.MineResult (base and edited, held-out prompts)
    artefacts: dict          # side -> [evals.rates.artefacts.Artefact]
    seconds: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    corpus: object = None    # native.runs.corpus.CorpusResult, or None without a corpus
    new_slop: object = None  # evals.discover.Discovery: the edited replies against the base ones
    rate_prompts: tuple[str, ...] = ()   # the held-out prompts of `rates` (replies.json names them)


def write_protocol(path: Path, data: Path, name: str, specials: Sequence[int], turn_end: int,
                   tuples: Sequence[Sequence[int]], corpus: dict | None = None) -> Path:
    """The demo's protocol (written by evals.protocol.protocol.write_protocol): the dataset's four
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
          description="exactedit demo --model: the model's own replies, split by prompt by dataset build.")
    return Path(path)


def _verify_tokens(heldout_dump: Path, count: int):
    """The tokens of the longest held-out document, at most `count` of them."""
    from exactedit.dumps import read_dump

    d = read_dump(heldout_dump)
    doc = max(d.docs, key=lambda x: x.stop - x.first_row)
    return d.tokens[doc.first_row:min(doc.stop, doc.first_row + count)].copy()


def run_real_demo(cfg: RealDemoConfig, out, *, progress: Progress | None = None) -> RealDemoResult:
    """Run the loop into the new directory `out`; see the module doc."""
    from exactedit.evals.runs import workflow
    from exactedit.evals.rates.artefacts import variant_artefacts
    from exactedit.evals.scoring.evaluate import ScoreConfig
    from exactedit.evals.runs.wfld_run import WfldInputs, solve_wfld
    from exactedit.native.runs.dataset import DatasetConfig, build_dataset
    from exactedit.native.runs.mine import MineConfig, mine
    from exactedit.native.llamacpp.models import locate
    from exactedit.native.verify.live import verify_live
    from exactedit.quant import gguf
    from exactedit.quant.specials import model_specials
    from exactedit.solvers.apply import apply_bundle
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise RealDemoError(f"{out}: exists and is not empty (the demo writes a fresh directory)")
    out.mkdir(parents=True, exist_ok=True)
    tick = (lambda label: (lambda d, t: progress(label, d, t))) if progress else (lambda label: None)
    seconds, t0 = {}, time.perf_counter()

    def mark(name):
        nonlocal t0
        now = time.perf_counter()
        seconds[name] = now - t0
        t0 = now

    model = locate(cfg.model, progress=tick("model"))
    template = cfg.template()
    tpl_path = None if template is None else template.path
    phrases = cfg.phrase_list()
    phrases_file = out / "phrases.txt"     # the list solved for, whatever form it was given in
    atomic_write_text(phrases_file, f"# from {cfg.file('phrases')}" + (f", top {cfg.top}" if cfg.top else "")
                      + "\n" + "".join(p + "\n" for p in phrases))
    ds = build_dataset(model, _lines(cfg.file("prompts")), phrases, out / "data", texts=cfg.text_files(),
                       config=DatasetConfig(samples=cfg.samples, max_new=cfg.max_new, seed=cfg.seed,
                                            chat_template=tpl_path),
                       progress=tick("dataset"))
    mark("dataset")
    corpus = None
    if cfg.corpus_tokens:
        from exactedit.native.runs.corpus import CorpusConfig, build_corpus

        corpus = build_corpus(model, phrases, out / "data" / "corpus", config=CorpusConfig(
            max_tokens=cfg.corpus_tokens, context=cfg.corpus_context, after=4, seed=cfg.seed, chat_template=tpl_path),
            progress=tick("corpus"))
        mark("corpus")
    parts = {p.name: p.dump for p in (corpus.parts if corpus else ()) if p.dump}
    with gguf.open(model) as g:
        ms = model_specials(g, template)
    tuples = ds.tuples("train", "heldout")       # the dataset build's own matching, not matched again
    if not tuples:
        raise RealDemoError(f"none of the phrases of {phrases_file} occurs in the model's replies: nothing to "
                            "edit (pick phrases by measurement: `exactedit mine`)")
    protocol = write_protocol(out / "protocol.toml", out / "data", f"demo-{cfg.model}", ms.guards, ms.turn_end,
                              tuples, corpus={k: v for k, v in parts.items() if k in ("dev", "collateral")})
    ws = out / "ws"
    cmd = f"exactedit demo --model {cfg.model} --out {out}"
    workflow.register(protocol, ws, cmd)
    workflow.split(protocol, ws, cmd)
    mark("register")
    inputs = WfldInputs(model=str(model), phrases=str(phrases_file), train=(str(out / "data" / "train"),),
                        heldout=(str(out / "data" / "heldout"),) + tuple(p for k, p in parts.items() if k == "dev"),
                        collateral=(str(out / "data" / "collateral"),)
                        + tuple(p for k, p in parts.items() if k == "collateral"),
                        anchors=(str(out / "data" / "anchors"),),
                        null=tuple(p for k, p in parts.items() if k == "solve"), protocol=str(protocol))
    wf = solve_wfld(cfg.wfld_config(), inputs, out / "wfld", workspace=ws, command=cmd, progress=tick("solve wfld"))
    mark("solve_wfld")
    applied = apply_bundle(wf.bundle, model, out / "edited.gguf", progress=tick("apply"))
    mark("apply")
    report = verify_live(model, wf.bundle, _verify_tokens(out / "data" / "heldout", cfg.verify_tokens),
                         edited=applied.out, progress=tick("verify live"))
    mark("verify_live")
    dev = workflow.score(protocol, ws, model, out / "dev", cmd, bundle=wf.bundle,
                         config=ScoreConfig(heldout_role="dev", bars="anti-slop"), progress=tick("eval score"))
    mark("eval_score")
    measured = tuple(dict.fromkeys(phrases + cfg.watched()))
    rate_prompts = _lines(cfg.file("rate_prompts"))
    rates = mine(model, rate_prompts, measured, None, edited=applied.out,
                 config=MineConfig(max_new=cfg.max_new, seed=cfg.seed + 10_000, samples=cfg.rate_samples,
                                   n_boot=cfg.n_boot, chat_template=tpl_path), progress=tick("phrase rates"))
    artefacts = {"base": variant_artefacts([r.text for r in rates.replies], measured),
                 "edited": variant_artefacts([r.text for r in rates.edited_replies], measured)}
    mark("phrase_rates")
    new_slop = new_slop_of(rates)
    mark("new_slop")
    r = RealDemoResult(out, str(model), ds, protocol, wf, applied, report, dev, rates, artefacts, seconds,
                       corpus=corpus, new_slop=new_slop, rate_prompts=rate_prompts)
    return _write_reports(r)


NEW_SLOP_TOP = 15


def new_slop_of(rates):
    """What took the banned phrases' place: `exactedit discover` on the edited model's rate replies
    against the base model's (same prompts and seeds), both corpora pooled as the prior's background
    (the reference is the same model's own text, not English at large); the prior's weight is a
    tenth of the smaller side's words, so a phrase needs the evidence of several replies. None when
    either side has no words."""
    from exactedit.evals.discover import DiscoverError, Text, discover

    def texts(side, replies):
        return [Text(x.text, side, f"{side} reply {x.name}") for x in replies]

    edited, base = texts("edited", rates.edited_replies), texts("base", rates.replies)
    words = min(sum(len(t.text.split()) for t in side) for side in (edited, base)) if edited and base else 0
    if words == 0:
        return None
    try:
        return discover(edited, base, top=NEW_SLOP_TOP, background="human", alpha0=max(10.0, words / 10))
    except DiscoverError:
        return None


def _write_png(fig, path: Path) -> Path:
    """Lay out `fig`, write it to `path` as a PNG (atomically) and close it."""
    import io

    import matplotlib.pyplot as plt

    from exactedit.quant.files import atomic_write_bytes

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _collateral_png(bars: Sequence[dict], path: Path) -> Path:
    """PNG: bar (d) per word, mean dlogp on its legitimate uses, with the bar's threshold."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [b for b in bars if b.get("bar") == "(d)" and "mean" in b.get("name", "")]
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * max(len(rows), 1)))
    labels = [b.get("label", b["name"]) for b in rows]
    vals = [b["value"] if b["value"] is not None else 0.0 for b in rows]
    ax.barh(range(len(rows)), vals, color=["tab:green" if b["pass"] else "tab:red" for b in rows])
    if rows:
        ax.axvline(rows[0]["threshold"], color="k", ls="--", lw=1, label=f"bar {rows[0]['threshold']}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlabel("mean dlogp on legitimate uses (nats)")
    ax.set_title("per-word collateral, bar (d)", fontsize=9)
    return _write_png(fig, path)


def frontier_png(strength: dict, path: Path) -> Path:
    """PNG: per phrase (the others at their chosen strength), its continuation cut against the
    worst word's share of uses below -0.1, one point per strength (dev: solid; the held-out
    collateral, never chosen on: dashed); the chosen strength circled."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from exactedit.solvers.wfld.report import frontier_slices

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {}
    for label, key, ls in (("dev", "frontier", "-"), ("collateral", "collateral_frontier", "--")):
        for ph, rows in frontier_slices(strength, key).items():
            pts = [(max(v["low"] for v in r["collateral"].values()), r["cut"][ph], r["strength"][ph])
                   for r in rows if ph in r["cut"] and r["collateral"]]
            if not pts:
                continue
            xs, ys, ss = zip(*pts)
            line, = ax.plot(xs, ys, ls, marker="o", ms=3, color=colors.get(ph), label=f"{label}: {ph!r}")
            colors[ph] = line.get_color()
            for x, y, st in pts:
                if st == strength["chosen"][ph]:
                    ax.plot([x], [y], "o", ms=9, mfc="none", color=colors[ph])
    ax.axvline(0.10, color="k", ls=":", lw=1, label="bar (d): 10% of uses")
    ax.axhline(0.70, color="grey", ls=":", lw=1, label="target cut 70%")
    ax.set_xlabel("worst word's share of legitimate uses below -0.1 nats")
    ax.set_ylabel("continuation cut at the phrase's prefix")
    ax.set_title("strength frontier per phrase (circled: chosen on dev)", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
    return _write_png(fig, path)


def _write_reports(r: RealDemoResult) -> RealDemoResult:
    from exactedit.evals.rates.report import plot_phrase_rates
    from exactedit.native.runs.mine import write_replies

    obj, text = real_demo_report(r)
    files = {"json": r.out / "report.json", "md": r.out / "report.md", "rates_png": r.out / "phrase-rates.png",
             "collateral_png": r.out / "collateral.png", "replies": r.out / "replies.json"}
    write_replies(r.rates, r.rate_prompts or None, files["replies"])
    plot_phrase_rates(r.rates.phrase_rates, files["rates_png"], title=f"{Path(r.model).name}: held-out prompts")
    _collateral_png(r.wfld.report["bars"], files["collateral_png"])
    strength = r.wfld.report.get("strength") or {}
    if strength.get("frontier"):
        files["frontier_png"] = r.out / "frontier.png"
        frontier_png(strength, files["frontier_png"])
    atomic_write_text(files["json"], json.dumps({**obj, "files": {k: str(v) for k, v in files.items()}},
                                                indent=1, default=str) + "\n")
    atomic_write_text(files["md"], text + "\n\n![phrase rates](phrase-rates.png)\n\n![collateral](collateral.png)\n"
                      + ("\n![frontier](frontier.png)\n" if "frontier_png" in files else ""))
    return RealDemoResult(**{**r.__dict__, "files": files})


def _rate_line(p: dict) -> str:
    def side(s):
        c = s.get("continuation")
        return (f"{s['replies_with']:>3} replies  {s['per_1k_tokens']:7.2f}/1k  "
                f"cont {'n/a' if c is None else f'{c:.2f}'}")
    line = f"  {p['phrase']!r:<24} base {side(p['base'])}"
    return line + (f"  | edited {side(p['edited'])}" if p.get("edited") else "")


CONTINUATION_CUT = 0.70      # the target: continuation at the prefix down >= 70% per solved phrase


def demo_targets(rates: Sequence[dict], solved: Sequence[str], bars: Sequence[dict], verify_passed: bool,
                 artefacts: dict, replies: dict) -> list[dict]:
    """The real-model targets, each {name, value, target, pass}: per solved phrase the continuation
    cut at its prefix (1 - edited / base, held-out prompts), every bar, verify live, the edited
    replies' variant artefacts, and the turn-end rate (replies that reached the model's turn end,
    base vs edited: unchanged means within one reply)."""
    out = []
    for p in rates:
        if p["phrase"] not in solved or not p.get("edited"):
            continue
        b, e = p["base"].get("continuation"), p["edited"].get("continuation")
        cut = None if not b or e is None else 1.0 - e / b
        out.append({"name": f"continuation cut {p['phrase']!r}", "value": cut, "target": f">= {CONTINUATION_CUT}",
                    "pass": cut is not None and cut >= CONTINUATION_CUT})
    failed = [f"{x['bar']} {x.get('label', x['name'])}" for x in bars if not x["pass"]]
    out.append({"name": "bars (a)-(g)", "value": f"{len(bars) - len(failed)}/{len(bars)} pass",
                "target": "all pass", "pass": not failed, "failed": failed})
    out.append({"name": "verify live (bitwise)", "value": verify_passed, "target": True, "pass": bool(verify_passed)})
    n_art = len(artefacts.get("edited", ()))
    out.append({"name": "variant artefacts, edited replies", "value": n_art, "target": 0, "pass": n_art == 0})
    ends = {k: sum(r.stop == "turn_end" for r in v) for k, v in replies.items()}
    n = max(len(replies.get("base", ())), 1)
    out.append({"name": "turn-end rate (replies ending at the turn end)",
                "value": f"{ends.get('base', 0)}/{n} -> {ends.get('edited', 0)}/{n}", "target": "within 1 reply",
                "pass": abs(ends.get("base", 0) - ends.get("edited", 0)) <= 1})
    return out


def real_demo_report(r: RealDemoResult) -> tuple[dict, str]:
    """(report.json's object, report.md's text) of a real-model demo."""
    rates = r.rates.phrase_rates.to_dict()["phrase_rates"]
    bars = r.wfld.report["bars"]
    solved = [p["phrase"] for p in r.wfld.report.get("phrases", []) if isinstance(p, dict) and "phrase" in p]
    targets = demo_targets(rates, solved, bars, r.verify.passed, r.artefacts,
                           {"base": r.rates.replies, "edited": r.rates.edited_replies})
    obj = {"model": r.model, "out": str(r.out), "protocol": str(r.protocol),
           "dataset": r.dataset.to_dict(), "corpus": r.corpus.to_dict() if r.corpus is not None else None,
           "key": r.wfld.report.get("key"), "strength": r.wfld.report.get("strength"), "wfld_bundle": str(r.wfld.bundle), "wfld_verdict": r.wfld.verdict,
           "bars": bars, "collateral": r.wfld.report.get("collateral"), "shipping": r.wfld.report.get("shipping"), "alternatives": r.wfld.report.get("alternatives"),
           "edited": str(r.applied.out), "edited_sha256": r.applied.out_sha256,
           "verify": r.verify.to_json(), "dev_verdict": r.dev.report.verdict,
           "dev_report": str(r.dev.files.paths["json"]),
           "phrase_rates": rates, "rates_run": r.rates.phrase_rates.to_dict(),
           "artefacts": {k: [a.__dict__ for a in v] for k, v in r.artefacts.items()},
           "targets": targets,
           "new_slop": r.new_slop.to_dict() if r.new_slop is not None else None,
           "seconds": {k: round(v, 2) for k, v in r.seconds.items()}}
    lines = [f"# exactedit demo --model: {Path(r.model).name}", "",
             f"data: {sum(s.docs for s in r.dataset.sets)} documents in {len(r.dataset.sets)} sets "
             f"({', '.join(f'{s.name} {s.docs}' for s in r.dataset.sets)})"]
    lines += [f"warning: {w}" for w in r.dataset.warnings]
    if r.corpus is not None:
        lines.append("corpus (teacher-forced windows, split by source document): " + "; ".join(
            f"{p.name} {p.windows} windows, {p.rows} rows, uses " + ", ".join(f"{w!r} {n}" for w, n in p.uses.items())
            for p in r.corpus.parts))
        lines += [f"warning: {w}" for w in r.corpus.warnings]
    key = r.wfld.report.get("key") or {}
    lines += ["", f"## solve wfld: {r.wfld.verdict} (key {key.get('kind', 'dense')}, "
              f"{r.wfld.report['conditions'].get('word@plausible', 0)} word holds)", ""]
    lines += strength_lines(r.wfld.report.get("strength"))
    lines += [f"  {b['bar']:<4} {b.get('label', b['name'])[:60]:<60} {b['value'] if b['value'] is None else round(b['value'], 5)!s:>10}"
              f"  {b['op']} {b['threshold']}  {'pass' if b['pass'] else 'FAIL'}" for b in bars]
    coll = collateral_lines(r.wfld.report.get("collateral") or ())
    if coll:
        lines += [""] + coll
    v = r.verify
    lines += ["", f"## verify live: {'PASS' if v.passed else 'FAIL'} ({v.tokens} tokens)"]
    lines += [f"  {c.name}: bitwise {c.stats.bitwise}, max |diff| {c.stats.max_abs:.3g}, KL mean "
              f"{c.stats.kl_mean:.3g}, top-1 {c.stats.top1:.4f}" for c in v.checks]
    lines += ["", f"## dev score: {r.dev.report.verdict} ({r.dev.files.paths['json']})", "",
              "## phrase rates, held-out prompts (base vs edited, same prompts and seeds)"]
    lines += [_rate_line(p) for p in rates]
    lines += ["", f"variant artefacts: base {len(r.artefacts['base'])}, edited {len(r.artefacts['edited'])}"]
    lines += [f"  {a.found!r} (reply {a.reply})" for a in r.artefacts["edited"]]
    lines += ["", "## targets"]
    shown = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)   # noqa: E731
    lines += [f"  {t['name']:<52} {shown(t['value']):>14}  target {t['target']!s:<12} {'pass' if t['pass'] else 'FAIL'}"
              + (f"  ({'; '.join(t['failed'])})" if t.get("failed") else "") for t in targets]
    lines += ["", "## new slop: the edited replies' phrases against the base replies' (same prompts and seeds)"]
    if r.new_slop is None or not r.new_slop.phrases:
        c = r.new_slop.config if r.new_slop is not None else None
        lines.append("  none over-used" + (f" (z >= {c.min_z:g}, log-odds >= {c.min_log_odds:g}, in {c.min_docs}+ replies)"
                                           if c else " (no words on one side)"))
    lines += [f"  {p.phrase!r:<40} z {p.z:6.2f}  edited {p.model_count} ({p.model_per_1k:.2f}/1k words)  base "
              f"{p.human_count} ({p.human_per_1k:.2f}/1k)" for p in (r.new_slop.phrases if r.new_slop else ())]
    lines += ["", "time: " + ", ".join(f"{k} {v:.0f} s" for k, v in r.seconds.items())]
    return obj, "\n".join(lines)
