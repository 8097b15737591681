"""A tiny end-to-end world for the evals workflow tests: an rmsnorm GGUF with a readable chat
token table, dumps of chat documents with planted slop phrases, a protocol file and a bundle that
edits two head rows. Small enough that a whole register -> split -> score -> test -> blind run
takes about a second."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exactedit import quant
from exactedit.dumps import DocInfo, write_dump
from exactedit.dumps.roles import infer_roles
from tests.fixturegen.vocab import encode_piece
from exactedit.quant.gguf.write import synthetic_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
WORDS = ["assistant", "user", "\n", "\n\n", " end", " to", " rather", " than", " owo", " the", " a", " cat",
         " sat", ".", " The", "The", " more", " far", " away", " right", " fine", "{\""]
TEXTS = WORDS + [f" w{i}" for i in range(40 - len(WORDS) - len(SPECIALS))] + SPECIALS
ID = {t: i for i, t in enumerate(TEXTS)}
N, H = 32, 32
U = np.ones(N) / np.sqrt(N)  # every residual row leans along U, so an edit along -U lowers a logit everywhere

PROTOCOL = """\
name = "world"

[[traces]]
name = "chat"
path = "chat"
role = "pool"

[[traces]]
name = "anchors"
path = "anchors"
role = "anchors"
domain = "plain"

[[traces]]
name = "collateral"
path = "collateral"
role = "collateral"

[split]
seed = 3
train = 0.5
dev = 0.25
test = 0.25

[bars]
bootstrap = 20

[tokens]
style = [" owo"]
phrases = [[" end", " to", " end"], [" rather", " than"]]
"""


@dataclass(frozen=True)
class World:
    root: Path
    model: Path
    protocol: Path
    bundle: Path
    blind: Path
    blind2: Path


def _reply(rng, n_slop: int) -> list[str]:
    words = []
    for _ in range(n_slop):
        words += list(rng.choice([" the", " cat", " sat", " a", " fine"], 3)) + [" end", " to", " end", "."]
        words += [" rather", " than"] + list(rng.choice([" the", " cat", " owo"], 2)) + ["."]
    return words


def _chat_doc(rng, n_slop: int) -> list[int]:
    toks = ["<|im_start|>", "user", "\n", " the", " cat", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n",
            "<think>", " a", "</think>", "\n\n"] + _reply(rng, n_slop) + ["<|im_end|>"]
    return [ID[t] for t in toks]


def _write(path: Path, docs: list[tuple[str, str, str, tuple[str, ...], list[int]]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = np.concatenate([np.asarray(t, np.int32) for *_, t in docs])
    infos, start = [], 0
    for name, source, character, tags, toks in docs:
        infos.append(DocInfo(name, start, len(toks), source, character, tags))
        start += len(toks)
    nxt = np.r_[tokens[1:], -1].astype(np.int32)
    for d in infos[:-1]:
        nxt[d.stop - 1] = -1  # documents are separate texts: the next document is not a continuation
    specials = [ID[s] for s in SPECIALS]
    roles = np.concatenate([infer_roles(tokens[d.first_row:d.stop], TEXTS, specials) for d in infos])
    T = len(tokens)
    write_dump(path, arch="rmsnorm", layer=0, docs=infos,
               fields={"tokens": tokens, "next": nxt, "roles": roles,
                       "R": (rng.standard_normal((T, N)) + 3.0 * np.sqrt(N) * U).astype(np.float32),
                       "hh": rng.standard_normal((T, H)).astype(np.float32)})


def build_world(root: Path) -> World:
    root.mkdir(parents=True, exist_ok=True)
    pieces = [t if t in SPECIALS else encode_piece(t) for t in TEXTS]
    types = np.array([3 if t in SPECIALS else 1 for t in TEXTS], np.int32)
    model = root / "model.gguf"
    synthetic_model(model, tail="rmsnorm", vocab=len(TEXTS), n=N, h=H, layers=1, head_type="Q8_0", seed=5,
                    metadata={"tokenizer.ggml.tokens": pieces, "tokenizer.ggml.token_type": types})
    rng = np.random.default_rng(0)
    chats = [(f"c{s}{k}", f"src{s}", "mika" if s % 2 else "kai", ("chat",), _chat_doc(rng, 2))
             for s in range(4) for k in range(2)]
    _write(root / "chat", chats, 1)
    plain = [ID[t] for t in [" the", " cat", " sat", " far", " away", ".", " more", " than", " a", " cat", "."] * 3]
    _write(root / "anchors", [("wiki", "wiki", "", ("anchor", "plain"), plain)], 2)
    coll = [ID[t] for t in [" the", " end", " more", " than", " a", " end", " far", " than", " the", " end"] * 3]
    _write(root / "collateral", [("legit", "legit", "", ("collateral",), coll)], 3)
    _write(root / "blind", [("fresh", "fresh", "mika", ("chat", "blind"), _chat_doc(rng, 3))], 4)
    _write(root / "blind2", [("fresh2", "fresh2", "mika", ("chat", "blind"), _chat_doc(rng, 3))], 5)
    protocol = root / "protocol.toml"
    protocol.write_text(PROTOCOL, encoding="utf-8")
    return World(root, model, protocol, _bundle(root, model), root / "blind", root / "blind2")


def _bundle(root: Path, model: Path) -> Path:
    """Lower the logits of " end" and " than" (the rejected tokens): their head rows move along -U."""
    from exactedit.quant import gguf
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    with gguf.open(model) as g:
        info = g.tensors["output.weight"]
        rows = np.array([ID[" end"], ID[" than"]])
        w = g.read_rows("output.weight")[rows]
        sha = g.sha256()
    raw = quant.quantize(w - 1.5 * U, info.type_name)
    edit = TensorEdit("output.weight", "rows", info.type_name, tuple(info.shape), raw, rows)
    return write_bundle(root / "bundle", solver="test", inputs=[InputRef("model", str(model), sha)],
                        config={}, edits=[edit]).path
