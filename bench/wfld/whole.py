"""`exactedit bench solve-wfld`: a whole `solve wfld` at production size on synthetic data, with
where the time goes, as a ratio to one plain full-vocabulary pass over the same rows.

The model is a synthetic hc4 GGUF (n = 2560, h = 640, V = 248,320, d_lo = 320; random valid Q6_K
head bytes, as bench head makes them) whose token table holds the banned phrases' words; three
dumps of `rows` rows each (train and held-out chat with planted phrases, anchors) hold random
activations. The numbers are timings only: on random weights the bars mean nothing.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

PHRASES = ("end to end", "rather than", "right away", "here's what", "exactly what", "short version",
           "what's actually")
LEGIT = ("more than", "the end", "far away", "so what", "this version", "actually")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
TARGET_S = 180.0


@dataclass(frozen=True)
class BenchSolveWfldConfig:
    n: int = 2560
    h: int = 640
    vocab: int = 248320
    d_lo: int = 320
    rows: int = 1024          # per trace: train, held-out, anchors
    slop_every: int = 10      # one planted phrase (or legitimate use) every this many tokens
    gn_iters: int = 3
    special_rows: int = 256
    tile_rows: int = 8192
    seed: int = 0
    workdir: str | None = None

    def __post_init__(self):
        for key in ("n", "h", "vocab", "d_lo", "rows", "slop_every", "gn_iters", "tile_rows"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if self.n % 256 or self.h % 32:
            raise ValueError(f"n must be a multiple of 256 (Q6_K) and h of 32 (Q8_0), got {self.n}, {self.h}")
        if self.vocab < 1024 or self.slop_every < 6:
            raise ValueError("vocab must be >= 1024 and slop_every >= 6")


@dataclass(frozen=True)
class BenchSolveWfldResult:
    config: BenchSolveWfldConfig
    build_s: float                 # writing the synthetic GGUF and dumps (not part of the solve)
    solve_s: float                 # the whole solve_wfld call
    phases: dict                   # solve_wfld's own timings by phase
    gn: list                       # per Gauss-Newton round: seconds by step
    baseline_s: float              # one plain streaming full-vocab pass over all scored rows
    ratio: float                   # solve_s / baseline_s
    conditions: dict
    scored_rows: int
    dw_rel: float

    @property
    def passes(self) -> bool:
        return self.solve_s <= TARGET_S

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(passes=self.passes, target_s=TARGET_S)
        return d


def _vocab(V: int) -> tuple[list[str], list[int]]:
    words = sorted({w for p in PHRASES + LEGIT for w in p.replace("'", " '").split()})
    texts = [" " + w if not w.startswith("'") else w for w in words] + [w.capitalize() for w in words]
    texts += [".", ",", "\n", " the", " a", " we", " it"]
    texts = list(dict.fromkeys(texts))
    enc = [t.replace(" ", "\u0120").replace("\n", "\u010a") for t in texts]
    filler = V - len(enc) - len(SPECIALS)
    tokens = enc + [f"tok{i}" for i in range(filler)] + list(SPECIALS)
    return tokens, [1] * (len(enc) + filler) + [3] * len(SPECIALS)


def _write_model(path: Path, cfg: BenchSolveWfldConfig, tokens, types):
    from exactedit import quant
    from exactedit.bench.head import synthetic_q6k
    from exactedit.quant.gguf import GGUFValueType as VT
    from exactedit.quant.gguf.write import MetaValue, TensorData, write_gguf

    rng = np.random.default_rng(cfg.seed)
    n, h, d_lo = cfg.n, cfg.h, cfg.d_lo

    def q(type_name, rows, cols, scale):
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        return TensorData(type_name, (rows, cols), quant.quantize(x, type_name))

    meta = {"general.architecture": "hc4bench", "hc4bench.block_count": MetaValue(VT.UINT32, 1),
            "hc4bench.embedding_length": MetaValue(VT.UINT32, n), "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.asarray(types, np.int32)}
    tensors = {
        "output_hc_norm.weight": TensorData.from_f32(1 + 0.1 * rng.standard_normal((4, n))),
        "output_hc_down.weight": q("BF16", d_lo, 4 * n, 0.02),
        "output_hc_up.weight": q("BF16", 4 * n, d_lo, 0.05),
        "output.weight": TensorData("Q6_K", (cfg.vocab, n), synthetic_q6k(cfg.vocab, n, cfg.seed)),
        "blk.0.ffn_down_shexp.weight": q("Q8_0", n, h, 0.02),
    }
    write_gguf(path, meta, tensors)


def _stream(rng, cfg, index, with_slop: bool) -> np.ndarray:
    """Filler tokens with a planted phrase (or a legitimate use) every `slop_every` tokens."""
    def ids(text):
        out = []
        for w in text.replace("'", " '").split():
            out.append(index[("\u0120" + w) if not w.startswith("'") else w])
        return out

    toks = list(rng.integers(0, 1000, cfg.rows) + len(index))
    pool = (PHRASES + LEGIT) if with_slop else LEGIT
    for i, at in enumerate(range(3, cfg.rows - 6, cfg.slop_every)):
        seq = ids(pool[i % len(pool)])
        toks[at:at + len(seq)] = seq
    return np.asarray(toks[:cfg.rows], dtype=np.int32)


def _write_dump(path: Path, cfg, toks, name, tags, rng):
    from exactedit.dumps import DocInfo, write_dump

    T, n = toks.size, cfg.n
    half = T // 2
    fields = {"tokens": toks, "next": np.append(toks[1:], -1).astype(np.int32),
              "R": rng.standard_normal((T, 4, n), dtype=np.float32),
              "inj": rng.standard_normal((T, 4), dtype=np.float32),
              "hh": rng.standard_normal((T, cfg.h), dtype=np.float32),
              "sgv": rng.standard_normal(T, dtype=np.float32),
              "yr": 0.5 * rng.standard_normal((T, n), dtype=np.float32)}
    fields["next"][half - 1] = -1
    docs = [DocInfo(f"{name}-a", 0, half, f"{name}-a", "bench", tags),
            DocInfo(f"{name}-b", half, T - half, f"{name}-b", "bench", tags)]
    write_dump(path, arch="hc4", layer=0, fields=fields, docs=docs)


#: the three dumps: name, whether phrases are planted, document tags
TRACES = (("train", True, ("chat", "slop")), ("heldout", True, ("chat", "slop")),
          ("anchors", False, ("anchor", "plain")))


def build_inputs(root: Path, cfg: BenchSolveWfldConfig):
    """(WfldConfig, WfldInputs) of the synthetic model, phrases and dumps (`TRACES`), written under
    root (this bench's and `bench.wfld.gpu`'s)."""
    from exactedit.solvers.l47.config import WfldConfig
    from exactedit.runs.solve.wfld import WfldInputs

    tokens, types = _vocab(cfg.vocab)
    index = {tok: i for i, tok in enumerate(tokens[:len(tokens) - len(SPECIALS)]) if not tok.startswith("tok")}
    _write_model(root / "model.gguf", cfg, tokens, types)
    (root / "phrases.txt").write_text("\n".join(PHRASES) + "\n")
    rng = np.random.default_rng(cfg.seed + 1)
    for name, slop, tags in TRACES:
        _write_dump(root / name, cfg, _stream(rng, cfg, index, slop), name, tags, rng)
    wcfg = WfldConfig(gn_iters=cfg.gn_iters, special_rows=cfg.special_rows, tile_rows=cfg.tile_rows,
                      specials=SPECIALS, turn_end="<|im_end|>", gn_tol=0.0)
    inputs = WfldInputs(str(root / "model.gguf"), str(root / "phrases.txt"), (str(root / "train"),),
                        (str(root / "heldout"),), (), (str(root / "anchors"),))
    return wcfg, inputs


def run_bench_solve_wfld(cfg: BenchSolveWfldConfig, progress: Callable[[int, int], None] | None = None
                         ) -> BenchSolveWfldResult:
    from exactedit.solvers.tail.passes.vocab_pass import vocab_pass
    from exactedit.runs.solve.wfld import solve_wfld
    from exactedit.solvers.tail.logits import open_pair, tail_mix

    with tempfile.TemporaryDirectory(dir=cfg.workdir) as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        wcfg, inputs = build_inputs(root, cfg)
        build_s = time.perf_counter() - t
        t = time.perf_counter()
        res = solve_wfld(wcfg, inputs, root / "bundle", progress=progress)
        solve_s = time.perf_counter() - t

        mixes, tail = [], None
        for name, _, _ in TRACES:
            _, tail, d = open_pair(root / "model.gguf", root / name, check_finite=False)
            mixes.append(tail_mix(tail, d))
        mix = np.concatenate(mixes)
        t = time.perf_counter()
        vocab_pass(mix, tail.head, tile_rows=cfg.tile_rows)
        baseline_s = time.perf_counter() - t
    return BenchSolveWfldResult(cfg, build_s, solve_s, dict(res.timings),
                                [it["seconds"] for it in res.report["iterations"]], baseline_s,
                                solve_s / baseline_s, res.report["conditions"], int(mix.shape[0]),
                                res.report["edit"]["dw_rel"])


def render_bench_solve_wfld(r: BenchSolveWfldResult) -> str:
    c = r.config
    lines = [f"solve wfld at n = {c.n}, h = {c.h}, V = {c.vocab:,}: 3 traces x {c.rows} rows "
             f"({r.scored_rows} scored), {sum(r.conditions.values())} conditions "
             + "(" + ", ".join(f"{k} {v}" for k, v in r.conditions.items() if v) + ")",
             f"  whole solve          {r.solve_s:8.1f} s   target <= {TARGET_S:g} s -> "
             f"{'PASS' if r.passes else 'FAIL'}",
             f"  one full-vocab pass  {r.baseline_s:8.1f} s   (plain streaming pass over the {r.scored_rows} rows)",
             f"  solve / pass         {r.ratio:8.2f}",
             "  where the time goes:"]
    for k, v in r.phases.items():
        lines.append(f"    {k:<14} {v:8.2f} s  {v / r.solve_s:6.1%}")
    for i, s in enumerate(r.gn, 1):
        lines.append(f"    round {i}: " + ", ".join(f"{k} {v:.2f} s" for k, v in s.items()))
    lines.append(f"  (building the synthetic model and dumps took {r.build_s:.1f} s; ||dW||/||W|| = {r.dw_rel:.3g})")
    return "\n".join(lines)
