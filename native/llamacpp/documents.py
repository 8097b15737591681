"""`exactedit engine dump`: documents from text, token ids or chat conversations, labelled.

Each input becomes one document with a stable name (a hash of its content), a source, a
character and tags, and its row roles derived from the model's own turn framing:
- `--text FILE`: one document; tagged `plain`, or `chat` when it holds the model's turn-start
  token (text is tokenized with special tokens parsed, as the engine contract does);
- `--tokens FILE`: int32 ids (the engine contract's layout), tagged like text;
- `--chat FILE.jsonl`: one conversation per line (`[{"role", "content"}, ...]`), rendered with the
  model's chat template from its GGUF (in Jinja2's sandbox), tagged `chat`.
User tags (`--tag`, repeatable) are added to these. The default source is the input file's name,
so splits group a file's documents together; `--source` and `--character` override it.
Each input file is a regular file (a FIFO or a device is refused by name, never waited on) of capped
size, read before the engine loads: --text at most MAX_TEXT_BYTES (exactedit.files), UTF-8; --tokens
at most MAX_TOKENS ids (dumps/contract.py); --chat at most MAX_CHAT_BYTES (chat.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.files import MAX_TEXT_BYTES, lone_surrogate, read_utf8
from exactedit.native.llamacpp.capture import CaptureDoc, CaptureResult, capture_dump
from exactedit.native.llamacpp.chat import ModelChat, model_chat, read_chat_jsonl, short_hash, unique_names
from exactedit.native.llamacpp.engine import EngineError, EngineSettings, LlamaEngine

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DumpInputs:
    """Exactly one of text / tokens / chat (paths)."""

    text: str | None = None
    tokens: str | None = None
    chat: str | None = None
    tags: tuple[str, ...] = ()
    source: str | None = None
    character: str = ""
    chat_fallback: str | None = None     # the framing to use when the model's template is refused or fails
    chat_template: str | None = None     # a Jinja2 chat template file, used instead of the model's own

    def __post_init__(self):
        given = [x for x in (self.text, self.tokens, self.chat) if x is not None]
        if len(given) != 1:
            raise EngineError("engine dump", "inputs", "give exactly one of --text, --tokens and --chat")
        object.__setattr__(self, "tags", tuple(dict.fromkeys(self.tags)))
        # refused here, before the engine runs: an empty tag failed the manifest after the capture, and a
        # label holding a lone surrogate (a non-UTF-8 byte from the shell) reached the dump and its reports
        for flag, values in (("--tag", self.tags), ("--source", (self.source,)), ("--character", (self.character,))):
            for v in values:
                if v is None and flag == "--source":
                    continue
                if not isinstance(v, str) or (flag == "--tag" and not v.strip()):
                    raise EngineError("engine dump", flag, f"expected a non-empty string, got {v!r}")
                if (at := lone_surrogate(v)) is not None:
                    raise EngineError("engine dump", flag, f"{ascii(v)} is not UTF-8 text (a byte no UTF-8 text "
                                                           f"holds, at character {at})")


def labelled(chat: ModelChat, name: str, tokens, *, source: str, character: str, tags: Sequence[str],
             kind: str | None = None, next_token: int | None = None) -> CaptureDoc:
    """A CaptureDoc with roles from the model's framing and tag `chat` or `plain` (from `kind`, else
    from whether the tokens hold a turn)."""
    toks = np.asarray(tokens, dtype=np.int32)
    kind = kind or ("chat" if chat.is_chat(toks) else "plain")
    return CaptureDoc(name, toks, source=source, character=character,
                      tags=tuple(dict.fromkeys((kind, *tags))), roles=chat.roles(toks, next_token=next_token))


def build_docs(model, inputs: DumpInputs) -> tuple[list[CaptureDoc], ModelChat]:
    """The labelled documents of `inputs`, tokenized by the model's own tokenizer."""
    from exactedit.dumps import contract

    chat = model_chat(model, fallback=inputs.chat_fallback, template=inputs.chat_template)
    src_path = Path(inputs.text or inputs.tokens or inputs.chat)
    source = inputs.source if inputs.source is not None else src_path.name
    kw = dict(source=source, character=inputs.character, tags=inputs.tags)
    if inputs.tokens is not None:
        toks = contract.read_tokens(inputs.tokens, field="--tokens")
        contract.check_ids(inputs.tokens, toks, len(chat.table), "--tokens")     # named here, not as "token stream"
        return [labelled(chat, f"tokens-{short_hash(toks.astype('<i4').tobytes())}", toks, **kw)], chat
    if inputs.text is not None:
        text = read_utf8(src_path, MAX_TEXT_BYTES, EngineError, "--text")
        with LlamaEngine(model, EngineSettings()) as engine:
            return [labelled(chat, f"text-{short_hash(text)}", engine.tokenize(text), **kw)], chat
    convs = read_chat_jsonl(src_path, "--chat")
    names = unique_names(f"chat-{short_hash(c)}" for c in convs)
    rendered = chat.render_many(convs)                   # the untrusted template runs before the engine loads
    with LlamaEngine(model, EngineSettings()) as engine:
        docs = [labelled(chat, n, engine.tokenize(r), kind="chat", **kw) for n, r in zip(names, rendered)]
    return docs, chat


@dataclass(frozen=True)
class DocumentsDump:
    """A written dump and what went into it: per document (name, rows, source, character, tags),
    the rows carrying each role bit, and how the model frames its chat."""

    capture: CaptureResult
    docs: tuple[dict, ...]
    role_rows: dict[str, int]
    chat: dict

    def to_dict(self) -> dict:
        c = self.capture
        return {"dump": str(c.path), "rows": c.rows, "layer": c.layer, "model_sha256": c.model_sha256,
                "ubatch_sizes": c.meta["ubatch_sizes"], "docs": list(self.docs), "role_rows": self.role_rows,
                "chat": self.chat}


def summarize(capture: CaptureResult, docs: Sequence[CaptureDoc], chat: ModelChat) -> DocumentsDump:
    from exactedit.dumps import ROLE_NAMES

    roles = np.concatenate([np.asarray(d.roles, np.uint8) for d in docs]) if docs and docs[0].roles is not None \
        else np.zeros(0, np.uint8)
    info = tuple({"name": d.name, "rows": int(np.asarray(d.tokens).size), "source": d.source,
                  "character": d.character, "tags": list(d.tags)} for d in docs)
    counts = {n: int(np.count_nonzero(roles & b)) for n, b in ROLE_NAMES.items()}
    counts["anchor"] += sum(d["rows"] for d in info if "anchor" in d["tags"])   # capture_dump marks these
    return DocumentsDump(capture, info, counts, chat.to_dict())


def render_documents(r: DocumentsDump) -> str:
    c = r.capture
    out = [f"wrote {c.path}: {c.rows} rows of layer {c.layer} (micro-batches {c.meta['ubatch_sizes']})"]
    out += [f"  {d['name']:24} {d['rows']:6} rows  source {d['source']!r}  character {d['character']!r}  "
            f"tags {','.join(d['tags'])}" for d in r.docs]
    out.append("  roles: " + ", ".join(f"{k} {v}" for k, v in r.role_rows.items() if v))
    return "\n".join(out)


def dump_documents(model, inputs: DumpInputs, out, *, settings: EngineSettings | None = None,
                   overwrite: bool = False, progress: Progress | None = None) -> DocumentsDump:
    """Build the labelled documents of `inputs` and capture their dump at `out`."""
    docs, chat = build_docs(model, inputs)
    meta = {"documents": {"inputs": {k: v for k, v in (("text", inputs.text), ("tokens", inputs.tokens),
                                                         ("chat", inputs.chat)) if v is not None},
                          "chat": chat.to_dict()}}
    res = capture_dump(model, docs, out, settings=settings, overwrite=overwrite, progress=progress, extra_meta=meta)
    return summarize(res, docs, chat)


def import_dump(src, out, *, model=None, overwrite: bool = False, chat_fallback: str | None = None,
                chat_template=None) -> dict:
    """`exactedit dump import`: a raw engine dump (dumps/import_raw.py) -> a v1 dump; with `model`,
    the dims are checked against it, its sha256 recorded and the row roles derived from its chat
    framing (a template that is refused or fails stops the import unless `chat_fallback` names a
    framing, native.llamacpp.chat.FALLBACKS; `chat_template`: a Jinja2 template file used instead of
    the model's own; the framing used is recorded in the manifest).
    Returns a summary (path, rows, documents, role rows, chat framing)."""
    from exactedit.dumps import ROLE_NAMES, read_dump
    from exactedit.dumps.import_raw import import_raw
    from exactedit.quant import gguf as _gguf
    from exactedit.solvers.tail.model import load_tail

    roles = expect = sha = chat = None
    if model is not None:
        chat = model_chat(model, fallback=chat_fallback, template=chat_template)
        roles = chat.roles
        with _gguf.open(model) as g:
            expect, sha = load_tail(g).dump_expect(), g.sha256()
    path = import_raw(src, out, roles=roles, overwrite=overwrite, expect=expect, model_sha256=sha,
                      chat_framing=chat.framing if chat is not None else None,
                      meta={"chat": chat.to_dict()} if chat is not None else None)
    d = read_dump(path)
    r = np.asarray(d.roles) if d.roles is not None else np.zeros(0, np.uint8)
    return {"dump": str(path), "rows": d.rows, "sha256": d.sha256(), "model_sha256": d.manifest.model_sha256,
            "docs": [{"name": x.name, "rows": x.rows, "source": x.source, "character": x.character,
                      "tags": list(x.tags)} for x in d.docs],
            "role_rows": {n: int(np.count_nonzero(r & b)) for n, b in ROLE_NAMES.items()},
            "chat_framing": d.manifest.chat_framing}


def render_import(res: dict) -> str:
    """`exactedit dump import`'s line (`res` as import_dump returns it)."""
    roles = ", ".join(f"{k} {v}" for k, v in res["role_rows"].items() if v) or "none"
    return (f"wrote {res['dump']}: {res['rows']} rows, {len(res['docs'])} documents, sha256 {res['sha256']}; "
            f"roles: {roles}")
