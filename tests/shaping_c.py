"""ctypes bridge to the C reference of the compiled shaping rules (native/shaping/c/shaping.c), built with
the system C compiler: load a compiled rules dict (the JSON) into its structs, call es_shape."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np

import exactedit.native.shaping as shaping_pkg

C_DIR = Path(shaping_pkg.__file__).parent / "c"
I32, U8, F32 = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_uint8), ctypes.c_float


class Vocab(ctypes.Structure):
    _fields_ = [("n_vocab", ctypes.c_int32), ("flags", U8), ("fences", U8),
                ("turn_start", I32), ("n_turn_start", ctypes.c_int32), ("turn_end", I32), ("n_turn_end", ctypes.c_int32),
                ("role", I32), ("n_role", ctypes.c_int32), ("header_end", ctypes.c_int32),
                ("think_open", ctypes.c_int32), ("think_close", ctypes.c_int32),
                ("tool_open", ctypes.c_int32), ("tool_close", ctypes.c_int32)]


class Penalty(ctypes.Structure):
    _fields_ = [("bias", F32), ("n_phrases", ctypes.c_int32), ("final", I32), ("n_prefixes", ctypes.c_int32),
                ("prefix_phrase", I32), ("prefix_offset", I32), ("prefix_bytes", U8), ("n_pieces", ctypes.c_int32),
                ("piece_id", I32), ("piece_offset", I32), ("piece_bytes", U8), ("n_merge", ctypes.c_int32),
                ("merge_id", I32), ("merge_k", I32)]


class Guard(ctypes.Structure):
    _fields_ = [("bias", F32), ("n_targets", ctypes.c_int32), ("targets", I32)]


class Case(ctypes.Structure):
    _fields_ = [("drop", F32), ("active", ctypes.c_int32), ("n_pairs", ctypes.c_int32), ("up", I32), ("low", I32)]


class Rule(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("rule", ctypes.c_void_p)]


class Rules(ctypes.Structure):
    _fields_ = [("vocab", ctypes.POINTER(Vocab)), ("n_rules", ctypes.c_int32), ("rules", ctypes.POINTER(Rule))]


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def build(out_dir) -> ctypes.CDLL:
    """Compile native/shaping/c/shaping.c into `out_dir` (strict warnings, no FMA contraction) and load it."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    lib = Path(out_dir) / "libexactedit_shaping.so"
    subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-o", str(lib), str(C_DIR / "shaping.c"), "-lm"], check=True, capture_output=True, text=True)
    dll = ctypes.CDLL(str(lib))
    dll.es_shape.argtypes = [ctypes.POINTER(Rules), I32, ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
    dll.es_shape.restype = ctypes.c_int64
    return dll


class CRules:
    """A compiled rules dict (the JSON) held in the C structs; `keep` owns every array."""

    def __init__(self, dll, d: dict, persona: bool | None = None):
        self.dll, self.keep = dll, []
        V = d["model"]["vocab"]
        flags = np.zeros(V, np.uint8)
        bits = {"newline": 1, "nl_lead": 2, "sentence_end": 4, "blank": 8, "invisible": 16, "structured": 32,
                "boundary": 64, "ticks": 128}
        for name, bit in bits.items():
            flags[d["classes"][name]] |= bit
        flags ^= 16  # "invisible" lists the complement of VISIBLE
        fences = np.zeros((V, 3), np.uint8)       # per token: lead run, inner markers, trail run
        for i, *run in d["classes"]["fences"]:
            fences[i] = run
        m = d["markup"]
        opt = lambda pair, k: -1 if pair is None else pair[k]  # noqa: E731
        self.vocab = Vocab(V, self._u8(flags), self._u8(fences), self._i32(m["turn_start"]), len(m["turn_start"]),
                           self._i32(m["turn_end"]), len(m["turn_end"]), self._i32(m["role"]), len(m["role"]),
                           -1 if m["header_end"] is None else m["header_end"], opt(m["think"], 0), opt(m["think"], 1),
                           opt(m["tool"], 0), opt(m["tool"], 1))
        rules = []
        for r in d["rules"]:
            if r["kind"] == "prefix-penalty":
                pre = [(j, bytes.fromhex(h)) for j, p in enumerate(r["phrases"]) for h in p["prefixes"]]
                pieces = [(i, bytes.fromhex(h)) for i, h in r["pieces"]]
                s = Penalty(r["bias"], len(r["phrases"]), self._i32([p["final"] for p in r["phrases"]]), len(pre),
                            self._i32([j for j, _ in pre]), self._i32(_offsets([b for _, b in pre])),
                            self._u8(b"".join(b for _, b in pre)), len(pieces), self._i32([i for i, _ in pieces]),
                            self._i32(_offsets([b for _, b in pieces])), self._u8(b"".join(b for _, b in pieces)),
                            len(r["merge_ok"]), self._i32([i for i, _ in r["merge_ok"]]),
                            self._i32([k for _, k in r["merge_ok"]]))
                kind = 1
            elif r["kind"] == "step0-guard":
                s, kind = Guard(r["bias"], len(r["targets"]), self._i32(r["targets"])), 2
            else:
                active = r["active"] if persona is None else persona
                s = Case(r["drop"], int(active), len(r["pairs"]), self._i32([u for u, _ in r["pairs"]]),
                         self._i32([lo for _, lo in r["pairs"]]))
                kind = 3
            self.keep.append(s)
            rules.append(Rule(kind, ctypes.cast(ctypes.pointer(s), ctypes.c_void_p)))
        self.rule_array = (Rule * len(rules))(*rules)
        self.rules = Rules(ctypes.pointer(self.vocab), len(rules), self.rule_array)

    def _i32(self, xs):
        a = np.ascontiguousarray(np.asarray(list(xs) or [0], dtype=np.int32))
        self.keep.append(a)
        return a.ctypes.data_as(I32)

    def _u8(self, xs):
        a = np.ascontiguousarray(np.frombuffer(bytes(xs), np.uint8) if isinstance(xs, (bytes, bytearray))
                                 else np.asarray(xs, np.uint8))
        a = a if a.size else np.zeros(1, np.uint8)
        self.keep.append(a)
        return a.ctypes.data_as(U8)

    def shape(self, history, logits) -> tuple[np.ndarray, int]:
        """(shaped copy of float32 logits, fired bit mask) for the row reading history[-1]."""
        h = np.ascontiguousarray(history, dtype=np.int32)
        out = np.array(logits, dtype=np.float32, copy=True)
        fired = self.dll.es_shape(ctypes.byref(self.rules), h.ctypes.data_as(I32), h.size,
                                  out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        if fired < 0:
            raise ValueError("es_shape refused its input")
        return out, int(fired)


def _offsets(parts) -> list[int]:
    out = [0]
    for b in parts:
        out.append(out[-1] + len(b))
    return out
