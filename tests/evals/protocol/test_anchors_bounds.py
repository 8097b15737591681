"""`eval ledger --verify --against` reads files it is pointed at, and every *.json under a directory:
untrusted input (issue 38). A FIFO, /dev/zero or a symlink loop, named or found, is refused naming
the file and --against (a FIFO reported size 0 by stat and was then waited on for ever; /dev/zero
was read until memory ran out); what holds no anchor is still passed over."""
from __future__ import annotations

import json

import pytest

from exactedit.evals.protocol.anchors import HEAD_KIND, MAX_JSON_BYTES, find_anchors
from exactedit.evals.protocol.ledger import LedgerError
from tests.special_files import KINDS, WHY, special

HEAD = {"kind": HEAD_KIND, "seq": 0, "hash": "0" * 64, "ledger": "l"}


def _refused(paths, bad, kind):
    with pytest.raises(LedgerError) as err:
        find_anchors(paths)
    assert str(err.value).startswith(f"{bad}: --against: ") and WHY[kind] in str(err.value), str(err.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_file_named_is_refused(tmp_path, kind):
    """Named: it fell through to a directory search of a non-directory ("no file under it"), a
    loop was "no such file or directory"."""
    bad = special(tmp_path / "head.json", kind)
    _refused([bad], bad, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_file_in_a_searched_directory_is_refused(tmp_path, kind):
    """Found under a directory: a FIFO was waited on, /dev/zero read on, a loop silently skipped."""
    (tmp_path / "good.json").write_text(json.dumps(HEAD))
    bad = special(tmp_path / "z.json", kind)
    _refused([tmp_path], bad, kind)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_bundle_whose_manifest_is_special_is_refused(tmp_path, kind):
    (tmp_path / "bundle").mkdir()
    bad = special(tmp_path / "bundle" / "manifest.json", kind)
    _refused([tmp_path / "bundle"], bad, kind)


def test_what_holds_no_anchor_is_still_passed_over(tmp_path):
    """A dangling link, an oversized file (sparse), JSON nested too deeply (a RecursionError before),
    a directory named *.json: none holds an anchor; the head beside them is found."""
    (tmp_path / "good.json").write_text(json.dumps(HEAD))
    (tmp_path / "dangling.json").symlink_to(tmp_path / "absent")
    with open(tmp_path / "big.json", "wb") as fh:
        fh.truncate(MAX_JSON_BYTES + 1)
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "dir.json").mkdir()
    assert [a.source for a in find_anchors([tmp_path])] == [str(tmp_path / "good.json")]
    with pytest.raises(LedgerError, match=r"deep\.json: --against: holds no ledger head"):
        find_anchors([tmp_path / "deep.json"])
