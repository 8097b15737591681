"""What `exactedit antislop` cannot do with a model and a phrase list, found before any generation.

An antislop run samples replies, mines them, solves a WFLD edit of the last layer's FFN down
projection and verifies the edited model live against llama.cpp: minutes to hours of work that a
bad input would waste at its end. `preflight(model, phrases, chat_template=...)` reads only
metadata, one row of each tail tensor and the tokenizer, collects every problem it finds and
raises them together as one `PreflightError` (each naming its file and field), or returns a
`PreflightResult` with what it learnt; the problems its caller found in the run's settings and
their files (`settings`: runs/antislop/checks.py) come first in the same error. The checks use the
code the run itself uses, so they cannot drift from it:

(a) the tail: `quant.model.arch.detect_tail` recognizes it; it must be an rmsnorm tail, because the live
    check of the edit (native/verify/live.py, `predict_rmsnorm`) predicts llama.cpp's logits for
    rmsnorm tails only; and its RMS eps must be in the metadata (`solvers.tail.model.load_tail`,
    which `solve wfld` opens the model with, needs it);
(b) the tensor `solve wfld` edits (the last layer's ffn_down) and the head: each type must have an
    engine-faithful matmul, or the live check cannot be bitwise. The probe is
    `solvers.tail.engine_math.engine_matmul` itself on one row (its numpy reference: nothing to
    compile), so the types accepted are exactly the ones it has, never a copied list;
(c) the chat template, the one given (`--chat-template FILE`) or else the GGUF's own, compiled and
    rendered in the project's sandbox with the model's turn framing read off it
    (`native.llamacpp.chat.model_chat`); a GGUF without a template and none given is refused;
(d) the phrases: not empty, none empty or listed twice, each of two or more words, and each
    phrase's last word one token of the model's tokenizer (llama.cpp's) in context, the test of
    `solvers.shaping.rules_file.listed_penalty` (an edit lowers one token, the last word's). A
    phrase failing it is named with its last word's tokens, and the ban one word earlier is
    suggested when that one passes the same test.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.native.llamacpp.chat import model_chat
from exactedit.native.llamacpp.engine import EngineError, LlamaEngine
from exactedit.quant import gguf
from exactedit.quant.model.arch import TailSpec, detect_tail
from exactedit.errors import ExacteditError, FieldError
from exactedit.solvers.phrases import MAX_PHRASE_BYTES, split_last_word
from exactedit.solvers.shaping.rules_file import listed_penalty
from exactedit.solvers.tail.engine_math import MatchEngine, engine_matmul

ROLES = {"ffn_down": "the tensor solve wfld edits (the last layer's FFN down projection)",
         "head": "the output head"}


@dataclass(frozen=True)
class Problem:
    """One thing antislop cannot do: where (a file, or the input it came from), which field, why."""

    path: str
    field: str
    message: str

    @classmethod
    def of(cls, exc: ExacteditError, path, field: str) -> Problem:
        """An exactedit error as a problem: its own file and field where it names them, else `path`
        and `field` (an error such as QuantError carries only a message)."""
        if isinstance(exc, FieldError):
            at = f" at offset {exc.offset}" if exc.offset is not None else ""
            return cls(exc.path, exc.field + at, exc.message)
        return cls(str(path), field, str(exc))

    def __str__(self) -> str:
        return f"{self.path}: {self.field}: {self.message}"


class PreflightError(ExacteditError):
    """Every problem preflight found, in one error: the whole list, so that one fix-and-retry
    round is enough. `problems` holds them (each a `Problem` naming file and field)."""

    def __init__(self, model, problems: Sequence[Problem], command: str = "antislop"):
        self.model, self.problems = str(model), tuple(problems)
        n = len(self.problems)
        super().__init__(f"exactedit {command} cannot run on {self.model} ({n} problem{'s' * (n != 1)}, "
                         "found before any generation):\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True)
class PhraseTokens:
    """A phrase that passed: its pieces in the model's tokenizer, written as inside running text
    (after a space), and the id of its last word's one token (the token an edit lowers)."""

    phrase: str
    tokens: tuple[str, ...]
    final: int


@dataclass(frozen=True)
class PreflightResult:
    """What preflight learnt of a model that passed every check."""

    model: str
    tail: str                   # the tail kind (quant.model.arch): "rmsnorm"
    architecture: str | None    # general.architecture, for information only
    edited: str                 # the tensor solve wfld edits, and its ggml type
    edited_type: str
    head: str                   # the head tensor (token_embd.weight when tied), and its ggml type
    head_type: str
    tied: bool
    template: str               # where the chat template came from: "gguf" or "user:FILE"
    phrases: tuple[PhraseTokens, ...]

    def to_dict(self) -> dict:
        return asdict(self)


Numbered = list[tuple[int, Problem]]     # problems about the phrases, by index (-1: the list itself)


def _phrase_list(phrases, where: str, problems: Numbered) -> dict[str, int]:
    """phrase (whitespace collapsed, as every phrase reader does) -> its index in `phrases`, for the
    phrases the model can be asked about; the list's own problems appended."""
    if isinstance(phrases, (str, bytes)):
        problems.append((-1, Problem(where, "phrases", "expected a list of phrases, got one string")))
        return {}
    listed: dict[str, int] = {}
    count = 0
    for i, raw in enumerate(phrases):
        count += 1
        field = f"phrases[{i}]"
        if not isinstance(raw, str):
            problems.append((i, Problem(where, field, f"expected a string, got {type(raw).__name__}")))
            continue
        p = " ".join(raw.split())
        if not p:
            problems.append((i, Problem(where, field, "empty")))
        elif len(p.encode("utf-8")) > MAX_PHRASE_BYTES:
            problems.append((i, Problem(where, field, f"{p[:40]!r}...: longer than {MAX_PHRASE_BYTES} bytes")))
        elif p in listed:
            problems.append((i, Problem(where, field, f"{p!r} is listed twice (first as phrases[{listed[p]}])")))
        elif split_last_word(p) is None:
            problems.append((i, Problem(where, field, f"{p!r} is one word: a ban is of a last word after its "
                                                      "prefix, so a phrase needs two or more words")))
        else:
            listed[p] = i
    if count == 0:
        problems.append((-1, Problem(where, "phrases", "no phrases: antislop needs at least one phrase to ban")))
    return listed


def _tail(g, problems: list[Problem]) -> TailSpec | None:
    """(a): the tail as detect_tail reads it, refused unless verify and solve wfld can both take it."""
    try:
        spec = detect_tail(g)
    except ExacteditError as exc:
        problems.append(Problem.of(exc, g.path, "tail"))
        return None
    if spec.kind != "rmsnorm":
        problems.append(Problem(str(g.path), "tail", f"the tail is {spec.kind} ({', '.join(spec.names.values())}): the "
                                "live check of the edit predicts llama.cpp's logits for rmsnorm tails only "
                                "(output_norm.weight, then output.weight or the tied token_embd.weight)"))
    elif spec.rms_eps is None:
        problems.append(Problem(str(g.path), f"{spec.architecture}.attention.layer_norm_rms_epsilon",
                                "missing: the final RMSNorm needs its eps"))
    return spec


def _types(g, spec: TailSpec, problems: list[Problem], roles: Sequence[str] = tuple(ROLES)) -> None:
    """(b): the edited tensor and the head through the engine-faithful matmul, one row each."""
    probe = MatchEngine("llamacpp", (1,))
    for role, what in ((r, ROLES[r]) for r in roles):
        t = spec.tensor(role)
        cols = int(t.shape[-1])
        try:
            engine_matmul(g.read_raw(t.name, 0, 1), t.type_name, cols, np.zeros((1, cols), np.float32), probe,
                          reference=True)
        except ExacteditError as exc:
            p = Problem.of(exc, g.path, f"tensor {t.name}")
            problems.append(Problem(p.path, p.field, f"{what} is {t.type_name}: {p.message}; without it the "
                                    "edited model cannot be verified bit for bit against llama.cpp"))


def _template(model: Path, chat_template, problems: list[Problem]) -> str | None:
    """(c): the chat template compiled and rendered in the sandbox; where it came from."""
    try:
        chat = model_chat(model, template=chat_template)
    except ExacteditError as exc:
        problems.append(Problem.of(exc, chat_template or model, "chat_template"))
        return None
    if chat.template is None:
        problems.append(Problem(str(model), "tokenizer.chat_template", "the GGUF carries no chat template and "
                                "none was given: give one with --chat-template FILE (a Jinja2 chat template for "
                                "this model; the prompts are rendered with it and its turn end stops each reply)"))
        return None
    chat.template.close()
    return chat.framing


def _phrase_tokens(model: Path, g, listed: dict[str, int], where: str, problems: list[Problem],
                   numbered: Numbered) -> tuple[PhraseTokens, ...]:
    """(d): each phrase's last word one token in context (listed_penalty's test), in llama.cpp's
    tokenizer; a phrase failing it named with its last word's tokens and the ban one word earlier."""
    if not listed:
        return ()
    try:
        engine = LlamaEngine(model)
    except EngineError as exc:
        p = Problem.of(exc, model, "model")
        problems.append(Problem(p.path, p.field, f"{p.message}; so the phrases' tokens could not be checked"))
        return ()
    with engine:
        def tokenize(text: str, special: bool):
            return engine.tokenize(text, parse_special=special)

        def piece(t) -> str:
            return engine.piece(int(t)).decode("utf-8", errors="replace")

        earlier = {p: split_last_word(p)[0] for p in listed}     # the ban one word earlier
        try:
            _, skipped = listed_penalty([*listed, *earlier.values()], 0.0, g, tokenize, model_path=str(model))
        except ExacteditError as exc:
            problems.append(Problem.of(exc, model, "tokenizer"))
            return ()
        failed = dict(skipped)
        out = []
        for p, i in listed.items():
            toks = tokenize(" " + p, False)
            if p not in failed:
                out.append(PhraseTokens(p, tuple(piece(t) for t in toks), int(toks[-1])))
                continue
            word = split_last_word(p)[1]
            k, covered = 0, 0                   # the last tokens, back to where the last word starts
            while k < len(toks) and covered < len(word.encode("utf-8")):
                k += 1
                covered += len(engine.piece(int(toks[-k])))
            numbered.append((i, Problem(where, f"phrases[{i}]", f"{p!r}: its last word {word!r} is not one token "
                             f"of {model.name} (in context it is {[piece(t) for t in toks[len(toks) - k:]]}; the "
                             f"phrase is {[piece(t) for t in toks]}); an edit lowers one token, so the phrase "
                             f"cannot be banned at its last word: {_suggest(earlier[p], failed)}")))
    return tuple(out)


def _suggest(prefix: str, failed: dict[str, str]) -> str:
    """The ban one word earlier (the phrase's prefix), when it is a phrase that passes the test."""
    split = split_last_word(prefix)
    if split is None:
        return (f"one word earlier there is no ban point ({prefix!r} is a single word and a ban needs a "
                "prefix): reword the phrase or drop it")
    if prefix in failed:
        return f"one word earlier, {prefix!r} fails the same test: reword the phrase or drop it"
    return f"ban one word earlier instead, {prefix!r} (its last word {split[1]!r} is one token)"


def preflight(model, phrases: Sequence[str], *, chat_template=None, phrases_from: str = "phrases",
              settings: Sequence[Problem] = ()) -> PreflightResult:
    """Check that `exactedit antislop` can run on the GGUF `model` with `phrases` (the phrase
    strings) and `chat_template` (a Jinja2 file's path, or None for the model's own template from
    its GGUF), before any generation: the checks (a)-(d) of the module doc, all of them run.
    `phrases_from` names where the phrases came from (their file) in the problems about them;
    `settings`: the problems the caller found in the run's settings and their files, listed first
    in the same error. Raises PreflightError listing every problem; else returns what was learnt."""
    model = Path(model)
    problems: list[Problem] = list(settings)    # the settings', then the model's, in the order of the checks
    numbered: Numbered = []                 # the phrases', listed after them in phrase order
    listed = _phrase_list(phrases, phrases_from, numbered)

    def refuse() -> PreflightError:
        return PreflightError(model, problems + [p for _, p in sorted(numbered, key=lambda x: x[0])])

    try:
        g = gguf.open(model)
    except ExacteditError as exc:           # nothing else about the model can be read
        problems.append(Problem.of(exc, model, "file"))
        raise refuse() from None
    with g:
        spec = _tail(g, problems)
        if spec is not None:
            _types(g, spec, problems)
        template = _template(model, chat_template, problems)
        tokens = _phrase_tokens(model, g, listed, phrases_from, problems, numbered)
    if problems or numbered:
        raise refuse()
    down, head = spec.tensor("ffn_down"), spec.tensor("head")
    return PreflightResult(str(model), spec.kind, spec.architecture, down.name, down.type_name, head.name,
                           head.type_name, spec.tied, template, tokens)


def preflight_head(model, *, chat_template=None,
                   settings: Callable[[int, int], Sequence[tuple[str, str]]] | None = None) -> PreflightResult:
    """Check that `exactedit persona` (a `solve head` edit of output.weight rows) can run on `model`
    before any generation: (a) and (c) of the module doc, (b) for the head, and (e): the head is its
    own tensor (an edit of the tied token_embd.weight would move the inputs too) and the logits are
    linear in it (no final softcap), the test `solve head` applies (solvers.head.solve.check_tail).
    `settings(n, vocab)`: the run's settings the model's sizes bound (the head's input width and
    rows), as (setting, why) pairs, listed first. Raises PreflightError listing every problem."""
    model = Path(model)
    problems: list[Problem] = []
    try:
        g = gguf.open(model)
    except ExacteditError as exc:
        raise PreflightError(model, [Problem.of(exc, model, "file")], "persona") from None
    with g:
        spec = _tail(g, problems)
        if spec is not None and settings is not None:
            problems[:0] = [Problem(str(model), name, why) for name, why in settings(spec.n, spec.vocab)]
        if spec is not None:
            _types(g, spec, problems, ("head",))
            if spec.tied:
                problems.append(Problem(str(model), "token_embd.weight", "the head is tied to the input embeddings "
                                        "(no output.weight): an edit of its rows would change the inputs too, so "
                                        "solve head cannot edit this model"))
            if spec.logit_softcap is not None:
                problems.append(Problem(str(model), f"{spec.architecture}.final_logit_softcapping",
                                        "the logits pass a final softcap: solve head needs them linear in the head rows"))
        template = _template(model, chat_template, problems)
    if problems:
        raise PreflightError(model, problems, "persona")
    head = spec.tensor("head")
    down = spec.tensor("ffn_down")
    return PreflightResult(str(model), spec.kind, spec.architecture, down.name, down.type_name, head.name,
                           head.type_name, spec.tied, template, ())
