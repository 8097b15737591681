"""Shared helpers for the evals tests: a small protocol file and hand-made documents."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

PROTOCOL = """\
name = "unit"
description = "a protocol for the unit tests"

[[traces]]
name = "chat"
path = "dumps/chat"
role = "pool"

[[traces]]
name = "anchors"
path = "dumps/anchors"
role = "anchors"
domain = "plain"

[[traces]]
name = "blind"
path = "dumps/blind"
role = "blind"

[split]
by = ["source", "character"]
seed = 7
train = 0.5
dev = 0.25
test = 0.25
same_doc_heldout = 0.34

[stopping]
every = 5
max_steps = 30

[bars]
bootstrap = 50

[tokens]
specials = ["<|im_end|>", "<think>"]
turn_end = "<|im_end|>"
style = [" owo"]
phrases = [[" end", " to", " end"], [" rather", " than"]]
"""


@dataclass(frozen=True)
class Doc:
    name: str
    source: str
    character: str
    tags: tuple[str, ...] = ()


@pytest.fixture
def protocol_file(tmp_path):
    path = tmp_path / "protocol.toml"
    path.write_text(PROTOCOL, encoding="utf-8")
    return path
