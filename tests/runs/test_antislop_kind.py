"""`exactedit antislop --phrases found.json --kind`: discover's style entries by default, others on
request, an unknown kind refused with the run's other setting problems."""
from __future__ import annotations

import json

import pytest

from exactedit.runs.antislop.config import AntislopConfig, AntislopError


def test_the_runs_phrase_list_takes_its_kind(tmp_path):
    found = tmp_path / "found.json"
    found.write_text(json.dumps({"phrases": [{"phrase": "in Python", "kind": "topic"},
                                             {"phrase": "you can use", "kind": "style"}]}))
    assert AntislopConfig(phrases=str(found)).phrase_list() == ("you can use",)
    assert AntislopConfig(phrases=str(found), kind="topic").phrase_list() == ("in Python",)
    assert AntislopConfig(phrases=str(found), kind="any").phrase_list() == ("in Python", "you can use")
    with pytest.raises(AntislopError, match=r"kind \(--kind\): kind: expected one of style, mixed, topic"):
        AntislopConfig(phrases=str(found), kind="subject")
