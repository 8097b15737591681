"""`exactedit discover --model M.gguf`: discovered phrases in one model's tokenizer, and where to ban them.

Per phrase (evals/discover ranks them on text alone), from the model itself:
- `tokens`: the phrase's pieces in the model's tokenizer (llama.cpp's), written as inside running
  text (after a space);
- `final_one_token`: whether its last word is one token there; a prefix penalty lowers one token,
  and so does a WFLD edit, so a phrase whose last word is several tokens cannot be banned at it;
- `final_p`: the model's probability of the last word right after the prefix, averaged over up to
  `contexts` occurrences of the prefix in the model text, whatever followed it there (each reply
  after its prompt in the model's own chat template where the prompt is known, else the text
  alone), the word's tokens chained;
- `ban_phrase`: the suggested ban point. A last word the model gives with p >= `certain` after its
  prefix has no real alternative there: banning it would only force an odd continuation, and the
  decision was made one word earlier (measured on Qwen: " example" after "Here's an" at p 0.9997,
  so the ban is " an" after "Here's"). The ban point then moves to the prefix, when it still has
  two words; otherwise it is the phrase itself (`ban_note` says which and why).
`exactedit`'s phrase lists (`--phrases F.json`) take `ban_phrase` where it is set.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from exactedit.native.llamacpp.chat import model_chat, prompt_tokens
from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine
from exactedit.solvers.phrases import ban_text, phrase_forms, split_last_word

Progress = Callable[[int, int], None]
CONTEXT_CHARS = 600        # reply text kept before an occurrence (the prompt is always kept)
MAX_CONTEXT_TOKENS = 1024  # a context longer than this keeps its last tokens only
MAX_SCANNED = 10_000       # prefix occurrences looked at per phrase (the contexts spread over them)


@dataclass(frozen=True)
class Source:
    """One piece of model text, with the user prompt it answered when known (its chat framing)."""

    text: str
    prompt: str | None = None


def prefix_occurrences(phrase: str, sources: Sequence[Source], limit: int) -> list[tuple[int, int]]:
    """Up to `limit` (source index, offset right after it) of whole-word occurrences of the phrase's
    prefix (as written, or with a capital first letter), spread evenly over the first `MAX_SCANNED`
    found, whatever follows them: p(last
    word | prefix) is measured where the prefix was written, not only where the phrase was (that
    would count only the contexts that did continue)."""
    split = split_last_word(phrase)
    if split is None:
        return []
    alts = "|".join(re.escape(f) for f in phrase_forms(split[0], True))
    pat = re.compile(rf"(?<!\w)(?:{alts})(?!\w)")
    found = []
    for i, s in enumerate(sources):
        found += [(i, m.end()) for m in pat.finditer(s.text)]
        if len(found) >= MAX_SCANNED:
            break
    if len(found) <= limit:
        return found
    return [found[k] for k in np.unique(np.linspace(0, len(found) - 1, limit).round().astype(int))]


def _final_logp(engine: LlamaEngine, head: np.ndarray, word: np.ndarray) -> float:
    """log p(word's tokens | head), chained: one evaluation of head + word."""
    toks = np.concatenate([head, word]).astype(np.int32)[-MAX_CONTEXT_TOKENS:]
    logits = engine.evaluate(toks).logits.astype(np.float64)
    k = word.size
    rows = logits[-k - 1:-1]
    lse = np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1)) + rows.max(axis=1)
    return float(np.sum(rows[np.arange(k), word] - lse))


def annotate(model, phrases: Sequence[dict], sources: Sequence[Source], *, contexts: int = 4, template=None,
             certain: float = 0.9, settings: EngineSettings | None = None,
             progress: Progress | None = None) -> list[dict]:
    """Each phrase entry (a dict with "phrase") with `tokens`, `final_one_token`, `final_p`,
    `contexts`, `ban_phrase` and `ban_note` added (see the module doc)."""
    chat = model_chat(model, template=template)
    out = []
    with LlamaEngine(model, settings or EngineSettings()) as engine:
        bos = engine.bos_if_added()
        piece = lambda t: engine.piece(int(t)).decode("utf-8", errors="replace")  # noqa: E731
        for k, entry in enumerate(phrases):
            phrase = " ".join(str(entry["phrase"]).split())
            toks = engine.tokenize(" " + phrase, parse_special=False)
            phrase = ban_text(phrase) or phrase      # a ban is at a word: trailing punctuation dropped
            split = split_last_word(phrase)
            res = {**entry, "tokens": [piece(t) for t in toks], "final_one_token": False, "final_p": None,
                   "contexts": 0, "ban_phrase": None, "ban_note": ""}
            if split is None:
                res["ban_note"] = "one word: a ban needs a prefix"
                out.append(res)
                continue
            word = engine.tokenize(split[1], parse_special=False)
            res["final_one_token"] = bool(word.size == 1 and engine.piece(int(word[0])) == split[1].encode("utf-8"))
            logps = []
            for i, at in prefix_occurrences(phrase, sources, contexts):
                src = sources[i]
                before = src.text[max(0, at - CONTEXT_CHARS):at]
                head = engine.tokenize(before, parse_special=False)
                if src.prompt is not None and chat.template is not None:
                    head = np.concatenate([prompt_tokens(engine, chat.prompt(src.prompt), bos), head])
                elif bos is not None:
                    head = np.concatenate([np.array([bos], np.int32), head])
                logps.append(_final_logp(engine, head, word))
            res["contexts"] = len(logps)
            res["final_p"] = float(np.mean(np.exp(logps))) if logps else None
            head_split = split_last_word(split[0])
            if res["final_p"] is not None and res["final_p"] >= certain and head_split is not None:
                res["ban_phrase"] = split[0]
                res["ban_note"] = (f"{split[1]!r} follows {split[0]!r} with p {res['final_p']:.3f} (>= {certain}): "
                                   f"the choice is made one word earlier, ban {head_split[1]!r} after {head_split[0]!r}")
            else:
                res["ban_phrase"] = phrase
                if res["final_p"] is None:
                    res["ban_note"] = "the prefix does not occur in the model text: p(last word | prefix) unmeasured"
                elif res["final_p"] >= certain:
                    res["ban_note"] = (f"{split[1]!r} is nearly certain after {split[0]!r} (p {res['final_p']:.3f}) "
                                       "but the prefix is one word: banned as is")
                if not res["final_one_token"]:
                    res["ban_note"] = (res["ban_note"] + "; " if res["ban_note"] else "") + (
                        f"its last word {split[1]!r} is {word.size} tokens: no one-token ban")
            out.append(res)
            if progress is not None:
                progress(k + 1, len(phrases))
    return out


def ban_lines(phrases: Sequence[dict]) -> list[str]:
    """The text table of `annotate`'s results: each phrase's tokens, p(last word | prefix) and ban point."""
    out = [f"{'phrase':<32} {'tokens':>6} {'p(last)':>8} {'n':>3}  ban at"]
    for p in phrases:
        fp = "-" if p["final_p"] is None else f"{p['final_p']:.3f}"
        ban = repr(p["ban_phrase"]) if p["ban_phrase"] else "-"
        out.append(f"{p['phrase'][:32]!s:<32} {len(p['tokens']):>6} {fp:>8} {p['contexts']:>3}  {ban}"
                   + (f"  ({p['ban_note']})" if p["ban_note"] else ""))
    return out


def discover_with_model(model, model_texts, human_texts, config, *, contexts: int = 4, certain: float = 0.9,
                        template=None, settings: EngineSettings | None = None,
                        progress: Progress | None = None) -> dict:
    """`evals.discover.discover` on the texts, then each listed phrase `annotate`d by `model` at its
    occurrences in the model text (each framed by its prompt where the file gives one): the JSON
    object `discover --model` writes (discover's, phrases annotated, the model named). `settings`:
    the engine's (None: the default EngineSettings)."""
    from exactedit.evals.discover import discover
    from exactedit.files import file_sha256

    d = discover(model_texts, human_texts, config)
    obj = d.to_dict()
    sources = [Source(t.text, t.prompt) for t in model_texts]
    obj["phrases"] = annotate(model, obj["phrases"], sources, contexts=contexts, certain=certain, template=template,
                              settings=settings, progress=progress)
    obj["tokenizer"] = {"model": str(model), "sha256": file_sha256(model), "contexts": contexts, "certain": certain,
                        "chat_template": None if template is None else str(template)}
    return obj

