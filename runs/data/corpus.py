"""`exactedit dataset corpus`: teacher-forced windows of an offline corpus around each use of the
banned phrases' final tokens, without sampling (prefill is cheap where generation is not).

1. The corpus, looked through where the words live, in this order of preference: the caller's
   plain text files (one source document each, by file name), the bundled general-English corpus
   (runs/bundled/english/: 40 documents of ordinary prose in as many registers, written for
   exactedit, `english:01-letter.txt`) and the docstrings of the Python standard library
   (module, class and function docstrings, one source document per file, `stdlib:json/decoder.py`;
   prose in a programming register) with the language reference's prose that pydoc ships
   (pydoc_data/topics.py, one source document per topic); read offline, in sorted order, bounded
   in size.
2. The words: token ids, by default the phrases' final tokens as `solve wfld`'s mining finds them
   (`phrase_words`: the fewest-token form after a space). Each document is tokenized by the
   model; a row whose next token is a word is a *use*, unless the shared phrase matcher
   (solvers/phrases.py) finds a phrase's prefix ending there (a slop context, no use).
3. The split, by source document (never by window): a seeded order of their hashes, cut by the
   shares into `solve` (the rows the solve may hold), `dev` (choosing the edit's strength) and
   `collateral` (held out for bar (d)).
4. The budget: each part gets its share of `max_tokens` prefill tokens, spent round-robin over the
   words, so a rare word is not starved; each word's uses are taken by the source's rank (the
   caller's texts, then general English, then the stdlib), in a seeded hash order within a rank.
   A use becomes a window of `context` tokens ending at its row, the word itself and `after`
   tokens past it; overlapping windows of a document merge (up to `max_window` tokens).
5. Each window is one CaptureDoc (`plain`, tagged `corpus`, source the document's identity, one
   character per source document) and each part one rmsnorm dump, captured without keeping the
   engine's logits; `corpus.json` records per part the dump, windows, rows, uses per word (counted
   inside the windows, as mining the dump will count them), the windows taken per word, the uses
   per word by source kind, and the source documents.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import sysconfig
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.native.llamacpp.capture import Capturer
from exactedit.native.llamacpp.chat import model_chat, short_hash
from exactedit.native.llamacpp.documents import labelled
from exactedit.native.llamacpp.engine import EngineError, EngineSettings
from exactedit.files import MAX_TEXT_BYTES, atomic_write_text, decode_utf8, read_regular
from exactedit.solvers.phrases import PhraseMatcher, TokenBytes, parse_phrases
from exactedit.solvers.l47.mining import mine

Progress = Callable[[int, int], None]
PARTS = ("solve", "dev", "collateral")
SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"})
MAX_FILE_BYTES = 1_000_000      # a stdlib source file larger than this is skipped
MAX_DOC_CHARS = 20_000          # one docstring is cut here
ENGLISH_DIR = Path(__file__).resolve().parents[1] / "bundled" / "english"
# a source's rank: the order in which a word's uses are taken (the caller's texts first)
RANKS = {"text": 0, "english": 1, "stdlib": 2}
# MAX_TEXT_BYTES (exactedit.files): a caller's text file larger than this is refused


@dataclass(frozen=True)
class CorpusConfig:
    max_tokens: int = 12_000
    context: int = 48
    after: int = 8
    max_window: int = 512
    seed: int = 0
    solve: float = 0.5
    dev: float = 0.25
    collateral: float = 0.25
    stdlib: bool = True
    english: bool = True
    capitalized: bool = True
    chat_fallback: str | None = None      # the framing when the model's template is refused (native.llamacpp.chat)
    chat_template: str | None = None      # a Jinja2 chat template file, used instead of the model's (native.llamacpp.chat)

    def __post_init__(self):
        for key, low in (("context", 1), ("after", 0), ("max_tokens", 1)):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise EngineError("CorpusConfig", key, f"expected an integer >= {low}, got {v!r}")
        if self.max_window < self.context + self.after + 1:
            raise EngineError("CorpusConfig", "max_window", f"expected >= context + after + 1 = "
                              f"{self.context + self.after + 1}, got {self.max_window}")
        shares = self.shares()
        if any(not 0 < s <= 1 for s in shares.values()) or abs(sum(shares.values()) - 1) > 1e-9:
            raise EngineError("CorpusConfig", "shares", f"solve, dev and collateral shares must be in (0, 1] "
                              f"and sum to 1, got {shares}")

    def shares(self) -> dict[str, float]:
        return {"solve": self.solve, "dev": self.dev, "collateral": self.collateral}


@dataclass(frozen=True)
class Source:
    """One source document of the corpus: its identity (the unit of the split), its text and its
    kind (a key of RANKS: where it comes from, which orders the taking of a word's uses)."""

    name: str
    text: str
    kind: str = "text"


# ---- the corpus -----------------------------------------------------------------------------------

def _clean(doc: str) -> str:
    """Light whitespace normalization: lines right-stripped, runs of blank lines as one, cut."""
    lines, blank = [], False
    for line in doc[:MAX_DOC_CHARS].splitlines():
        line = line.rstrip()
        if line or not blank:
            lines.append(line)
        blank = not line
    return "\n".join(lines).strip()


def docstrings(source: bytes) -> list[str] | None:
    """The module, class and function docstrings of Python source in walk order (None: it does not parse)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, kinds))
    return [c for c in (_clean(d) for d in docs if d) if c]


def stdlib_sources(root=None, *, max_file_bytes: int = MAX_FILE_BYTES) -> list[Source]:
    """The standard library's docstrings, one Source per `*.py` file that has any ("stdlib:" + its
    path below `root`, default sysconfig's stdlib), in sorted path order; directories in SKIP_DIRS,
    files over `max_file_bytes` and files that do not parse are skipped."""
    root = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    files = []
    for here, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        files += [Path(here) / n for n in names if n.endswith(".py")]
    out = []
    for p in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        try:
            if not p.is_file() or p.stat().st_size > max_file_bytes:
                continue
            data = p.read_bytes()
        except OSError:
            continue
        name = f"stdlib:{p.relative_to(root).as_posix()}"
        if name == "stdlib:pydoc_data/topics.py":       # the language reference's prose, one topic a source
            out += [Source(f"{name}#{k}", _clean(v), "stdlib") for k, v in _topics(data)]
            continue
        docs = docstrings(data)
        if docs:
            out.append(Source(name, "\n\n".join(docs), "stdlib"))
    return out


def _topics(source: bytes) -> list[tuple[str, str]]:
    """pydoc_data/topics.py's `topics` dict (the language reference's prose per topic) as (key,
    text) in key order, read from its syntax tree (string constants only; nothing executed)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "topics" and isinstance(node.value, ast.Dict)):
            pairs = [(k.value, v.value) for k, v in zip(node.value.keys, node.value.values)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)
                     and isinstance(v, ast.Constant) and isinstance(v.value, str)]
            return sorted((k, v) for k, v in pairs if v.strip())
    return []


def english_sources(root=None) -> list[Source]:
    """The bundled general-English corpus (runs/bundled/english/*.txt, or `root`): one Source per
    file, `english:` + its name, in name order."""
    root = Path(root if root is not None else ENGLISH_DIR)
    paths = sorted(p for p in root.glob("*.txt") if p.is_file())
    return [Source(f"english:{p.name}", s.text, "english") for p, s in zip(paths, text_sources(paths))]


def english_digest(root=None) -> str:
    """sha256 over the general-English corpus's file names and bytes (a run keyed by it redoes its
    corpus when the bundled corpus changes)."""
    h = hashlib.sha256()
    for s in english_sources(root):
        h.update(f"{s.name}\0{len(s.text)}\0{s.text}\0".encode())
    return h.hexdigest()


def corpus_sources(cfg: "CorpusConfig", texts: Sequence = (), *, stdlib_root=None, english_root=None) -> list[Source]:
    """The corpus of `cfg`: the caller's texts, then the general-English corpus (cfg.english), then
    the stdlib's docstrings (cfg.stdlib)."""
    return (text_sources(texts) + (english_sources(english_root) if cfg.english else [])
            + (stdlib_sources(stdlib_root) if cfg.stdlib else []))


def text_sources(paths: Sequence) -> list[Source]:
    """One Source per text file, named by its file name (a regular file of UTF-8, at most MAX_TEXT_BYTES)."""
    out, seen = [], set()
    for p in map(Path, paths):
        text = decode_utf8(read_regular(p, MAX_TEXT_BYTES, EngineError, "text"), p, EngineError, "text")
        if p.name in seen:
            raise EngineError(p, "text", f"another text is also named {p.name!r} (the name is its identity in the split)")
        seen.add(p.name)
        out.append(Source(p.name, text))
    return out


# ---- words, uses, windows -------------------------------------------------------------------------

def phrase_words(table, phrases: Sequence[str], *, capitalized: bool = True) -> tuple[int, ...]:
    """The phrases' final tokens as `solve wfld`'s mining names its words with nothing matched yet
    (each phrase's fewest-token form after a space); `table` a TokenTable (ModelChat.table)."""
    return mine({}, parse_phrases(list(phrases)), table, capitalized=capitalized).words


def scan(tokens, words: np.ndarray, matcher: PhraseMatcher) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(use rows, their word index into `words`, slop-context rows) of one token stream: rows whose
    next token is a word, split by whether the matcher finds a phrase ending there."""
    toks = np.asarray(tokens)
    rows = np.flatnonzero(np.isin(toks[1:], words))
    slop = np.array([t for t in rows if matcher.match_row(toks, int(t), int(toks[t + 1]), 0) is not None], np.int64)
    uses = np.setdiff1d(rows, slop).astype(np.int64)
    return uses, np.searchsorted(words, toks[uses + 1]).astype(np.int64), slop


def window(row: int, n: int, cfg: CorpusConfig) -> tuple[int, int]:
    """Token span [a, b) of the use at `row`: `context` tokens ending at it, the word and `after` more."""
    return max(0, row + 1 - cfg.context), min(n, row + 2 + cfg.after)


def merge(spans: Sequence[tuple[int, int]], max_len: int) -> list[tuple[int, int]]:
    """Overlapping or touching spans merged, none longer than `max_len` by merging (where a merge
    would be, the later span starts where the earlier ends: no token is in two spans)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            a0, b0 = out[-1]
            if max(b0, b) - a0 <= max_len:
                out[-1] = (a0, max(b0, b))
                continue
            a = b0
        if b > a:
            out.append((a, b))
    return out


def _length(spans) -> int:
    return sum(b - a for a, b in spans)


def split_sources(names: Sequence[str], cfg: CorpusConfig) -> dict[str, list[int]]:
    """Source indices per part: a seeded order of name hashes cut by the shares (largest remainder,
    each part at least one source when there are enough)."""
    order = sorted(range(len(names)), key=lambda i: hashlib.sha256(f"{cfg.seed}\0{names[i]}".encode()).hexdigest())
    n, shares = len(order), cfg.shares()
    count = _cut(n, shares)
    for k in PARTS[1:]:
        if count[k] == 0 and count["solve"] > 1:
            count[k], count["solve"] = 1, count["solve"] - 1
    out, at = {}, 0
    for k in PARTS:
        out[k] = sorted(order[at:at + count[k]])
        at += count[k]
    return out


def _cut(n: int, shares: dict[str, float]) -> dict[str, int]:
    exact = {k: v * n for k, v in shares.items()}
    count = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: (-(exact[k] - count[k]), PARTS.index(k)))[:n - sum(count.values())]:
        count[k] += 1
    return count


def select(uses: Sequence[Sequence[tuple[int, int]]], lengths: Sequence[int], budget: int,
           cfg: CorpusConfig) -> tuple[dict[int, list[tuple[int, int]]], list[int]]:
    """Windows within `budget` tokens, taken round-robin over the words: `uses[w]` lists word w's
    uses as (document, row) in the order to take them. A use inside a window already taken costs
    nothing; a word whose next window does not fit stops. Returns the merged spans per document
    and the windows taken per word."""
    spans: dict[int, list[tuple[int, int]]] = {}
    raw: dict[int, list[tuple[int, int]]] = {}
    at, taken, spent = [0] * len(uses), [0] * len(uses), 0
    active = [w for w in range(len(uses)) if uses[w]]
    while active:
        for w in list(active):
            while at[w] < len(uses[w]):
                doc, row = uses[w][at[w]]
                at[w] += 1
                if not any(a <= row and row + 1 < b for a, b in spans.get(doc, ())):
                    break
            else:
                active.remove(w)
                continue
            new = merge(raw.get(doc, []) + [window(row, lengths[doc], cfg)], cfg.max_window)
            cost = _length(new) - _length(spans.get(doc, ()))
            if spent + cost > budget:
                active.remove(w)
                continue
            raw.setdefault(doc, []).append(window(row, lengths[doc], cfg))
            spans[doc], spent, taken[w] = new, spent + cost, taken[w] + 1
    return spans, taken


def _key(seed: int, name: str, row: int) -> str:
    return hashlib.sha256(f"{seed}\0{name}\0{row}".encode()).hexdigest()


@dataclass(frozen=True)
class Part:
    name: str
    dump: str | None          # None: no window (nothing captured)
    budget: int
    windows: int
    rows: int
    uses: dict[str, int]      # word -> uses inside the windows
    slop_contexts: int        # rows inside the windows where a phrase's prefix ends before a word
    taken: dict[str, int]     # word -> windows taken for it
    sources: list[str]        # source documents with a window here
    assigned: int             # source documents split to this part
    by_kind: dict = None      # source kind (text, english, stdlib) -> word -> uses inside its windows


@dataclass(frozen=True)
class Plan:
    """What will be captured: the windows per part as CaptureDoc-ready token spans, and the counts."""

    parts: tuple[Part, ...]
    windows: dict[str, list[tuple[int, int, int]]]     # part -> (source index, a, b)
    corpus: dict


def plan(sources: Sequence[Source], tokens: Sequence[np.ndarray], words: dict[int, str], matcher: PhraseMatcher,
         cfg: CorpusConfig) -> Plan:
    """The split, the round-robin budget per part and the uses inside the chosen windows (pure:
    `tokens` are the sources' tokens, `words` token id -> display name)."""
    w = np.asarray(sorted(words), dtype=np.int64)
    names = [words[int(i)] for i in w]
    found = [scan(t, w, matcher) for t in tokens]
    groups = split_sources([s.name for s in sources], cfg)
    budgets = _cut(cfg.max_tokens, cfg.shares())
    parts, windows = [], {}
    for part in PARTS:
        cand = [sorted(((d, int(r)) for d in groups[part] for r, k in zip(found[d][0], found[d][1]) if k == wi),
                       key=lambda x: (RANKS.get(sources[x[0]].kind, len(RANKS)), _key(cfg.seed, sources[x[0]].name, x[1])))
                for wi in range(w.size)]
        spans, taken = select(cand, [len(t) for t in tokens], budgets[part], cfg)
        wins = [(d, a, b) for d in sorted(spans) for a, b in spans[d]]
        uses, slop = np.zeros(w.size, np.int64), 0
        kinds = {kind: np.zeros(w.size, np.int64) for kind in RANKS}
        for d, a, b in wins:
            u, k, s = scan(tokens[d][a:b], w, matcher)
            uses += np.bincount(k, minlength=w.size)
            kinds.setdefault(sources[d].kind, np.zeros(w.size, np.int64))
            kinds[sources[d].kind] += np.bincount(k, minlength=w.size)
            slop += s.size
        windows[part] = wins
        parts.append(Part(part, None, budgets[part], len(wins), sum(b - a for _, a, b in wins),
                          dict(zip(names, map(int, uses))), slop, dict(zip(names, taken)),
                          [sources[d].name for d in sorted(spans)], len(groups[part]),
                          {kind: dict(zip(names, map(int, n))) for kind, n in kinds.items() if n.any()}))
    corpus = {"sources": len(sources), "kinds": {k: sum(s.kind == k for s in sources) for k in RANKS},
              "tokens": int(sum(len(t) for t in tokens)),
              "uses": dict(zip(names, map(int, sum((np.bincount(f[1], minlength=w.size) for f in found),
                                                   np.zeros(w.size, np.int64))))),
              "slop_contexts": int(sum(f[2].size for f in found))}
    return Plan(tuple(parts), windows, corpus)


# ---- the build ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CorpusResult:
    out: Path
    words: dict[str, int]           # display name -> token id
    corpus: dict                    # the whole corpus: sources, tokens, uses per word, slop contexts
    parts: tuple[Part, ...]
    warnings: tuple[str, ...]
    config: dict
    chat: dict

    def to_dict(self) -> dict:
        return {"out": str(self.out), "words": self.words, "corpus": self.corpus,
                "parts": [asdict(p) for p in self.parts], "warnings": list(self.warnings),
                "config": self.config, "chat": self.chat}


def build_corpus(model, phrases: Sequence[str], out, *, texts: Sequence = (), words: Sequence[int] | None = None,
                 config: CorpusConfig | None = None, settings: EngineSettings | None = None,
                 stdlib_root=None, english_root=None, overwrite: bool = False, progress: Progress | None = None) -> CorpusResult:
    """Tokenize the corpus, choose the windows (`plan`) and capture one dump per part under `out`
    (solve/, dev/, collateral/) with `corpus.json` beside them. `words` default to `phrase_words`."""
    cfg = config or CorpusConfig()
    settings = settings or EngineSettings()
    phrases = parse_phrases(list(phrases), "phrases")
    out = Path(out)
    if out.exists() and not overwrite:
        raise EngineError(out, "out", "exists (pass --overwrite to replace its dumps)")
    if cfg.max_window > settings.n_ctx:
        raise EngineError("CorpusConfig", "max_window", f"{cfg.max_window} exceeds the engine's n_ctx {settings.n_ctx}")
    sources = corpus_sources(cfg, texts, stdlib_root=stdlib_root, english_root=english_root)
    if not sources:
        raise EngineError(out, "corpus", "no source documents (the stdlib and general English are off and no texts "
                          "were given)")
    chat = model_chat(model, fallback=cfg.chat_fallback, template=cfg.chat_template)
    ids = tuple(sorted({int(x) for x in (words if words is not None else
                                          phrase_words(chat.table, phrases, capitalized=cfg.capitalized))}))
    if not ids:
        raise EngineError(model, "words", f"the phrases {list(phrases)} have no final token to find uses of")
    if ids[0] < 0 or ids[-1] >= len(chat.table):
        raise EngineError(model, "words", f"token ids must lie in [0, {len(chat.table)}), got {list(ids)}")
    names = _names(chat.table, ids)
    with Capturer(model, settings) as capturer:      # the model read, hashed and loaded once for every part
        tokens = [capturer.engine.tokenize(s.text, parse_special=False) for s in sources]
        matcher = PhraseMatcher(phrases, TokenBytes(chat.table), cfg.capitalized)
        p = plan(sources, tokens, names, matcher, cfg)
        total, done, parts, warns = sum(x.rows for x in p.parts), 0, [], []
        for part in p.parts:
            docs = [labelled(chat, f"corpus-{short_hash(sources[d].name)}-{a}", tokens[d][a:b],
                             source=sources[d].name, character=f"c-{short_hash(sources[d].name)}", tags=("corpus",),
                             kind="plain")
                    for d, a, b in p.windows[part.name]]
            if not docs:
                warns.append(f"{part.name}: no window (no use of the words in its {part.assigned} source documents)")
                parts.append(part)
                continue
            tick = None if progress is None else (lambda d, _t, base=done: progress(base + d, total))
            cap = capturer.dump(docs, out / part.name, overwrite=overwrite, progress=tick, keep_logits=False,
                                extra_meta={"corpus": {"part": part.name, "phrases": list(phrases), "words": list(ids),
                                                       "config": asdict(cfg)}, "chat": chat.to_dict()})
            done += cap.rows
            parts.append(Part(**{**asdict(part), "dump": str(cap.path)}))
            warns += [f"{part.name}: {n} uses of {w!r} (fewer than 10)" for w, n in part.uses.items() if n < 10]
    res = CorpusResult(out, {n: i for i, n in names.items()}, p.corpus, tuple(parts), tuple(warns),
                       {**asdict(cfg), "texts": [str(t) for t in texts], "phrases": list(phrases)}, chat.to_dict())
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "corpus.json", json.dumps(res.to_dict(), indent=1) + "\n")
    return res


def _names(table, ids: Sequence[int]) -> dict[int, str]:
    """token id -> its text, made unique (a repeat gets its id appended)."""
    out: dict[int, str] = {}
    for i in ids:
        name = table.decode([i])
        out[i] = name if name not in out.values() else f"{name}#{i}"
    return out


def render_corpus(r: CorpusResult) -> str:
    c = r.corpus
    out = [f"corpus in {r.out}: {c['sources']} source documents, {c['tokens']} tokens; uses "
           + ", ".join(f"{w!r} {n}" for w, n in c["uses"].items()) + f"; slop contexts {c['slop_contexts']}"]
    for p in r.parts:
        out.append(f"  {p.name:10} {len(p.sources):4}/{p.assigned} sources {p.windows:5} windows {p.rows:7} rows "
                   f"(budget {p.budget})  uses " + ", ".join(f"{w!r} {n}" for w, n in p.uses.items())
                   + f"  slop contexts {p.slop_contexts}")
    out += [f"warning: {w}" for w in r.warnings]
    return "\n".join(out)
