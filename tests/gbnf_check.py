"""A small checker of the GBNF `exactedit shape export --format gbnf` writes (right-linear rules of
`""`, `CLASS rule` or `rule`), run as a nondeterministic automaton, and the naive definition of what
the grammar excludes, for tests/solvers/shaping/test_gbnf.py and the tests that read its grammars."""
from __future__ import annotations

import re

from exactedit.solvers.phrases import phrase_forms


def naive_accepts(text: str, phrases, case: str = "rules") -> bool:
    """No form of a phrase starts at an ASCII word boundary of `text` (the grammar's definition):
    "rules" the forms as written and Capitalized, "fold" a character matching any case of it."""
    forms = {f for p in phrases for f in phrase_forms(p, True)} if case == "rules" else set(phrases)

    def same(x: str, c: str) -> bool:
        return x == c or (case == "fold" and x in (c.lower(), c.upper()))

    for i in range(len(text)):
        if i and re.match(r"[A-Za-z0-9_]", text[i - 1]):
            continue
        for f in forms:
            if len(text) - i >= len(f) and all(same(x, c) for x, c in zip(text[i:i + len(f)], f)):
                return False
    return True


_ESC = re.compile(r"\\x([0-9A-F]{2})|\\u([0-9A-F]{4})|\\U([0-9A-F]{8})|([A-Za-z0-9])")


def _class(body: str):
    """A character class body ("^..." negated) -> a predicate on one character."""
    neg = body.startswith("^")
    body = body[1:] if neg else body
    cps, pos = [], 0
    while pos < len(body):
        m = _ESC.match(body, pos)
        assert m, f"bad class element at {body[pos:]!r}"
        cps.append(int(next(g for g in m.groups()[:3] if g), 16) if m.group(4) is None else ord(m.group(4)))
        pos = m.end()
        if body.startswith("-", pos):
            m = _ESC.match(body, pos + 1)
            assert m, f"bad range end at {body[pos:]!r}"
            hi = int(next(g for g in m.groups()[:3] if g), 16) if m.group(4) is None else ord(m.group(4))
            cps[-1] = (cps[-1], hi)
            pos = m.end()
    ranges = [c if isinstance(c, tuple) else (c, c) for c in cps]
    return lambda ch: any(lo <= ord(ch) <= hi for lo, hi in ranges) != neg


def parse_gbnf(text: str) -> dict:
    """rule -> [(predicate | None, next rule | None)]: ("", None) the empty alternative, (None, r)
    a bare reference; anything else is refused (the checker reads only what we write)."""
    rules = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, sep, body = line.partition(" ::= ")
        assert sep and re.fullmatch(r"[a-z0-9]+", name) and name not in rules, line
        alts = []
        for alt in body.split(" | "):
            if alt == '""':
                alts.append(("", None))
            elif re.fullmatch(r"s\d+", alt):
                alts.append((None, alt))
            else:
                m = re.fullmatch(r"(\[(.*)\]|\.) (s\d+)", alt)
                assert m, f"unexpected alternative {alt!r}"
                alts.append(((lambda ch: True) if m.group(1) == "." else _class(m.group(2)), m.group(3)))
        rules[name] = alts
    for alts in rules.values():
        assert all(nxt in rules for _, nxt in alts if nxt is not None), "a reference to an undefined rule"
    return rules


def gbnf_accepts(rules: dict, text: str) -> bool:
    """Whether `root` derives `text`, every path followed (no determinism assumed)."""
    def close(names):
        todo, seen = list(names), set(names)
        while todo:
            for pred, nxt in rules[todo.pop()]:
                if pred is None and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cur = close({"root"})
    for ch in text:
        cur = close({nxt for r in cur for pred, nxt in rules[r] if pred not in (None, "") and pred(ch)})
        if not cur:
            return False
    return any(pred == "" for r in cur for pred, _ in rules[r])
