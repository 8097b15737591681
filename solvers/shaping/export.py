"""`exactedit shape export`: the prefix penalties of compiled rules as other engines' phrase bans.

A prefix penalty (solvers.shaping.rules.PhrasePenalty) subtracts a finite bias from a phrase's final
token ("you can" + " use") where the text written so far in the reply ends with the phrase's prefix
as written or Capitalized, starting at a word boundary, in any tokenization, in open text only.
Each format keeps part of that (docs/rules-where.md says what each engine does with it):

    vllm            {"bad_words": [...]}: a vLLM request body fragment (SamplingParams.bad_words): the
                    phrase's forms as text; vLLM tokenizes each (as written and with a leading space)
                    and sets the last token's logit to -inf where the tokens before it were just
                    generated: a hard ban of the same final token after the canonical tokenization
    hf              {"sequence_bias": [[[ids], -bias], ...]}: transformers' `sequence_bias`, the same
                    final token at the same finite bias after each tokenization of the prefix the
                    compiled rules hold (its token pieces: merged starts " you", "(you" and bare
                    ones), fewest tokens first, at most `max_tokenizations` per form
    banned-strings  the phrases, one per line or a JSON list: koboldcpp `banned_tokens`, exllamav2 /
                    TabbyAPI `banned_strings`, ik_llama.cpp `--banned-string-file` (engines that hold
                    output back and, when a string completes, rewind to its first token and ban it)
    gbnf            a grammar for llama.cpp (solvers.shaping.gbnf) refusing every character that
                    completes a phrase's form after a word boundary: a hard ban with no rewind

The step-0 guard and the persona-case rule (biases at the reply's first token and at sentence
starts) are no phrase: no format takes them; the result lists them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from exactedit.errors import FieldError
from exactedit.solvers.shaping import gbnf

FORMATS = ("vllm", "hf", "banned-strings", "gbnf")
LIST_STYLES = ("lines", "json")
KOBOLD_MAX_BANS = 768        # koboldcpp's ban_token_max: entries past it are dropped without a word
VLLM_MAX_BAD_WORDS = 128     # vLLM's VLLM_MAX_NUM_BAD_WORDS default: token sequences after tokenization
MAX_TOKENIZATIONS = 16       # hf: entries per form of a phrase (transformers checks each at every step)

LOST = {
    "vllm": "a hard ban (-inf) instead of the finite bias; only the tokenizations vLLM's tokenizer gives the "
            "phrase (as written, and after a space), not every spelling of the prefix; generated tokens only",
    "hf": "the prefix's tokenizations past the cap, and the word boundary before a bare start; it also "
          "fires in the prompt, in think blocks, code and tool calls",
    "banned-strings": "the bias and the word boundaries: the engines fold case and ban the string anywhere, "
                      "rewinding to its first token (they catch more than the rule)",
    "gbnf": "the bias (a hard ban) and the rewind: the model must leave the phrase at its last character; "
            "it also applies in think blocks, code and tool calls",
}


class ExportError(FieldError):
    """Compiled rules cannot be exported in the format asked for."""


@dataclass(frozen=True)
class ExportConfig:
    """`list_style`: banned-strings as "lines" or a "json" list (None: by the output's suffix,
    .json a list); `case`: gbnf's patterns, "rules" (as written and Capitalized) or "fold" (every
    letter in either case); `max_states`: gbnf's automaton cap; `max_tokenizations`: hf's entries per
    form of a phrase."""

    format: str
    list_style: str | None = None
    case: str = "rules"
    max_states: int | None = None           # None: gbnf.MAX_STATES
    max_tokenizations: int | None = None    # None: MAX_TOKENIZATIONS

    def __post_init__(self):
        if self.max_states is None:
            object.__setattr__(self, "max_states", gbnf.MAX_STATES)
        if self.max_tokenizations is None:
            object.__setattr__(self, "max_tokenizations", MAX_TOKENIZATIONS)
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.list_style not in (None, *LIST_STYLES):
            raise ValueError(f"list style must be one of {', '.join(LIST_STYLES)}, got {self.list_style!r}")
        if self.case not in ("rules", "fold"):
            raise ValueError(f"case must be 'rules' or 'fold', got {self.case!r}")
        for key in ("max_states", "max_tokenizations"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class Phrase:
    """One phrase of a prefix penalty: its text, final token, bias and the rule's token pieces."""

    text: str
    final: int
    bias: float
    pieces: Mapping[int, bytes] = field(repr=False)


def penalty_phrases(compiled) -> tuple[tuple[Phrase, ...], tuple[str, ...]]:
    """(the phrases of every prefix penalty, in order, each once; the kinds of the other rules)."""
    from exactedit.solvers.shaping.rules import PhrasePenalty

    out: dict[str, Phrase] = {}
    other = []
    for r in compiled.rules:
        if isinstance(r, PhrasePenalty):
            for p in r.phrases:
                out.setdefault(p.text, Phrase(p.text, p.final, r.bias, r.pieces))
        else:
            other.append(r.name)
    return tuple(out.values()), tuple(dict.fromkeys(other))


def _forms(text: str) -> tuple[str, ...]:
    from exactedit.solvers.phrases import phrase_forms

    return phrase_forms(text, True)


# ---- vllm ----------------------------------------------------------------------------------------

def vllm_body(phrases: Sequence[Phrase]) -> tuple[dict, tuple[str, ...]]:
    """({"bad_words": the phrases' forms}, warnings)."""
    words = list(dict.fromkeys(f for p in phrases for f in _forms(p.text)))
    warn = ()
    if 2 * len(words) > VLLM_MAX_BAD_WORDS:
        warn = (f"{len(words)} bad words make up to {2 * len(words)} token sequences; vLLM refuses a request "
                f"with more than VLLM_MAX_NUM_BAD_WORDS ({VLLM_MAX_BAD_WORDS} by default): raise it in the "
                "server's environment",)
    return {"bad_words": words}, warn


# ---- hf ------------------------------------------------------------------------------------------

def prefix_tokenizations(prefix: bytes, pieces: Mapping[int, bytes], limit: int
                         ) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """(how many, the first `limit`) token sequences of `pieces` that spell `prefix` the way the
    rule matches it: the first token either starts the prefix exactly (bare) or ends with its start
    after a word boundary (merged: " you", "(you", "\\nHere"); the others spell it exactly. In order:
    fewest tokens, then a space-merged first token, a bare one, another merged one, then by ids."""
    from exactedit.solvers.phrases import ends_at_boundary

    n = len(prefix)
    index: dict[bytes, list[int]] = {}
    for i, b in sorted(pieces.items()):
        index.setdefault(b, []).append(i)
    widest = max((len(b) for b in index), default=1)
    ways = [0] * (n + 1)                 # segmentations of prefix[i:] into whole pieces
    least = [n + 1] * (n + 1)            # fewest pieces spelling prefix[i:]
    ways[n], least[n] = 1, 0
    for i in range(n - 1, -1, -1):
        for j in range(i + 1, min(n, i + widest) + 1):
            k = len(index.get(prefix[i:j], ()))
            if k:
                ways[i] += k * ways[j]
                least[i] = min(least[i], 1 + least[j])
    firsts = []                          # (kind, id, bytes of the prefix it spells)
    for b, ids in index.items():
        for k in range(1, min(len(b), n) + 1):
            if b[-k:] != prefix[:k]:
                continue
            if k == len(b):
                kind = 1
            elif ends_at_boundary(b[:-k]):
                kind = 0 if b[:-k] == b" " else 2
            else:
                continue
            firsts.extend((kind, i, k) for i in ids)
    firsts.sort()
    total = sum(ways[k] for _, _, k in firsts)

    def rest(i: int, m: int):
        if i == n:
            if m == 0:
                yield ()
            return
        if m < least[i] or n - i < m:
            return
        for j in range(i + 1, min(n, i + widest) + 1):
            for t in index.get(prefix[i:j], ()):
                for tail in rest(j, m - 1):
                    yield (t,) + tail

    out: list[tuple[int, ...]] = []
    for count in range(1, n + 1):
        for _, t, k in firsts:
            for tail in rest(k, count - 1):
                out.append((t,) + tail)
                if len(out) >= limit:
                    return total, tuple(out)
    return total, tuple(out)


def hf_sequence_bias(phrases: Sequence[Phrase], limit: int) -> tuple[dict, tuple[dict, ...], tuple[str, ...]]:
    """({"sequence_bias": [[prefix ids + [final], -bias], ...]}, per phrase {phrase, tokenizations,
    emitted}, warnings)."""
    from exactedit.solvers.phrases import split_last_word

    entries: dict[tuple[int, ...], float] = {}
    detail = []
    cut = 0
    for p in phrases:
        total = emitted = 0
        for form in _forms(p.text):
            prefix = split_last_word(form)[0].encode("utf-8")
            n, seqs = prefix_tokenizations(prefix, p.pieces, limit)
            total += n
            for s in seqs:
                if s + (p.final,) not in entries:
                    entries[s + (p.final,)] = -p.bias
                    emitted += 1
            cut += n > len(seqs)
        detail.append({"phrase": p.text, "tokenizations": total, "emitted": emitted})
    warn = (f"{cut} phrase forms have more tokenizations than --max-tokenizations {limit}: the rest are not "
            "biased",) if cut else ()
    body = {"sequence_bias": [[list(s), b] for s, b in entries.items()]}
    return body, tuple(detail), warn


# ---- banned strings ------------------------------------------------------------------------------

def banned_strings(phrases: Sequence[Phrase], style: str) -> tuple[str, int, tuple[str, ...]]:
    """(the file's text, entries, warnings): the phrases as written, one per line or a JSON list."""
    words = list(dict.fromkeys(p.text for p in phrases))
    warn = ()
    if len(words) > KOBOLD_MAX_BANS:
        warn = (f"{len(words)} strings: koboldcpp keeps the first {KOBOLD_MAX_BANS} of banned_tokens and drops "
                "the rest without a word; split the list or ban fewer phrases there",)
    if style == "json":
        text = json.dumps(words, ensure_ascii=False, indent=1) + "\n"
    else:
        text = "".join(w + "\n" for w in words)
    return text, len(words), warn


# ---- the command ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExportResult:
    format: str
    out: str
    out_sha256: str
    bytes: int
    rules: dict                      # the compiled rules file: path, sha256
    model: dict                      # the model they were compiled for
    phrases: int
    entries: int                     # bad words, sequences, strings, grammar states
    lost: str
    not_exported: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    states: int | None = None        # gbnf: the automaton's states (one rule each)
    detail: tuple[dict, ...] = ()    # hf: per phrase, its tokenizations and how many were emitted

    def to_dict(self) -> dict:
        return {"format": self.format, "out": self.out, "out_sha256": self.out_sha256, "bytes": self.bytes,
                "rules": self.rules, "model": self.model, "phrases": self.phrases, "entries": self.entries,
                "states": self.states, "lost": self.lost, "not_exported": list(self.not_exported),
                "warnings": list(self.warnings), "detail": list(self.detail)}


def list_style(out, given: str | None) -> str:
    """banned-strings' layout: the one given, else a JSON list for a .json output, else lines."""
    return given or ("json" if Path(out).suffix.lower() == ".json" else "lines")


def export_rules(rules, out, config: ExportConfig) -> ExportResult:
    """Read compiled rules (`exactedit shape compile`), write their prefix penalties to `out` in
    `config.format` (out.tmp, fsync, rename) and say what was written and what is lost."""
    from exactedit.files import atomic_write_text, file_sha256
    from exactedit.solvers.shaping.compiled import read_compiled

    compiled = read_compiled(rules)
    rules_sha = file_sha256(rules)
    phrases, other = penalty_phrases(compiled)
    if not phrases:
        raise ExportError(rules, "rules", "no prefix-penalty rule: nothing another engine can ban")
    fmt, detail, states = config.format, (), None
    if fmt == "vllm":
        body, warn = vllm_body(phrases)
        text, entries = json.dumps(body, ensure_ascii=False, indent=1) + "\n", len(body["bad_words"])
    elif fmt == "hf":
        body, detail, warn = hf_sequence_bias(phrases, config.max_tokenizations)
        text, entries = json.dumps(body) + "\n", len(body["sequence_bias"])
    elif fmt == "banned-strings":
        text, entries, warn = banned_strings(phrases, list_style(out, config.list_style))
    else:
        dfa = gbnf.exclusion(gbnf.patterns([p.text for p in phrases], config.case), config.max_states, str(rules))
        header = (f"exactedit shape export --format gbnf ({config.case} case): {len(phrases)} phrases of {rules} "
                  f"(sha256 {rules_sha[:16]}), compiled for {compiled.model.get('path', '?')}",
                  "refuses every character that completes a phrase after a word boundary (ASCII words)")
        text, entries, states, warn = gbnf.render_gbnf(dfa, header), dfa.states, dfa.states, ()
    atomic_write_text(out, text)
    data = text.encode("utf-8")
    return ExportResult(fmt, str(out), hashlib.sha256(data).hexdigest(), len(data),
                        {"path": str(rules), "sha256": rules_sha}, dict(compiled.model), len(phrases),
                        entries, LOST[fmt], other, tuple(warn), states, detail)


def render_export(r: ExportResult) -> str:
    what = {"vllm": "bad words", "hf": "sequences", "banned-strings": "strings", "gbnf": "grammar states"}[r.format]
    out = [f"wrote {r.out} ({r.bytes} bytes, sha256 {r.out_sha256[:12]}): {r.phrases} phrases as {r.entries} {what} "
           f"({r.format}) from {r.rules['path']}",
           f"  lost against the rule: {r.lost}"]
    if r.not_exported:
        out.append(f"  not exported (no phrase: no engine here takes it): {', '.join(r.not_exported)}")
    for d in r.detail:
        if d["emitted"] < d["tokenizations"]:
            out.append(f"  {d['phrase']!r}: {d['emitted']} of {d['tokenizations']} tokenizations biased")
    out += [f"  warning: {w}" for w in r.warnings]
    return "\n".join(out)
