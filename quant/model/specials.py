"""A model's own special tokens, read from its GGUF (never from a list written for one family).

GGUF records them two ways:
- `tokenizer.ggml.token_type`: llama.cpp's token types (1 normal, 2 unknown, 3 CONTROL,
  4 USER_DEFINED, 5 unused, 6 byte). Control tokens are the chat scaffolding and the ends of
  generation; user-defined tokens are added text pieces (Qwen's `<tool_call>`, Gemma's runs of
  newlines) that the tokenizer treats as one unit.
- `tokenizer.ggml.{bos,eos,eot,eom}_token_id`, `padding_`, `seperator_`, `unknown_token_id`: the
  roles of a few of them.

`model_specials(g)` collects both, plus the tokens the chat template names (rendered in its
sandbox; a template that is refused or fails leaves `template_error` saying why, for the caller
to stop on or to name a fallback), and derives the roles below. The chat template is the GGUF's
own, or the one the user gives (`template=`, quant.model.chat_template.GivenTemplate: it wins over the
file's; Gemma 3 270M's file has none, and its turn end is then `<end_of_turn>`, not `<eos>`):
- `turn_end`: the end-of-turn token: `eot_token_id` when given, else the token the chat template
  closes an assistant turn with, else `eos_token_id`;
- `end_of_generation`: eos, eot, eom and the turn end (where generation stops);
- `guards`: the specials an edit must not raise (the solvers' default `--special` set): every
  CONTROL token that the chat template names, that has one of the roles above, or that spells
  one of the chat tags the toolkit gives a meaning to (`<think>`, `<tool_call>`, their closers).
  For Qwen2.5 this is `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`; for Gemma 3 (thousands of
  unused control ids, no template in the file) `<pad>`, `<eos>`, `<bos>`, `<unk>`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exactedit.errors import GGUFFormatError

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# role -> the GGUF key suffix (llama.cpp's spellings, "seperator" included)
# Chat tags the toolkit gives a meaning to (dumps/roles.py: ROLE_THINK, ROLE_TOOL): guarded when
# the model has them as control tokens, whatever its template says.
ROLE_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "eom": "eom_token_id",
           "pad": "padding_token_id", "sep": "seperator_token_id", "unk": "unknown_token_id"}


@dataclass(frozen=True)
class ModelSpecials:
    """The special tokens of one model (ids into its token table)."""

    vocab: int
    control: tuple[int, ...]
    user_defined: tuple[int, ...]
    ids: dict[str, int]                   # role -> id, for the tokenizer.ggml.*_token_id keys present
    template: tuple[int, ...]             # control / user-defined tokens the chat template writes
    turn_end: int | None
    turn_end_from: str                    # "eot_token_id", "chat_template", "eos_token_id" or ""
    role_tags: tuple[int, ...] = ()       # control / user-defined tokens spelling one of ROLE_TAGS
    texts: dict[int, str] = field(default_factory=dict)   # id -> token string, for the ids above
    template_error: str = ""              # why the chat template's turn framing cannot be read ("": it can,
                                          # or there is no template): refused, failed, over budget, no shape
    template_from: str = ""               # "gguf", "user:PATH" (a given template) or "" (none)

    @property
    def end_of_generation(self) -> tuple[int, ...]:
        ids = {self.ids[k] for k in ("eos", "eot", "eom") if k in self.ids}
        if self.turn_end is not None:
            ids.add(self.turn_end)
        return tuple(sorted(ids))

    @property
    def guards(self) -> tuple[int, ...]:
        control = set(self.control)
        named = set(self.template) | set(self.ids.values()) | set(self.role_tags)
        if self.turn_end is not None:
            named.add(self.turn_end)
        return tuple(sorted(i for i in named if i in control))

    @property
    def specials(self) -> tuple[int, ...]:
        """Every control and user-defined id (the tokens that can be chat tags)."""
        return tuple(sorted(set(self.control) | set(self.user_defined)))

    def text(self, i: int) -> str:
        return self.texts.get(int(i), f"<token {int(i)}>")

    def to_dict(self) -> dict:
        return {"vocab": self.vocab, "control": len(self.control), "user_defined": len(self.user_defined),
                "ids": {k: {"id": v, "text": self.text(v)} for k, v in self.ids.items()},
                "template": [self.text(i) for i in self.template],
                "turn_end": None if self.turn_end is None else self.text(self.turn_end),
                "turn_end_from": self.turn_end_from,
                "end_of_generation": [self.text(i) for i in self.end_of_generation],
                "guards": [self.text(i) for i in self.guards], "template_error": self.template_error,
                "template_from": self.template_from}


def model_specials(g, template=None) -> ModelSpecials:
    """Read the special tokens of an open GGUF (quant.gguf.GGUFFile); `template`: a chat template
    given by the user (quant.model.chat_template.GivenTemplate), read in place of the GGUF's own."""
    tokens = g.tokens()
    V = len(tokens)
    types = g.token_types()
    if types is None:
        types = np.full(V, TOKEN_NORMAL, dtype=np.int32)
    if types.size != V:
        raise GGUFFormatError(g.path, "tokenizer.ggml.token_type", f"{types.size} types for {V} tokens")
    control = tuple(int(i) for i in np.flatnonzero(types == TOKEN_CONTROL))
    user = tuple(int(i) for i in np.flatnonzero(types == TOKEN_USER_DEFINED))
    ids = {}
    for key, suffix in ID_KEYS.items():
        v = g.get(f"tokenizer.ggml.{suffix}")
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < V:
            raise GGUFFormatError(g.path, f"tokenizer.ggml.{suffix}", f"{v!r} is not a token id in [0, {V})")
        ids[key] = int(v)
    template_ids, fmt_end, template_error, template_from = (), None, "", ""
    if template is not None or g.get("tokenizer.chat_template") is not None:
        template_ids, fmt_end, template_error = _template_tokens(g, tokens, control + user, template)
        template_from = "gguf" if template is None else f"user:{template.path}"
    if "eot" in ids:
        turn_end, src = ids["eot"], "eot_token_id"
    elif fmt_end is not None:
        turn_end, src = fmt_end, "chat_template"
    elif "eos" in ids:
        turn_end, src = ids["eos"], "eos_token_id"
    else:
        turn_end, src = None, ""
    tags = tuple(i for i in control + user if tokens[i] in ROLE_TAGS)
    named = set(ids.values()) | set(template_ids) | set(tags) | ({turn_end} if turn_end is not None else set())
    return ModelSpecials(V, control, user, ids, template_ids, turn_end, src, tags,
                         {i: tokens[i] for i in sorted(named)}, template_error, template_from)


def _template_tokens(g, tokens, special_ids, given=None) -> tuple[tuple[int, ...], int | None, str]:
    """Special tokens the chat template names (their strings in its source, or written by a probe
    conversation rendered in the sandbox), the one that closes an assistant turn (None when the
    template's shape is not found) and why its turn framing cannot be read ("" when it can)."""
    from exactedit.quant.model import chat_template as ct

    by_text = {}
    for i in special_ids:
        if tokens[i].strip():
            by_text.setdefault(tokens[i], i)
    source = given.source if given is not None else g.get("tokenizer.chat_template")
    text = source if isinstance(source, str) else ""
    try:
        tpl = ct.template_of(g, given)
    except ct.ChatTemplateError as exc:   # refused before rendering: its source still names tokens
        return tuple(sorted({i for s, i in by_text.items() if s in text})), None, exc.message
    with tpl:
        try:
            text += tpl.render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}],
                               add_generation_prompt=True)
            rendered = True
        except ct.ChatTemplateError:   # a template that fails (or is refused) still names tokens in its source
            rendered = False
        written = tuple(sorted({i for s, i in by_text.items() if s in text}))
        try:
            fmt = ct.probe_format(tpl, list(by_text))
        except ct.ChatTemplateError as exc:
            return written, None, exc.message
    return written, (by_text.get(fmt.turn_end) if rendered else None), ""


def resolve_names(names, tokens, where="specials") -> tuple[int, ...]:
    """Token strings -> ids (the first id whose string matches); a name the table lacks is an error."""
    index = {}
    for i, t in enumerate(tokens):
        index.setdefault(t, i)
    missing = [n for n in names if n not in index]
    if missing:
        raise GGUFFormatError(where, "specials", f"{missing} are not tokens of this model")
    return tuple(index[n] for n in names)
