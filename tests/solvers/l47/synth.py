"""A tiny synthetic world for the wfld tests: a GGUF with a word-level byte-BPE token table,
and dumps whose token streams plant the banned phrases (in several tokenizations), their
legitimate uses and chat turns. Activations are random (seeded): the tests check the solver's
algebra and bookkeeping, not what a real model would say (the bundled fixture does that).

Tails (`build_world(root, tail=...)`): "hc4" (the production tail, Q8_0 W_sd, h = 32) or "post"
(an rmsnorm tail with a Gemma-style post-FFN norm, R' = R + rmsnorm(W_down hh) * w_post, its
ffn_down in Q6_K, h = 256: a Q6_K row needs whole super-blocks of 256). `softcap`: the "post"
tail as Gemma 2 writes it, architecture gemma2 with its final and attention logit softcap keys.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from exactedit.dumps import DocInfo, write_dump
from exactedit.dumps.roles import infer_roles
from gguf import GGUFValueType

from exactedit.quant.gguf.write import MetaValue, synthetic_model

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
WORDS = ("the", "end", "to", "of", "rather", "than", "right", "away", "more", "far", "now", "later",
         "we", "should", "test", "it", "is", "better", "do", "can", "at", "keep", "this", "takes",
         "an", "hour", "finish", "first", "soon", "here", "today", "go", "day", "weekend", "user",
         "assistant", "sure", "a", "way", "e")
PIECES = ("End", "Rather", "Right", "end", "rather", "e", "nd", "aw", "ay", ".", ",", "\n", "\n\n", '"',
          ' "', " ", "user", "assistant", "week")
PHRASES = ("end to end", "rather than", "right away")
CHATML_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
N, H, D_LO = 256, 32, 32
H_POST = 256        # hh width of the "post" tail (Q6_K rows are whole 256-wide super-blocks)
TAILS = ("hc4", "post", "gated")
PLANT = 6.0         # "gated" world: the FFN input's planted component at the phrases' slop contexts


def _enc(text: str) -> str:
    """Text -> GPT-2 byte-level token string (space -> U+0120, newline -> U+010A)."""
    return text.replace(" ", "\u0120").replace("\n", "\u010a")


def vocab() -> tuple[list[str], list[int]]:
    texts = list(dict.fromkeys([" " + w for w in WORDS] + list(WORDS) + list(PIECES)))
    tokens = [_enc(t) for t in texts] + list(SPECIALS)
    types = [1] * len(texts) + [3] * len(SPECIALS)
    return tokens, types


class Ids:
    """Text pieces -> ids of the synthetic table: `ids(" the", " end")`, each piece one token."""

    def __init__(self):
        tokens, _ = vocab()
        self.index = {t: i for i, t in enumerate(tokens)}

    def __call__(self, *pieces: str) -> list[int]:
        return [self.index[p if p in SPECIALS else _enc(p)] for p in pieces]

    def text(self, text: str) -> list[int]:
        """Greedy longest match over the table (only for writing test streams)."""
        out, i = [], 0
        while i < len(text):
            for j in range(len(text), i, -1):
                key = text[i:j] if text[i:j] in SPECIALS else _enc(text[i:j])
                if key in self.index:
                    out.append(self.index[key])
                    i = j
                    break
            else:
                raise KeyError(text[i:])
        return out


def chat(ids: Ids, *replies: str) -> list[int]:
    out = []
    for r in replies:
        out += ids("<|im_start|>") + ids.text("user\n") + ids.text("can we test it") + ids("<|im_end|>") + ids("\n")
        out += ids("<|im_start|>") + ids.text("assistant\n") + ids.text(r) + ids("<|im_end|>") + ids("\n")
    return out


def build_model(path, tail: str = "hc4", softcap: float | None = None) -> Path:
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}, got {tail!r}")
    tokens, types = vocab()
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    gemma2 = {} if softcap is None else {
        "general.architecture": "gemma2", "gemma2.block_count": MetaValue(u32, 2),
        "gemma2.embedding_length": MetaValue(u32, N), "gemma2.attention.layer_norm_rms_epsilon": MetaValue(f32, 1e-6),
        "gemma2.final_logit_softcapping": MetaValue(f32, softcap),
        "gemma2.attn_logit_softcapping": MetaValue(f32, 50.0)}     # upstream of the dump: no part of the tail
    shape = (dict(tail="hc4", h=H, d_lo=D_LO) if tail == "hc4" else
             dict(tail="rmsnorm", h=H_POST, down_type="Q6_K", post_norm=True) if tail == "post" else
             dict(tail="rmsnorm", h=H_POST, down_type="Q6_K", ffn_type="Q4_K"))
    synthetic_model(path, vocab=len(tokens), n=N, layers=2, seed=7, **shape,
                    metadata={"tokenizer.ggml.tokens": tokens,
                              "tokenizer.ggml.token_type": np.array(types, np.int32),
                              # a chat model's own specials (quant.model.specials): ChatML turns, eos = turn end
                              "tokenizer.ggml.eos_token_id": MetaValue(u32, tokens.index("<|im_end|>")),
                              "tokenizer.ggml.bos_token_id": MetaValue(u32, tokens.index("<|endoftext|>")),
                              "tokenizer.chat_template": CHATML_TEMPLATE, **gemma2})
    return Path(path)


def write_trace(path, docs: list[tuple[str, list[int], tuple[str, ...]]], *, seed: int, hh_of=None,
                tail: str = "hc4") -> Path:
    """A dump of documents (name, ids, tags) for the `tail`'s model; activations random but a
    function of the seed. `hh_of(token, rng)` may fix the hh of a row from the token it reads."""
    tokens, types = vocab()
    strings = [quant_decode(t) for t in tokens]
    special = [i for i, t in enumerate(types) if t == 3]
    rng = np.random.default_rng(seed)
    ids = np.concatenate([np.asarray(d[1], np.int32) for d in docs])
    T = ids.size
    nxt = np.full(T, -1, np.int32)
    roles, infos, a = [], [], 0
    for name, d_ids, tags in docs:
        b = a + len(d_ids)
        nxt[a:b - 1] = d_ids[1:]
        roles.append(infer_roles(np.asarray(d_ids), strings, special))
        infos.append(DocInfo(name, a, len(d_ids), name.split("-")[0], "synthetic", tags))
        a = b
    hh = rng.standard_normal((T, H if tail == "hc4" else H_POST)).astype(np.float32)
    if hh_of is not None:
        hh = np.stack([hh_of(int(t), rng) for t in ids]).astype(np.float32)
    if tail == "hc4":
        fields = {"tokens": ids, "next": nxt, "R": rng.standard_normal((T, 4, N)).astype(np.float32),
                  "inj": rng.standard_normal((T, 4)).astype(np.float32), "hh": hh,
                  "sgv": rng.standard_normal(T).astype(np.float32),
                  "yr": (0.5 * rng.standard_normal((T, N))).astype(np.float32),
                  "roles": np.concatenate(roles)}
        return write_dump(path, arch="hc4", layer=1, fields=fields, docs=infos)
    R = rng.standard_normal((T, N)).astype(np.float32)
    if tail == "gated":
        # every row shares a common component (a real residual stream's, which lets a gate through the
        # origin act as if it had a bias), and a phrase's contexts (the rows reading its prefix's last
        # token, whatever comes next: R is causal, it has not seen the next token) a planted direction on top
        dirs = np.random.default_rng(99).standard_normal((1 + len(PHRASES), N))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        R += (3.0 * np.sqrt(N) * dirs[0]).astype(np.float32)
        for p, rows in enumerate(_prefix_rows(ids, strings)):        # one direction per phrase
            R[rows] += (PLANT * np.sqrt(N) * dirs[1 + p]).astype(np.float32)
    fields = {"tokens": ids, "next": nxt, "R": R, "hh": hh, "roles": np.concatenate(roles)}
    return write_dump(path, arch="rmsnorm", layer=1, fields=fields, docs=infos)


def _prefix_rows(ids, strings) -> list[np.ndarray]:
    """Per phrase, the rows whose text so far ends with its prefix (all its words but the last)."""
    rows = [[] for _ in PHRASES]
    for t in range(ids.size):
        text = "".join(strings[int(i)] for i in ids[max(0, t - 4):t + 1]).lower()
        for p, phrase in enumerate(PHRASES):
            if text.endswith(phrase.rsplit(" ", 1)[0]):
                rows[p].append(t)
    return [np.asarray(r, dtype=np.int64) for r in rows]


def quant_decode(token: str) -> str:
    return token if token in SPECIALS else token.replace("\u0120", " ").replace("\u010a", "\n")


def build_world(root, tail: str = "hc4", softcap: float | None = None) -> dict[str, Path]:
    """model.gguf, phrases.txt and dumps train / heldout / collateral / anchors under `root`, for
    the `tail` (TAILS; `softcap`: Gemma 2's final logit softcap on the "post" tail)."""
    root = Path(root)
    ids = Ids()
    if softcap is not None and tail != "post":
        raise ValueError("a softcap world is the post tail's (Gemma 2)")
    out = {"model": build_model(root / "model.gguf", tail, softcap)}
    (root / "phrases.txt").write_text("# banned\n" + "\n".join(PHRASES) + "\n")
    out["phrases"] = root / "phrases.txt"
    slop = ["we should test it end to end.", "it is better to do it now rather than later.",
            "we can do it right away.", "keep the test end to end.", "do it now rather than later.",
            "we can test it right away.", "it takes more than an hour.", "keep it far away.",
            "at the end of the day, it is here.", "we can do it right now."]
    train = [(f"train-{i}", chat(ids, *slop[i % 10:] + slop[:i % 10]), ("chat", "slop")) for i in range(2)]
    out["train"] = write_trace(root / "train", train, seed=1, tail=tail)
    held = [("heldout-a", chat(ids, "we test the weekend end to end.", "go right away.",
                                "do it soon rather than later.", "it takes more than a day."), ("chat", "slop"))]
    out["heldout"] = write_trace(root / "heldout", held, seed=2, tail=tail)
    coll = [("collateral-a", ids.text("at the end of the day, it is more than an hour. keep it far away. "
                                      "the end of it is far away, more than a day.\n"), ("plain", "collateral"))]
    out["collateral"] = write_trace(root / "collateral", coll, seed=3, tail=tail)
    anchors = [("anchor-plain", ids.text("the day is here. we go at an hour. keep this. it is the way.\n"),
                ("anchor", "plain")),
               ("anchor-chat", chat(ids, "sure, we can do this today.", "it is here."), ("anchor", "chat"))]
    out["anchors"] = write_trace(root / "anchors", anchors, seed=4, tail=tail)
    return out
