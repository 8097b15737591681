"""The live generation loop: llama.cpp's sampler chain with the shaping rules in front of it.

The sampler chain is llama.cpp's own (`llama_sampler_chain`: top-k, temperature, seeded `dist`,
as every generation here uses), with two samplers of ours in front of it, written against
llama.cpp's `llama_sampler_i` interface:
- `shape`: reads the candidate array llama.cpp built from the raw logits (`cur_p`, one entry
  per token in id order), keeps a copy, and writes `solvers.shaping.rules.Shaper`'s shaped logits back;
- `probe`: reads the array again, after `shape`, as the rest of the chain receives it.
The shaper is pushed every token of the history (the rendered prompt, then each sampled token),
so its trigger state is the one `solvers.shaping.triggers` computes offline for the same tokens.

Generation has one door, `native.llamacpp.sample.sample_replies` (native/llamacpp/sample.py): this
module holds what it returns and its one-at-a-time engine, `_generate(engine, prompt, config,
shaper)` (any object with `rules`, `reset()`, `push(token)` and `shape(logits) -> (logits, fired)`;
sample.py adapts a plain logits processor to it). A reply is a `Generation`: the new tokens, its
seed and why it stopped, which rules fired at each step, the KL(unshaped || shaped) of each step's
distribution (temperature 1, full vocabulary, float64), and with `record` the raw logits, the logits
the chain received, and the engine's own `llama_get_logits_ith` row, per step (float32 [steps, V]).
Without a shaper the same loop and chain run (the base arms of a comparison), so arms differ only
by the rules. With a `rewind` (native/llamacpp/rewind.py, `--rules-mode rewind`) the loop also rolls
back: where a banned phrase or a variant completes, the reply's tokens from the phrase's first one
are dropped with their KV cells (`llama_memory_seq_rm`) and their per-step records, the shaper is
rebuilt over what is kept, and that step is sampled again with the phrase's first token banned
(-inf in the `shape` sampler, after the rules). Without one the loop is what it always was.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable

import numpy as np

from exactedit.native.llamacpp.engine import EngineError, LlamaEngine, sampler_chain

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
# llama.cpp's `dist` takes a uint32_t seed and reads LLAMA_DEFAULT_SEED (0xFFFFFFFF) as "draw a
# random one": through ctypes a larger seed wraps (2**32 + 7 samples as 7) and -1 becomes random.
# The seeds a reply may have are those that reproduce it: 0 <= seed < SEED_LIMIT.
SEED_LIMIT = 0xFFFFFFFF


def seed_problem(seed, what: str = "seed") -> str | None:
    """Why `seed` is not a seed llama.cpp reproduces (see SEED_LIMIT), or None when it is."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        return f"{what}: expected an integer, got {seed!r}"
    if not 0 <= int(seed) < SEED_LIMIT:
        return (f"{what}: {int(seed)} is outside llama.cpp's seeds, 0 to {SEED_LIMIT - 1} (its sampler takes 32 "
                f"bits, so a larger seed wraps to another, and {SEED_LIMIT} or -1 means a random seed, which no "
                "rerun reproduces)")
    return None


@dataclass(frozen=True)
class Sampling:
    """How replies are sampled: the one config of every generation here (`sample.sample_replies`
    and the commands built on it); `seed` seeds llama.cpp's `dist` (0 <= seed < SEED_LIMIT)."""

    max_new: int = 64
    temperature: float = 0.8
    top_k: int = 40
    seed: int = 0

    def __post_init__(self):
        if self.max_new < 1 or self.top_k < 1 or not self.temperature > 0:
            raise EngineError("Sampling", "values", "max_new, top_k >= 1 and temperature > 0")
        bad = seed_problem(self.seed)
        if bad is not None:
            raise EngineError("Sampling", "seed", bad.removeprefix("seed: "))


@dataclass(frozen=True, eq=False)
class Generation:
    """One reply of `sample.sample_replies`, whichever loop sampled it."""

    prompt: np.ndarray            # int32 [P] the rendered prompt's tokens
    tokens: np.ndarray            # int32 [steps] sampled tokens (the stop token included when one came)
    seed: int                     # the seed of its Sampling (llama.cpp's `dist`)
    stop: str                     # "turn_end", "end_of_generation" (another stop token), "max_new" (cut)
                                  # or "halt" (ended by the loop's `on_token` hook)
    fired: np.ndarray             # bool [steps, rules]
    kl: np.ndarray                # float64 [steps] KL(unshaped || shaped) at T = 1 (0 without rules)
    raw: np.ndarray | None = None        # float32 [steps, V] what llama.cpp handed the chain
    received: np.ndarray | None = None   # float32 [steps, V] what the chain after the rules received
    engine_rows: np.ndarray | None = None  # float32 [steps, V] llama_get_logits_ith(ctx, -1)
    kl_rules: np.ndarray | None = None     # float64 [steps, rules] KL of each fired rule applied alone
    rewinds: tuple = ()                    # rewind mode: the reply's rewind.RewindEvent, in order

    @property
    def truncated(self) -> bool:
        """Cut at max_new, no stop token."""
        return self.stop == "max_new"

    @property
    def sequence(self) -> np.ndarray:
        return np.concatenate([self.prompt, self.tokens]).astype(np.int32)


def stop_kind(out, stopped: bool, turn_end: frozenset) -> str:
    """Why a reply ended: "max_new" (no stop token), "turn_end" (its last token is one of
    `turn_end`) or "end_of_generation" (another stop token)."""
    if not stopped:
        return "max_new"
    return "turn_end" if int(out[-1]) in turn_end else "end_of_generation"


def step_kl(raw: np.ndarray, shaped: np.ndarray) -> float:
    """KL(softmax(raw) || softmax(shaped)) in float64 (temperature 1, full vocabulary)."""
    a, b = raw.astype(np.float64), shaped.astype(np.float64)
    la = a - np.logaddexp.reduce(a)
    lb = b - np.logaddexp.reduce(b)
    p = np.exp(la)
    keep = p > 0
    return float(np.sum(p[keep] * (la[keep] - lb[keep])))


def _alone_kl(rule, hits, raw: np.ndarray) -> float:
    one = raw.copy()
    rule.apply_row(one, hits)
    return step_kl(raw, one)


class _Sampler:
    """A llama_sampler whose `apply` calls `fn(cur_p)`; exceptions are kept (never cross into C)."""

    def __init__(self, lib, fn):
        self.error: BaseException | None = None

        def apply(_smpl, cur_p):
            try:
                fn(cur_p.contents)
            except BaseException as exc:  # noqa: BLE001 - reported after llama_sampler_sample returns
                self.error = exc

        self._apply = lib.llama_sampler_i_apply(apply)
        iface = lib.llama_sampler_i()
        iface.apply = self._apply
        iface.name = lib.llama_sampler_i_name(0)
        iface.accept = lib.llama_sampler_i_accept(0)
        iface.reset = lib.llama_sampler_i_reset(0)
        iface.clone = lib.llama_sampler_i_clone(0)
        iface.free = lib.llama_sampler_i_free(0)  # the chain must not free our memory
        self._iface = iface
        self.sampler = lib.llama_sampler_init(ctypes.pointer(iface), None)


def _cur(arr, n_vocab: int) -> np.ndarray:
    """The candidate array as a structured numpy view (no copy)."""
    if arr.size != n_vocab or arr.sorted:
        raise EngineError("llama_sampler", "cur_p", f"expected {n_vocab} unsorted candidates, got {arr.size}")
    buf = (ctypes.c_char * (arr.size * _TOKEN_DATA.itemsize)).from_address(ctypes.addressof(arr.data.contents))
    return np.frombuffer(buf, dtype=_TOKEN_DATA)


class StepShaping:
    """One reply's `shape` and `probe` samplers (module doc) and what they saw at each step:
    which rules fired, KL(unshaped || shaped), each fired rule's KL alone, and with `record`
    the raw and received rows. `start(prompt)` pushes the prompt into the shaper, `accept(tok)`
    each sampled token; `samplers` go first in the reply's chain (`sampler_chain(first=...)`)
    and come out of it with `detach(chain)` before the chain is freed (their memory is Python's)."""

    def __init__(self, lib, n_vocab: int, shaper=None, *, record: bool = False):
        self.lib, self.V, self.shaper, self.record = lib, n_vocab, shaper, record
        self.n_rules = len(shaper.rules) if shaper is not None else 0
        self.alone = hasattr(shaper, "hits")  # solvers.shaping.rules.Shaper: each rule's own effect is measured too
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.steps = {"raw": [], "received": [], "engine": [], "fired": [], "kl": [], "kl_rules": []}
        self.samplers = [_Sampler(lib, self._shape), _Sampler(lib, self._probe)]
        self.banned: Callable[[], tuple] | None = None     # rewind mode: tokens banned at this step

    @property
    def open_text(self) -> bool:
        """Whether the current row is open text, where the rules may fire (True without a trigger state)."""
        row = getattr(self.shaper, "row", None)
        return True if row is None else bool(row.open_text)

    def start(self, prompt) -> None:
        if self.shaper is not None:
            self.shaper.reset()
            for t in prompt:
                self.shaper.push(int(t))

    def _shape(self, arr) -> None:
        cur = _cur(arr, self.V)
        if not np.array_equal(cur["id"], self.ids):
            raise EngineError("llama_sampler", "cur_p", "candidates are not in token-id order")
        raw = cur["logit"].copy()
        if self.shaper is None:
            shaped, fired = raw, ()
        else:
            shaped, fired = self.shaper.shape(raw)
            cur["logit"] = shaped
        self.steps["fired"].append(fired)
        self.steps["kl"].append(step_kl(raw, shaped) if any(fired) else 0.0)
        if self.alone:
            self.steps["kl_rules"].append([_alone_kl(rule, h, raw) if h else 0.0
                                           for rule, h in zip(self.shaper.rules, self.shaper.hits())])
        if self.record:
            self.steps["raw"].append(raw)
        if self.banned is not None and (ban := self.banned()):
            cur["logit"][list(ban)] = -np.inf

    def _probe(self, arr) -> None:
        if self.record:
            self.steps["received"].append(_cur(arr, self.V)["logit"].copy())

    def accept(self, tok: int) -> None:
        """After `llama_sampler_sample`: re-raise what a sampler caught, push the token."""
        for smp in self.samplers:
            if smp.error is not None:
                raise smp.error
        if self.shaper is not None:
            self.shaper.push(tok)

    def rewind(self, prompt, kept: list) -> None:
        """Back to the step after the reply's `kept` tokens (rewind mode): later steps' records
        dropped, the shaper's state rebuilt over the prompt and `kept`."""
        for v in self.steps.values():
            del v[len(kept):]
        self.start(prompt)
        if self.shaper is not None:
            for t in kept:
                self.shaper.push(int(t))

    def detach(self, chain) -> None:
        for _ in self.samplers:
            self.lib.llama_sampler_chain_remove(chain, 0)

    def generation(self, prompt: np.ndarray, out: list, seed: int, stop: str, rewinds: tuple = ()) -> Generation:
        st, V, n = self.steps, self.V, len(out)
        fired = np.array(st["fired"], dtype=bool).reshape(n, self.n_rules)
        stack = (lambda k: np.stack(st[k]) if st[k] else np.zeros((0, V), np.float32)) if self.record \
            else (lambda k: None)
        kl_rules = np.array(st["kl_rules"], dtype=np.float64).reshape(n, self.n_rules) if self.alone else None
        return Generation(prompt, np.array(out, dtype=np.int32), int(seed), stop, fired,
                          np.array(st["kl"], dtype=np.float64), stack("raw"), stack("received"), stack("engine"),
                          kl_rules, tuple(rewinds))


def _generate(engine: LlamaEngine, toks: np.ndarray, config: Sampling, shaper=None, *, record: bool = False,
              stop_ids: frozenset | None = None, turn_end: frozenset = frozenset(),
              on_token: Callable[[int], bool | None] | None = None, rewind=None) -> Generation:
    """The one-at-a-time engine behind `sample.sample_replies` (which checks the prompt, int32
    [1..n_ctx - max_new]): up to `config.max_new` tokens after `toks`, `shaper` (or None) applied at
    every step; stops after a token of `stop_ids` (None: the vocabulary's end-of-generation
    tokens), which is kept. `on_token(token)` is called after each sampled token (a streaming
    server's hook); when it returns true the reply ends after that token (stop "halt").
    `rewind`: a rewind.Rewinder (rewind mode): where a banned phrase completes the reply rolls back
    to its first token (its KV cells removed) and samples again with that token banned there, and
    `on_token` sees a token only once it can no longer be rolled back."""
    lib, s, V = engine._lib, engine.settings, engine.n_vocab
    steps = StepShaping(lib, V, shaper, record=record)
    steps.start(toks)
    ctx = engine._context(None)
    if rewind is not None:
        steps.banned, sent = rewind.banned, 0
    chain = sampler_chain(lib, config.top_k, config.temperature, config.seed, [smp.sampler for smp in steps.samplers])
    batch = lib.llama_batch_init(max(s.n_batch, 1), 0, 1)
    out: list[int] = []
    stopped = halt = False
    try:
        pending, pos = list(toks), 0
        while True:
            for start in range(0, len(pending), s.n_batch):
                piece = pending[start:start + s.n_batch]
                for i, t in enumerate(piece):
                    batch.token[i], batch.pos[i] = int(t), pos + i
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                    batch.logits[i] = int(start + i == len(pending) - 1)
                batch.n_tokens = len(piece)
                if lib.llama_decode(ctx, batch) != 0:
                    raise EngineError(engine.path, "llama_decode", f"failed at position {pos}")
                pos += len(piece)
            if len(out) >= config.max_new:
                break
            if record:
                row = lib.llama_get_logits_ith(ctx, -1)
                steps.steps["engine"].append(np.ctypeslib.as_array(row, shape=(V,)).copy())
            open_text = steps.open_text if rewind is not None else True
            tok = int(lib.llama_sampler_sample(chain, ctx, -1))
            steps.accept(tok)
            out.append(tok)
            is_stop = (tok in stop_ids) if stop_ids is not None else engine.is_eog(tok)
            if rewind is None:
                halt = on_token is not None and bool(on_token(tok))
            else:
                back = rewind.push(tok, open_text, ended=is_stop or len(out) >= config.max_new)
                if back is not None:            # roll back: keep `back` tokens, decode the last kept again
                    del out[back:]
                    steps.rewind(toks, out)
                    pos = len(toks) + back - 1
                    lib.llama_memory_seq_rm(lib.llama_get_memory(ctx), 0, pos, -1)
                    pending = [int(toks[pos]) if back == 0 else out[-1]]
                    continue
                sent, halt = _hand_over(out, sent, rewind.committed, on_token)
                if halt and sent < len(out):    # halted on a token before the last: the reply ends there
                    del out[sent:]
                    steps.rewind(toks, out)
                    is_stop = False
            if is_stop:
                stopped = True
                break
            if halt:
                break
            pending = [tok]
    finally:
        steps.detach(chain)
        lib.llama_batch_free(batch)
        lib.llama_sampler_free(chain)
        lib.llama_free(ctx)
    stop = "halt" if halt and not stopped else stop_kind(out, stopped, turn_end)
    return steps.generation(toks, out, config.seed, stop, () if rewind is None else rewind.events)


def _hand_over(out: list, sent: int, upto: int, on_token) -> tuple[int, bool]:
    """Rewind mode: `on_token` for the tokens out[sent:upto] (those no longer rolled back), up to
    the first that halts; (tokens handed over, halted)."""
    while sent < upto:
        sent += 1
        if on_token is not None and on_token(out[sent - 1]):
            return sent, True
    return sent, False
