"""`exactedit dataset build`: the four dump sets of `solve wfld`, from the model's own replies.

From prompts, banned phrases and a few plain texts:
1. the prompts are split by prompt (never by reply or row) into train / held-out / collateral /
   anchor groups: a seeded order of their hashes, cut by the configured shares (largest
   remainder, each group at least one prompt when there are enough);
2. the model samples `samples` replies per prompt to its own turn end (generation's door,
   native/llamacpp/sample.py, batched, with runs/data/mine.py's jobs and stop tokens: its chat
   template, its specials, the shared phrase matcher);
3. the plain texts are cut into documents of at most `chunk` tokens (one character per chunk);
   chunks holding a legitimate use of a banned word go in turn to collateral (scored by bar (d)),
   train (held by the null space) and anchors; the rest are plain anchors;
4. four dumps are captured, every document labelled (tags, source, one character per prompt or
   text, row roles from the model's chat framing; a reply cut at `max_new` has no reply end):
   - `train`: replies of the train prompts (`chat`, `slop` where the phrases occur) and text
     chunks with legitimate uses (`plain`): the FTPO targets and the legitimate uses whose span
     the edit must not move;
   - `heldout`: replies of the held-out prompts (`chat`, `slop`): bars (c), (f), (g);
   - `collateral`: replies of the collateral prompts and text chunks with legitimate uses
     (`collateral`, `chat` / `plain`): bar (d), never solved on;
   - `anchors`: replies of the anchor prompts and the other text chunks (`anchor`, `chat` /
     `plain`): the background metric, the special-token holds, bar (e).
The summary counts what `solve wfld` will mine in each set (solvers/l47/mining.py, the same
matcher): slop contexts per phrase, legitimate uses per word, complete turn ends, and warns
where a set is too small for its bar; every reply's text goes to DIR/replies.json (with its set:
`exactedit discover` reads it as model text; one that discover would refuse, past one of its limits,
is refused after the sampling and before any dump is captured, and a reply count past its record limit
before the sampling). The result keeps each set's mining (`DatasetResult.tuples`):
the demo's protocol lists the tuples found here, so the replies are matched once.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.dumps import ROLE_REPLY_END
from exactedit.evals.discover.sources import over_limits
from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
from exactedit.native.llamacpp.chat import model_chat, prompt_tokens, reply_name, short_hash
from exactedit.native.llamacpp.documents import labelled
from exactedit.native.llamacpp.engine import EngineError, EngineSettings, LlamaEngine
from exactedit.native.llamacpp.generate import Sampling
from exactedit.native.llamacpp.sample import sample_replies
from exactedit.runs.data.mine import (MineConfig, by_prompt, replies_json, reply_infos, reply_jobs, reply_record,
                                      reply_stops)
from exactedit.files import MAX_TEXT_BYTES, atomic_write_text, decode_utf8, read_regular
from exactedit.solvers.l47.mining import mine as mine_dumps
from exactedit.solvers.phrases import parse_phrases

Progress = Callable[[int, int], None]
SETS = ("train", "heldout", "collateral", "anchors")
PROMPT_SETS = {"train": "train", "heldout": "heldout", "collateral": "collateral", "anchor": "anchors"}
# Below these, a set's bar stands on too little (the bars stay computable, but say little).
MIN_CONTEXTS = 10        # slop contexts per phrase in train (a), in held-out (c)
MIN_USES = 10            # legitimate uses per word in collateral (d): its 10% share is one use
MIN_TURN_ENDS = 5        # complete assistant turn ends in held-out chat (f)
MIN_ANCHOR_ROWS = 256    # anchor rows (the special-token holds pick this many by default)


@dataclass(frozen=True)
class DatasetConfig:
    """`dataset build`: how the replies are sampled (`mine`: its sampling, replies per prompt, the
    chat's framing) and how prompts are split; the split's order is keyed by the sampling seed."""

    mine: MineConfig = MineConfig(sampling=Sampling(max_new=256), samples=2, n_boot=0)
    heldout: float = 0.25
    collateral: float = 0.15
    anchor: float = 0.15
    chunk: int = 256

    def __post_init__(self):
        shares = (self.heldout, self.collateral, self.anchor)
        if any(not 0 <= s < 1 for s in shares) or sum(shares) >= 1:
            raise EngineError("DatasetConfig", "shares", "heldout, collateral and anchor shares must be in [0, 1) "
                              "and leave some prompts for train")
        if self.chunk < 16:
            raise EngineError("DatasetConfig", "chunk", f"expected >= 16 tokens, got {self.chunk}")
        if not isinstance(self.mine, MineConfig):
            raise EngineError("DatasetConfig", "mine", f"expected a MineConfig, got {type(self.mine).__name__}")

    @property
    def seed(self) -> int:
        return self.mine.sampling.seed

    def record(self) -> dict:
        """The settings as each dump's metadata records them (one flat table, the format's keys)."""
        m, sp = self.mine, self.mine.sampling
        return {"samples": m.samples, "max_new": sp.max_new, "temperature": sp.temperature, "top_k": sp.top_k,
                "seed": sp.seed, "heldout": self.heldout, "collateral": self.collateral, "anchor": self.anchor,
                "chunk": self.chunk, "capitalized": m.capitalized, "chat_fallback": m.chat_fallback,
                "chat_template": m.chat_template}


@dataclass(frozen=True)
class SetSummary:
    name: str
    dump: str
    docs: int
    rows: int
    tags: dict[str, int]
    contexts: dict[str, int]            # phrase -> slop contexts (FTPO positions)
    occurrences: dict[str, int]         # phrase -> whole-word occurrences in the text
    uses: dict[str, int]                # word -> legitimate uses
    turn_ends: int
    truncated: int


@dataclass(frozen=True)
class DatasetResult:
    out: Path
    prompts: dict[str, list[str]]       # set -> prompt hashes
    sets: tuple[SetSummary, ...]
    warnings: tuple[str, ...]
    chat: dict = field(default_factory=dict)
    mining: dict = field(default_factory=dict, compare=False, repr=False)   # set -> its Mining (not in to_dict)

    def to_dict(self) -> dict:
        return {"out": str(self.out), "prompts": self.prompts, "sets": [asdict(s) for s in self.sets],
                "warnings": list(self.warnings), "chat": self.chat}

    def tuples(self, *sets: str) -> tuple[tuple[int, ...], ...]:
        """Every phrase tuple the build's matcher found in these sets, sorted (as one `mine` over
        their dumps gives them): a protocol's phrase list without matching the replies again."""
        return tuple(sorted({t for s in sets if s in self.mining for t in self.mining[s].tuples}))


def split_prompts(prompts: Sequence[str], cfg: DatasetConfig) -> dict[str, list[int]]:
    """Prompt indices per group: a seeded order of prompt hashes, cut by largest remainder."""
    order = sorted(range(len(prompts)), key=lambda i: hashlib.sha256(f"{cfg.seed}\0{prompts[i]}".encode()).hexdigest())
    shares = {"heldout": cfg.heldout, "collateral": cfg.collateral, "anchor": cfg.anchor}
    shares["train"] = 1.0 - sum(shares.values())
    n = len(order)
    exact = {k: v * n for k, v in shares.items()}
    count = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: (-(exact[k] - count[k]), k))[:n - sum(count.values())]:
        count[k] += 1
    for k in ("heldout", "collateral", "anchor"):        # a group asked for gets one prompt if train can spare it
        if shares[k] > 0 and count[k] == 0 and count["train"] > 1:
            count[k], count["train"] = 1, count["train"] - 1
    out, at = {}, 0
    for k in ("train", "heldout", "collateral", "anchor"):
        out[k] = sorted(order[at:at + count[k]])
        at += count[k]
    return out


class _Mem:
    """A dump's tokens / next / docs in memory, for mining before capture."""

    def __init__(self, docs: Sequence[CaptureDoc]):
        from exactedit.dumps import DocInfo

        self.docs, first, toks = [], 0, []
        for d in docs:
            self.docs.append(DocInfo(d.name, first, int(d.tokens.size), d.source, d.character, d.tags))
            toks.append(np.asarray(d.tokens, np.int32))
            first += d.tokens.size
        self.tokens = np.concatenate(toks) if toks else np.zeros(0, np.int32)
        self.next = np.append(self.tokens[1:], -1).astype(np.int32)
        for d in self.docs:
            self.next[d.stop - 1] = -1

    def doc_index(self):
        out = np.zeros(self.tokens.size, np.int32)
        for i, d in enumerate(self.docs):
            out[d.first_row:d.stop] = i
        return out


def chunk_texts(texts: Sequence[Path], engine: LlamaEngine, chat, chunk: int) -> list[CaptureDoc]:
    docs = []
    for p in texts:
        text = decode_utf8(read_regular(p, MAX_TEXT_BYTES, EngineError, "text"), p, EngineError, "text")
        toks = engine.tokenize(text, parse_special=False)
        for k, a in enumerate(range(0, toks.size, chunk)):
            part = toks[a:a + chunk]
            if part.size >= 2:
                docs.append(labelled(chat, f"text-{short_hash(text)}-{k}", part, source=p.name,
                                     character=f"t-{short_hash(text)}-{k}", tags=(), kind="plain"))
    return docs


def text_sets(text_docs: Sequence, with_uses) -> dict[str, list]:
    """Where the text chunks go: those with a legitimate use of a banned word (indices in
    `with_uses`) in turn to collateral (bar (d)), train (the null space) and anchors; the rest to
    anchors. Order is kept within each set."""
    out = {"collateral": [], "train": [], "anchors": []}
    used = [d for k, d in enumerate(text_docs) if k in with_uses]
    for j, d in enumerate(used):
        out[("collateral", "train", "anchors")[j % 3]].append(d)
    out["anchors"] += [d for k, d in enumerate(text_docs) if k not in with_uses]
    return out


def _retag(d: CaptureDoc, *tags: str) -> CaptureDoc:
    return CaptureDoc(d.name, d.tokens, d.source, d.character, tuple(dict.fromkeys((*d.tags, *tags))), d.roles)


def build_dataset(model, prompts: Sequence[str], phrases: Sequence[str], out, *, texts: Sequence = (),
                  config: DatasetConfig | None = None, settings: EngineSettings | None = None,
                  overwrite: bool = False, progress: Progress | None = None) -> DatasetResult:
    cfg = config or DatasetConfig()
    settings = settings or EngineSettings()
    phrases = parse_phrases(list(phrases), "phrases")
    if len(prompts) < 2:
        raise EngineError(model, "prompts", f"need at least 2 prompts to split by prompt, got {len(prompts)}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise EngineError(out, "out", "exists (pass --overwrite to replace its dumps)")
    if cfg.chunk > settings.n_ctx:      # each chunk is captured whole: this failed after the sampling
        raise EngineError("DatasetConfig", "chunk", f"{cfg.chunk} tokens per text document, more than the "
                          f"context's n_ctx {settings.n_ctx} (each is captured whole): give a --chunk of at most "
                          f"{settings.n_ctx}, or a larger --n-ctx")
    if cfg.mine.sampling.max_new >= settings.n_ctx:
        raise EngineError("Sampling", "max_new", f"{cfg.mine.sampling.max_new} leaves no room for a prompt in the "
                          f"context of n_ctx {settings.n_ctx} tokens: give a smaller --max-new, or a larger --n-ctx")
    too_many = over_limits(0, len(prompts) * cfg.mine.samples, 0, 0)
    if too_many is not None:
        raise EngineError(out / "replies.json", "replies", f"{len(prompts)} prompts x {cfg.mine.samples} samples: "
                          f"{too_many}: `exactedit discover --model-text` would refuse to read it; give fewer "
                          "--samples or fewer prompts")
    chat = model_chat(model, fallback=cfg.mine.chat_fallback, template=cfg.mine.chat_template)
    groups = split_prompts(prompts, cfg)
    with LlamaEngine(model, settings) as engine:
        ptoks = [prompt_tokens(engine, chat.prompt(p), engine.bos_if_added()) for p in prompts]
        text_docs = chunk_texts([Path(t) for t in texts], engine, chat, cfg.chunk)
    with LlamaEngine(model, settings) as engine:
        gens = sample_replies(engine, reply_jobs(ptoks, cfg.mine), stop_ids=reply_stops(chat, engine),
                              turn_end=chat.specials.turn_end, progress=progress)
    samples = by_prompt(gens, cfg.mine.samples)
    set_of = {i: PROMPT_SETS[g] for g, idx in groups.items() for i in idx}
    records = [{**reply_record("base", x, prompts), "set": set_of[x.prompt]} for x in reply_infos(prompts, samples, chat)]
    replies_text = replies_json(records, out / "replies.json", "a smaller --max-new or --samples, or fewer prompts")
    del records                 # refused here, before any dump is captured, where discover would not read it
    replies: dict[int, list[CaptureDoc]] = {}
    for i, (p, row) in enumerate(zip(prompts, samples)):
        replies[i] = [labelled(chat, reply_name(p, s.seed), s.sequence, source="dataset", character=f"p-{short_hash(p)}",
                               tags=(), kind="chat") for s in row]
    sets: dict[str, list[CaptureDoc]] = {k: [] for k in SETS}
    for g, idx in groups.items():
        sets[PROMPT_SETS[g]] += [d for i in idx for d in replies[i]]
    probe = mine_dumps({"texts": _Mem(text_docs)}, phrases, chat.table, capitalized=cfg.mine.capitalized) if text_docs else None
    with_uses = set()
    if probe is not None:
        tm = probe.trace("texts")
        with_uses = {int(x) for x in _Mem(text_docs).doc_index()[tm.coll_rows]}
    for name, docs in text_sets(text_docs, with_uses).items():
        sets[name] += docs
    tags = {"train": ("slop",), "heldout": ("slop",), "collateral": ("collateral",), "anchors": ("anchor",)}
    trunc_of = {reply_name(prompts[i], s.seed): s.truncated for i, row in enumerate(samples) for s in row}
    summaries, warnings, minings = [], [], {}
    for name in SETS:
        docs = sets[name]
        if not docs:
            warnings.append(f"{name}: no documents (give more prompts{' or --texts' if name != 'train' else ''})")
            continue
        found = minings[name] = mine_dumps({name: _Mem(docs)}, phrases, chat.table, capitalized=cfg.mine.capitalized)
        tm = found.trace(name)
        per_doc = np.bincount(tm.doc, minlength=len(docs)) if tm.rows.size else np.zeros(len(docs), int)
        docs = [_retag(d, *(tags[name] if (name not in ("train", "heldout") or per_doc[k]) else ())) for k, d in enumerate(docs)]
        cap = capture_dump(model, docs, out / name, settings=settings, overwrite=overwrite,
                           extra_meta={"dataset": {"set": name, "phrases": list(phrases), "config": cfg.record()},
                                       "chat": chat.to_dict()})
        roles = np.concatenate([d.roles for d in docs])
        words = [chat.table.decode([w]) for w in found.words]
        s = SetSummary(name, str(cap.path), len(docs), cap.rows,
                       {t: sum(t in d.tags for d in docs) for t in sorted({t for d in docs for t in d.tags})},
                       {p["phrase"]: p["contexts"] for p in found.phrase_counts()},
                       {p["phrase"]: p["occurrences"] for p in found.phrase_counts()},
                       {w: int(np.sum(tm.coll_word == wi)) for wi, w in enumerate(words)},
                       int(np.count_nonzero(roles & ROLE_REPLY_END)), sum(trunc_of.get(d.name, False) for d in docs))
        summaries.append(s)
        warnings += _warn(s)
    res = DatasetResult(out, {g: [short_hash(prompts[i]) for i in idx] for g, idx in groups.items()},
                        tuple(summaries), tuple(warnings), chat.to_dict(), minings)
    atomic_write_text(out / "replies.json", replies_text)
    atomic_write_text(out / "dataset.json", json.dumps(res.to_dict(), indent=1) + "\n")
    return res


def _warn(s: SetSummary) -> list[str]:
    out = []
    if s.name in ("train", "heldout"):
        bar = "(a)" if s.name == "train" else "(c)"
        out += [f"{s.name}: {n} slop contexts of {p!r} (< {MIN_CONTEXTS}: bar {bar} stands on little)"
                for p, n in s.contexts.items() if n < MIN_CONTEXTS]
    if s.name == "heldout" and s.turn_ends < MIN_TURN_ENDS:
        out.append(f"heldout: {s.turn_ends} complete turn ends (< {MIN_TURN_ENDS}: bar (f)'s turn-end check "
                   "stands on little; raise --max-new)")
    if s.name == "collateral":
        out += [f"collateral: {n} legitimate uses of {w!r} (< {MIN_USES}: bar (d) for this word stands on little)"
                for w, n in s.uses.items() if n < MIN_USES]
    if s.name == "anchors":
        if s.rows < MIN_ANCHOR_ROWS:
            out.append(f"anchors: {s.rows} rows (< {MIN_ANCHOR_ROWS}: the special-token holds and bar (e) stand on little)")
        for t in ("chat", "plain"):
            if not s.tags.get(t):
                out.append(f"anchors: no {t!r} document" + (" (give --texts)" if t == "plain" else ""))
    return out


def render_dataset(r: DatasetResult) -> str:
    out = [f"dataset in {r.out}: prompts " + ", ".join(f"{k} {len(v)}" for k, v in r.prompts.items())]
    for s in r.sets:
        out.append(f"  {s.name:10} {s.docs:4} docs {s.rows:7} rows  tags "
                   + ", ".join(f"{t} {n}" for t, n in s.tags.items()) + f"  turn ends {s.turn_ends}, cut {s.truncated}")
        out.append("             slop contexts / occurrences: "
                   + ", ".join(f"{p!r} {s.contexts[p]}/{s.occurrences[p]}" for p in s.contexts))
        out.append("             legitimate uses: " + (", ".join(f"{w!r} {n}" for w, n in s.uses.items()) or "none"))
    out += [f"warning: {w}" for w in r.warnings]
    return "\n".join(out)
