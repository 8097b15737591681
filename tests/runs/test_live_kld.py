"""`exactedit kld` against llama.cpp's own `llama-perplexity --kl-divergence` (the prebuilt tool of
llama-cpp-python 0.3.36's source, ../shared/tools/llama-perplexity-0.3.36) on Qwen: base vs a copy
with rows of blk.27.ffn_down edited, on the two 512-token chunks of tests/runs/data/kld_text.txt
(510 scored rows).

1. the tool records the base (`--kl-divergence-base`) and scores the edited file;
2. exactedit dumps the same chunks through llama.cpp, then `kld --match-engine llamacpp --stats
   llama-perplexity` prints the tool's statistics line for line, and its `--write-base` file is
   byte-identical to the tool's;
3. the tool reads exactedit's file and prints the same report; `kld --base-file` on the tool's file
   prints it too.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live

TEXT = Path(__file__).parent / "data" / "kld_text.txt"
TOOL_ENV = "EXACTEDIT_LLAMA_PERPLEXITY"
TOOL = Path(__file__).resolve().parents[2].parent / "shared" / "tools" / "llama-perplexity-0.3.36" / "llama-perplexity"
N_CTX = 512
DOWN_ROWS = np.arange(0, 1536, 24)      # 64 of blk.27.ffn_down's 1,536 output rows


@pytest.fixture(scope="module")
def qwen():
    return oracles.live_model("qwen")


@pytest.fixture(scope="module")
def tool():
    path = Path(os.environ.get(TOOL_ENV, TOOL))
    if not path.is_file():
        oracles.unavailable("llama-perplexity", f"{path}: not found (the prebuilt llama.cpp tool of "
                            f"../shared/tools; or set {TOOL_ENV})")
    return path


def _run_tool(tool, model, base_file, *kl):
    cmd = [str(tool), "-m", str(model), "-f", str(TEXT), "-c", str(N_CTX), "-b", "512", "-ub", "512", "-t", "2",
           "-fa", "off", "--kl-divergence-base", str(base_file), *kl]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, r.stderr


def _report(text: str) -> list[str]:
    """The tool's table and summary: non-empty lines from the table header to 'Same top p'."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("chunk             PPL"))
    stop = next(i for i, ln in enumerate(lines) if ln.startswith("Same top p:"))
    return lines[start:stop + 1]


@pytest.fixture(scope="module")
def world(qwen, tool, tmp_path_factory):
    from exactedit import quant
    from exactedit.quant import gguf
    from exactedit.solvers.apply import apply_bundle
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    root = tmp_path_factory.mktemp("kld")
    rng = np.random.default_rng(17)
    with gguf.open(qwen) as g:
        down = g.tensor("blk.27.ffn_down.weight")
        w = np.concatenate([g.read_rows(down.name, int(r), int(r) + 1) for r in DOWN_ROWS])
        new = w + np.float32(0.005) * rng.standard_normal(w.shape).astype(np.float32)
        edit = TensorEdit(down.name, "rows", "Q6_K", down.shape, quant.quantize(new, "Q6_K"), DOWN_ROWS)
        sha = g.sha256()
    bundle = write_bundle(root / "bundle", solver="test-by-hand", inputs=[InputRef("model", str(qwen), sha)],
                          config={}, edits=[edit])
    edited = apply_bundle(bundle.path, qwen, root / "edited.gguf").out
    tool_base = root / "tool.kld"
    _, base_log = _run_tool(tool, qwen, tool_base)
    tool_out, _ = _run_tool(tool, edited, tool_base, "--kl-divergence")
    from exactedit.cli import main

    dump = root / "dump"
    r = CliRunner().invoke(main, ["engine", "perplexity-chunks", "--model", str(qwen), "--text", str(TEXT),
                                  "--ctx", str(N_CTX), "--out", str(dump), "--json"])
    assert r.exit_code == 0, r.output
    return {"root": root, "edited": edited, "tool_base": tool_base, "base_log": base_log,
            "tool_out": tool_out, "dump": dump, "chunks": json.loads(r.stdout)}


def test_chunks_are_the_tools(world):
    from exactedit.evals.kl.base_file import read_base_file

    from exactedit.dumps import read_dump

    b = read_base_file(world["tool_base"])
    assert (b.n_ctx, b.n_chunk, b.rows) == (N_CTX, 2, 510)
    d = read_dump(world["dump"])
    assert [doc.rows for doc in d.docs] == [N_CTX, N_CTX] and world["chunks"]["ubatch_sizes"] == [512, 512]
    assert world["chunks"]["bos"] is None                 # Qwen's vocabulary adds no BOS: tokens as the text's
    assert np.array_equal(np.asarray(d.tokens), b.tokens)


@pytest.fixture(scope="module")
def ours(qwen, world):
    """`exactedit kld --match-engine llamacpp --stats llama-perplexity --write-base F` through the CLI."""
    from exactedit.cli import main

    written = world["root"] / "ours.kld"
    r = CliRunner().invoke(main, ["kld", "--model", str(qwen), "--edited", str(world["edited"]),
                                  "--dump", str(world["dump"]), "--doc-rows", f"{N_CTX // 2}:{N_CTX - 1}",
                                  "--match-engine", "llamacpp", "--stats", "llama-perplexity",
                                  "--write-base", str(written)])
    assert r.exit_code == 0, r.output
    return r.stdout, written


def test_statistics_equal_the_tools_printed_digits(world, ours):
    text, _ = ours
    want = _report(world["tool_out"])
    assert len(want) == 3 + 7 + 13 + 17               # table (header, 2 chunks) and the three sections
    assert _report(text) == want
    assert float(want[-1].split()[3]) < 100           # the edit moved some argmaxes: the check has teeth


def test_written_base_file_is_the_tools_and_is_accepted(tool, world, ours):
    text, written = ours
    assert written.read_bytes() == world["tool_base"].read_bytes()
    estimate = re.search(r"Final estimate: PPL = \S+ \+/- \S+", world["base_log"]).group(0)
    assert f"base pass: {estimate}" in text         # the tool's base-pass PPL, from the same codes
    again, _ = _run_tool(tool, world["edited"], written, "--kl-divergence")
    assert _report(again) == _report(world["tool_out"])


def test_base_file_from_the_tool_scores_the_same(world):
    from exactedit.evals.kl.compare import KldConfig
    from exactedit.evals.kl.llamacpp_stats import render_chunk_table, render_lp_report
    from exactedit.runs.data.kld import KldFiles, run_kld

    r = run_kld(KldConfig(dumps=(str(world["dump"]),), edited=str(world["edited"]), match_engine="llamacpp",
                          stats="llama-perplexity"), KldFiles(base_file=str(world["tool_base"])))
    s = r.comparison.llamacpp
    lines = [ln for ln in render_chunk_table(s) + render_lp_report(s) if ln]
    assert lines == _report(world["tool_out"])
    assert r.comparison.summary()["rows"] == 510
