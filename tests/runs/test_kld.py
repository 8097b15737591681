"""`exactedit kld` with llama.cpp's files, offline: a base file written from the base model and read
back gives the same report as the base model itself; the window defaults to llama-perplexity's
rows; chunk layout and the file's tokens are checked; the CLI wires it (JSON keys, --rows-out)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.evals.kl.compare import KldConfig, KldConfigError
from exactedit.evals.kl.base_file import read_base_file
from exactedit.runs.data.kld import KldFiles, run_kld
from tests.kld_world import CTX, make_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("kr")
    return root, make_world(root, dumps=(("d1", 2, [CTX, CTX]), ("d2", 1, [CTX]), ("odd", 1, [5], 5)))


def test_written_base_file_reads_back_to_the_same_report(world):
    root, (base, edited, d1, d2, _) = world
    f = root / "base.kld"
    cfg = KldConfig(dumps=(d1, d2), model=base, edited=edited, stats="llama-perplexity", match_engine="llamacpp")
    wrote = run_kld(cfg, KldFiles(write_base=str(f)))
    b = read_base_file(f)
    assert (b.n_ctx, b.n_chunk, b.rows) == (CTX, 3, 3 * (CTX - 1 - CTX // 2))
    assert wrote.wrote_base_sha256 == b.sha256()
    assert [s for d in wrote.comparison.dumps for s in d.spans] == [("d1-0", 6, 11), ("d1-1", 18, 23), ("d2-0", 6, 11)]
    read = run_kld(KldConfig(dumps=(d1, d2), edited=edited, stats="llama-perplexity", match_engine="llamacpp"),
                   KldFiles(base_file=str(f)))
    assert repr(read.comparison.llamacpp) == repr(wrote.comparison.llamacpp)
    assert read.base_file_sha256 == wrote.wrote_base_sha256 and read.to_dict()["base_file"]["path"] == str(f)
    # only the base side: no edited model
    only = run_kld(KldConfig(dumps=(d1, d2), model=base, stats="llama-perplexity", match_engine="llamacpp"),
                   KldFiles(write_base=str(root / "only.kld")))
    assert (root / "only.kld").read_bytes() == f.read_bytes() and only.comparison.llamacpp is None
    assert only.comparison.base_ppl is not None


def test_base_file_of_other_chunks_is_refused(world):
    root, (base, edited, d1, d2, _) = world
    f = root / "b2.kld"
    run_kld(KldConfig(dumps=(d1,), model=base, stats="llama-perplexity"), KldFiles(write_base=str(f)))
    with pytest.raises(KldConfigError, match="rows"):
        run_kld(KldConfig(dumps=(d1, d2), edited=edited, stats="llama-perplexity"), KldFiles(base_file=str(f)))
    with pytest.raises(KldConfigError, match="predicts token"):
        run_kld(KldConfig(dumps=(d2, d2), edited=edited, stats="llama-perplexity"), KldFiles(base_file=str(f)))


def test_write_base_needs_whole_chunks(world):
    root, (base, edited, d1, _, odd) = world
    with pytest.raises(KldConfigError, match="chunks all have n_ctx"):
        run_kld(KldConfig(dumps=(d1, odd), model=base, stats="llama-perplexity"),
                KldFiles(write_base=str(root / "x.kld")))
    with pytest.raises(KldConfigError, match="--doc-rows 6:11"):
        run_kld(KldConfig(dumps=(d1,), model=base, stats="llama-perplexity", doc_rows="2:11"),
                KldFiles(write_base=str(root / "x.kld")))
    with pytest.raises(KldConfigError, match="give one"):
        KldFiles(base_file="a", write_base="b")
    assert not (root / "x.kld").exists() and not (root / "x.kld.tmp").exists()


def test_cli_json_and_rows_out(world):
    root, (base, edited, d1, d2, _) = world
    args = ["kld", "--model", base, "--edited", edited, "--dump", d1, "--dump", d2, "--doc-rows", "6:11"]
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["stats"] == "exact" and out["rows"] == 15 and len(out["per_row_kld"]) == 15
    assert set(out["kld"]) == {"mean", "median", "p90", "p95", "p99", "p999", "max", "min"}
    assert {"same_top", "ppl_base", "ppl_edited", "rms_dp"} <= set(out)
    npy = root / "rows.npy"
    r = CliRunner().invoke(main, args + ["--stats", "llama-perplexity", "--match-engine", "llamacpp",
                                         "--rows-out", str(npy), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert "per_row_kld" not in out and out["rows_out"]["path"] == str(npy)
    assert np.load(npy).shape == (15,) and out["kld"]["mean"] == pytest.approx(np.load(npy).mean())
    r = CliRunner().invoke(main, args + ["--stats", "llama-perplexity", "--match-engine", "llamacpp"])
    assert r.exit_code == 0 and "====== KL divergence statistics ======" in r.output
    assert "Mean    KLD: " in r.output and "(llama-perplexity itself prints no summary below 100 rows)" in r.output
    r = CliRunner().invoke(main, ["kld", "--edited", edited, "--dump", d1, "--stats", "llama-perplexity"])
    assert r.exit_code != 0 and "--model" in r.output


def _no_constants(text: str):
    def refuse(name):
        raise AssertionError(f"JSON holds {name}")
    return json.loads(text, parse_constant=refuse)


def test_base_file_of_another_vocabulary_is_our_error(world):
    """Issue 26: a base file whose n_vocab is not the edited model's: our error, not a traceback."""
    from exactedit.evals.kl.base_file import BaseFileWriter, KldBaseFileError, rows_per_chunk
    from exactedit.evals.kl.llamacpp import encode_base
    from tests.kld_world import V

    root, (base, edited, d1, _, _) = world
    f = root / "other-vocab.kld"
    rows, _ = encode_base(np.zeros((rows_per_chunk(CTX) * 2, V + 1), np.float32), np.zeros(10, np.int64))
    from exactedit.dumps import read_dump

    toks = np.asarray(read_dump(d1).tokens, np.int64)          # the dump's chunks: only n_vocab is wrong
    with BaseFileWriter(f, CTX, V + 1, toks) as w:
        w.write(rows)
        w.close()
    with pytest.raises(KldBaseFileError, match=f"the model has {V} tokens"):
        run_kld(KldConfig(dumps=(d1,), edited=edited, stats="llama-perplexity"), KldFiles(base_file=str(f)))
    r = CliRunner().invoke(main, ["kld", "--edited", edited, "--dump", d1, "--stats", "llama-perplexity",
                                  "--base-file", str(f)])
    assert r.exit_code != 0 and "Traceback" not in r.output and "n_vocab" in r.output


def test_json_has_no_infinity_or_nan(world):
    """Non-finite numbers (one chunk: the tool's uncertainties are NaN) are null in --json."""
    root, (base, edited, d1, _, _) = world
    res = run_kld(KldConfig(dumps=(d1,), model=base, edited=edited, stats="llama-perplexity", doc_rows="6:7"))
    text = json.dumps(res.to_dict(), allow_nan=False)
    out = _no_constants(text)
    assert out["rows"] == 2
    r = CliRunner().invoke(main, ["kld", "--model", base, "--edited", edited, "--dump", d1, "--doc-rows", "6:7",
                                  "--stats", "llama-perplexity", "--json"])
    assert r.exit_code == 0, r.output
    _no_constants(r.stdout)
