"""`exactedit bench dump-verify` runs end to end and reports consistent sizes (no timing asserted)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from exactedit.bench.dump_verify import N, H, S, DumpVerifyBenchConfig, render_dump_verify, run_dump_verify_bench
from exactedit.cli import main


def test_bench_reports_the_bytes_it_hashed(tmp_path):
    r = run_dump_verify_bench(DumpVerifyBenchConfig(mb=1, repeats=1, workdir=str(tmp_path)))
    data = r.rows * (4 * (S * N + S + H + 1 + N) + 8)
    assert r.rows >= 1 and data < r.bytes < data + 7 * 256  # the seven .npy files: data plus headers
    assert r.hash_gbps > 0 and r.read_gbps > 0 and "GB/s" in render_dump_verify(r)
    assert not list(tmp_path.iterdir())  # the synthetic dump is removed


def test_cli_json(tmp_path):
    res = CliRunner().invoke(main, ["bench", "dump-verify", "--mb", "1", "--repeats", "1", "--json",
                                    "--workdir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["bytes"] > 0
