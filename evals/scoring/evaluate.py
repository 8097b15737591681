"""Score a model, an edited model and/or shaping rules on dumps: RowScores, then the bars.

For each scored document, rows are taken in chunks: the tail forward gives `mix` for the base and
the edited model (`solvers.tail.logits.tail_mix`), one streaming head pass per model gives full-vocabulary
logits of the chunk, the shaping rules (if any) change the edited logits, and `rows_from_logits`
(float64) reduces both to RowScores. Only the documents whose role the run may read are touched:
train, the held-out role, anchors and collateral (never test in a dev run, never blind outside the
blind run). KL statistics in llama.cpp's form come from `evals.kl.stats.kld_stats`, per role and at each
shaping rule's triggers.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from exactedit.solvers.shaping import rules as shaping
from exactedit.errors import ExacteditError
from exactedit.evals.scoring.bars import BarContext, anti_slop_bars, per_phrase, persona_bars, same_doc_mask, verdict
from exactedit.evals.kl.stats import kld_stats
from exactedit.solvers.tail.passes.kl_pass import KlRows
from exactedit.evals.protocol.protocol import Protocol, ResolvedTokens, resolve_tokens
from exactedit.evals.scoring.report import BarReport
from exactedit.solvers.tail.scores import DocMeta, RowScores, concat, rows_from_logits
from exactedit.evals.protocol.splits import Splits

Progress = Callable[[int, int], None]
BAR_SETS = ("anti-slop", "persona", "all")


class EvalError(ExacteditError):
    """A scoring run cannot proceed with these inputs."""


@dataclass(frozen=True)
class ScoreConfig:
    """What one scoring run computes. `shapes` are `--shape` specs (prefix-penalty=B,
    step0-guard=B, persona-case); documents tagged `persona_tag` have the persona active."""

    heldout_role: str = "dev"
    bars: str = "anti-slop"
    shapes: tuple[str, ...] = ()
    persona_tag: str = "style"
    chunk_rows: int = 128       # rows per chunk where full [rows, V] logits are formed (shaping)
    fast_rows: int = 2048       # rows per head pass on the numba KL path (no [rows, V] array)
    tile_rows: int = 8192

    def __post_init__(self):
        if self.heldout_role not in ("dev", "test", "blind"):
            raise ValueError(f"heldout_role must be dev, test or blind, got {self.heldout_role!r}")
        if self.bars not in BAR_SETS:
            raise ValueError(f"bars must be one of {BAR_SETS}, got {self.bars!r}")
        if min(self.chunk_rows, self.fast_rows, self.tile_rows) < 1:
            raise ValueError("chunk_rows, fast_rows and tile_rows must be >= 1")
        names = [shaping.parse_shape(s)[0] for s in self.shapes]
        if len(set(names)) != len(names):
            raise ValueError(f"each shaping rule may be given once, got {list(self.shapes)}")


@dataclass(frozen=True)
class TraceInput:
    """A dump to score and the role of each of its documents (documents not listed are skipped)."""

    name: str
    path: Path
    roles: Mapping[str, str]
    domain: str = ""


@dataclass(frozen=True)
class KnownRows:
    """Rows already scored exactly, by the same pass `score_traces` makes, for the same base model
    and edit: `solve wfld`'s rescore of the bundle it wrote (solvers.l47.rescore.rescore_parts:
    the tail forward of each side from the dump, one numba KL pass over the shared head). `dumps`:
    a dump's sha256 -> RowScores of its every row in order. A caller hands them on only where it
    holds both in one process; `score_traces` checks the model, `runs.eval.workflow.score` the
    bundle, and each dump's rows, tokens and special tokens."""

    model_sha256: str
    bundle_sha256: str
    dumps: Mapping[str, RowScores]


@dataclass(frozen=True)
class Scored:
    report: BarReport
    scores: RowScores
    triggers: Mapping[str, np.ndarray]
    dump_sha256: Mapping[str, str]


def readable_roles(heldout_role: str) -> tuple[str, ...]:
    return ("train", heldout_role, "anchors", "collateral")


def protocol_traces(protocol: Protocol, splits: Splits, heldout_role: str) -> tuple[TraceInput, ...]:
    """The protocol's traces with the documents a run for `heldout_role` may read."""
    allowed = set(readable_roles(heldout_role))
    out = []
    for t in protocol.traces:
        roles = {d.doc: d.role for d in splits.docs if d.trace == t.name and d.role in allowed}
        if roles:
            out.append(TraceInput(t.name, t.path, roles, t.domain))
    return tuple(out)


def token_texts(tail) -> tuple[str, ...]:
    """Each id of the model's table as decoded text (special tokens as their names)."""
    return tuple(tail.tokens.piece(i) for i in range(tail.spec.vocab))


def shape_vocab(texts: Sequence[str]) -> shaping.ShapeVocab:
    try:
        return shaping.ShapeVocab.from_texts(texts)
    except ValueError as exc:
        raise EvalError(f"--shape: {exc}") from None


def build_rules(shapes: Sequence[str], texts: Sequence[str], tokens: ResolvedTokens,
                persona_docs: Sequence[bool]) -> tuple[shaping.Rule, ...]:
    vocab = shape_vocab(texts)
    rules = []
    for spec in shapes:
        name, bias = shaping.parse_shape(spec)
        if name == "prefix-penalty":
            rules.append(shaping.PrefixPenalty(bias, tokens.phrases))
        elif name == "step0-guard":
            rules.append(shaping.Step0Guard(bias, tuple(t for t in (vocab.think_open, *vocab.turn_end)
                                                         if t is not None)))
        else:
            rules.append(shaping.PersonaCase(shaping.case_pairs(texts), tuple(persona_docs)))
    return tuple(rules)


def _full_logits(tail, mix: np.ndarray, tile_rows: int) -> np.ndarray:
    from exactedit.solvers.tail.logits import head_pass

    out = np.empty((mix.shape[0], tail.spec.vocab), dtype=np.float32)

    def sink(a, b, tile):
        out[:, a:b] = tile

    head_pass(tail, mix, tile_rows=tile_rows, sink=sink)
    return out


def same_head(tail, tail2) -> bool:
    """Whether two tails' heads are the same bytes (read tile by tile: a head is never loaded whole)."""
    h1, h2 = tail.head, tail2.head
    if h1 is h2:
        return True
    if (h1.qtype, h1.rows, h1.cols, h1.runtime) != (h2.qtype, h2.rows, h2.cols, h2.runtime):
        return False
    step = 8192
    return all(np.array_equal(h1.read_raw(a, min(a + step, h1.rows)), h2.read_raw(a, min(a + step, h1.rows)))
               for a in range(0, h1.rows, step))


def rows_fast(tail, mix_b, mix_e, tokens, next_tokens, roles, doc, special_ids, docs, tile_rows: int) -> RowScores:
    """`rows_from_logits` of one chunk through the numba KL pass over the one head both sides
    share (solvers/tail/passes/kl_pass_numba.py, checked against the numpy reference in
    tests/solvers/tail/test_kl_pass.py); never a [rows, V] logits array."""
    from exactedit.solvers.l47.rescore import special_probs
    from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba

    nxt = np.asarray(next_tokens, dtype=np.int32)
    r = kl_rows_numba(mix_b, mix_e, tail.head, next_ids=nxt, softcap=tail.softcap, tile_rows=tile_rows)
    sp = [int(x) for x in special_ids]
    p_b, p_e = special_probs(tail, mix_b, mix_e, r, sp)
    nan = np.where(nxt >= 0, 0.0, np.nan)
    return RowScores(
        tokens=np.asarray(tokens, np.int32), next=nxt, roles=np.asarray(roles, np.uint8), doc=np.asarray(doc, np.int32),
        logp_base=np.asarray(r.logp_next_base, np.float64) + nan, logp_edit=np.asarray(r.logp_next_edited, np.float64) + nan,
        kl=np.maximum(r.kl, 0.0), argmax_base=r.argmax_base.astype(np.int32), argmax_edit=r.argmax_edited.astype(np.int32),
        special_ids=tuple(sp), p_special_base=p_b, p_special_edit=p_e, selected_ids=(),
        logp_sel_base=np.zeros((nxt.size, 0)), logp_sel_edit=np.zeros((nxt.size, 0)), docs=tuple(docs))


def _known_rows(have: RowScores, t: TraceInput, d, docs, specials, metas) -> RowScores:
    """The listed documents' rows of a dump scored already (KnownRows), as `rows_fast` gives them."""
    if have.rows != d.rows or not np.array_equal(have.tokens, np.asarray(d.tokens, np.int32)):
        raise EvalError(f"{t.path}: the rows handed in for this dump are not its rows ({have.rows} vs {d.rows})")
    if have.special_ids != tuple(int(x) for x in specials):
        raise EvalError(f"{t.path}: the rows handed in score special tokens {list(have.special_ids)}, "
                        f"the protocol's are {list(specials)}")
    rows = np.concatenate([np.arange(doc.first_row, doc.stop) for doc in docs])
    part = have.take(rows, np.concatenate([np.full(doc.stop - doc.first_row, di) for di, doc in enumerate(docs)]),
                     metas)
    nan = np.where(part.next >= 0, 0.0, np.nan)
    return replace(part, logp_base=part.logp_base + nan, logp_edit=part.logp_edit + nan)


def _batches(spans, limit: int):
    """Consecutive (doc, start, stop) spans grouped so each group has at most `limit` rows (a span
    is never split; each is at most `limit` rows already)."""
    group, size = [], 0
    for sp in spans:
        n = sp[2] - sp[1]
        if group and size + n > limit:
            yield group
            group, size = [], 0
        group.append(sp)
        size += n
    if group:
        yield group


def score_traces(protocol: Protocol, model, traces: Sequence[TraceInput], config: ScoreConfig, *,
                 edited=None, splits: Splits | None = None, meta: Mapping | None = None, marker: str = "",
                 kind: str = "score", cache=None, known: KnownRows | None = None,
                 progress: Progress | None = None) -> Scored:
    """RowScores of `edited` (a GGUF path; None: the base itself) plus `config.shapes` against
    `model`, on the listed documents of `traces`, and the bars of `config.bars`. Every dump's field
    hashes are verified (`cache`, a dumps.VerifyCache the caller owns, skips dumps it verified).
    `known`: rows the caller already scored for this model and `edited` (KnownRows): a dump it
    holds is read from there instead of a second pass (without shaping rules only)."""
    from exactedit.dumps import read_dump
    from exactedit.quant import gguf
    from exactedit.solvers.tail.logits import tail_mix
    from exactedit.solvers.tail.model import load_tail

    g = gguf.open(model)
    tail = load_tail(g)
    g2 = gguf.open(edited) if edited is not None else None
    tail2 = load_tail(g2) if g2 is not None else tail
    if (tail2.spec.vocab, tail2.spec.n) != (tail.spec.vocab, tail.spec.n):
        raise EvalError(f"{edited}: the edited model's vocabulary or width differs from {model}'s")
    texts = token_texts(tail)
    tokens = resolve_tokens(protocol, texts)
    # no shaping and the same head bytes (a last-layer edit, or no edit): the numba KL pass
    fast = not config.shapes and same_head(tail, tail2)
    if known is not None and known.model_sha256 != g.sha256():
        raise EvalError(f"{model}: the rows handed in were scored for another model (sha256 {known.model_sha256[:12]}...)")
    dumps = [(t, read_dump(t.path, expect=tail.dump_expect(), cache=cache)) for t in traces]
    total = sum(doc.rows for t, d in dumps for doc in d.docs if doc.name in t.roles)
    done, parts, triggers = 0, [], {}
    for t, d in dumps:
        docs = [doc for doc in d.docs if doc.name in t.roles]
        metas = [DocMeta(doc.name, t.name, t.roles[doc.name], doc.source, doc.character, doc.tags, t.domain)
                 for doc in docs]
        persona = [config.persona_tag in doc.tags for doc in d.docs]
        rules = build_rules(config.shapes, texts, tokens, persona) if config.shapes else ()
        all_tokens = np.asarray(d.tokens)
        doc_of_row = d.doc_index()
        state = (shaping.trigger_state(all_tokens, [doc.first_row for doc in d.docs], shape_vocab(texts))
                 if rules else None)
        roles = np.asarray(d.roles) if d.roles is not None else np.zeros(d.rows, np.uint8)
        chunks = []
        nxt = np.asarray(d.next)
        have = known.dumps.get(d.sha256()) if known is not None and fast and docs else None
        if have is not None:
            chunks.append(_known_rows(have, t, d, docs, tokens.specials, metas))
            done += chunks[-1].rows
            if progress is not None:
                progress(done, total)
        elif fast:
            # rows of several documents share one head pass (the head is dequantized once per pass)
            step = config.fast_rows
            for spans in _batches([(di, a, min(a + step, doc.stop)) for di, doc in enumerate(docs)
                                   for a in range(doc.first_row, doc.stop, step)], step):
                rows = np.concatenate([np.arange(a, b) for _, a, b in spans])
                mix_b = np.concatenate([tail_mix(tail, d, (a, b)) for _, a, b in spans])
                mix_e = mix_b if tail2 is tail else np.concatenate([tail_mix(tail2, d, (a, b)) for _, a, b in spans])
                doc_ids = np.concatenate([np.full(b - a, di) for di, a, b in spans])
                chunks.append(rows_fast(tail, mix_b, mix_e, all_tokens[rows], nxt[rows], roles[rows],
                                        doc_ids, tokens.specials, metas, config.tile_rows))
                done += rows.size
                if progress is not None:
                    progress(done, total)
        else:
            for di, doc in enumerate(docs):
                for a in range(doc.first_row, doc.stop, config.chunk_rows):
                    b = min(a + config.chunk_rows, doc.stop)
                    lb = _full_logits(tail, tail_mix(tail, d, (a, b)), config.tile_rows)
                    le = lb if tail2 is tail else _full_logits(tail2, tail_mix(tail2, d, (a, b)), config.tile_rows)
                    if rules:
                        le = shaping.shape_logits(rules, le, np.arange(a, b), all_tokens, doc_of_row, state)
                    chunks.append(rows_from_logits(lb, le, all_tokens[a:b], nxt[a:b], roles[a:b],
                                                   np.full(b - a, di), tokens.specials, (), metas))
                    done += b - a
                    if progress is not None:
                        progress(done, total)
        if not chunks:
            continue
        parts.append(concat(chunks, chunks=True))
        kept = np.concatenate([np.arange(doc.first_row, doc.stop) for doc in docs])
        for rule in rules:
            m = shaping.trigger_mask(rule, all_tokens, doc_of_row, state)[kept]
            triggers[rule.name] = np.concatenate([triggers.get(rule.name, np.zeros(0, bool)), m])
    if not parts:
        raise EvalError("no documents to score: the split gives this run no readable document")
    scores = concat(parts, chunks=False)
    dump_sha = {t.name: d.sha256() for t, d in dumps}
    ctx = BarContext(tokens, protocol.bars, config.heldout_role,
                     same_doc_mask(scores, splits, tokens.phrases, dump_sha) if splits is not None else None, texts)
    rows = ()
    if config.bars in ("anti-slop", "all"):
        rows += anti_slop_bars(scores, ctx)
    if config.bars in ("persona", "all"):
        rows += persona_bars(scores, ctx)
    info = {"model": str(model), "model_sha256": g.sha256(), "edited": str(edited) if edited else "",
            "edited_sha256": g2.sha256() if g2 is not None else "", "shapes": list(config.shapes),
            "protocol": str(Path(protocol.path).resolve()), "protocol_sha256": protocol.sha256,
            **{f"dump:{k}": v for k, v in dump_sha.items()}, **(meta or {})}
    report = BarReport(kind, config.heldout_role, rows, verdict(rows), per_phrase(scores, ctx),
                       kl_summary(scores, triggers), info, marker)
    return Scored(report, scores, triggers, dump_sha)


def kl_summary(scores: RowScores, triggers: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """llama.cpp-form KL statistics per document role, and at each shaping rule's trigger rows."""
    roles = scores.doc_roles()
    scopes = {f"role {r}": roles == r for r in dict.fromkeys(roles)}
    scopes.update({f"triggers {name}": m for name, m in triggers.items()})
    out = {}
    for name, m in scopes.items():
        if not m.any():
            continue
        nan = np.full(int(m.sum()), np.nan)
        r = KlRows(scores.kl[m], scores.argmax_base[m], scores.argmax_edit[m], nan, nan,
                   scores.logp_base[m], scores.logp_edit[m])
        out[name] = kld_stats(r).to_dict()
    return out
