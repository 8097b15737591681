"""`exactedit demo`: the whole workflow on the bundled fixture, end to end.

1. register the fixture's protocol in a fresh workspace (DIR/ws) and record its splits;
2. `solve head` (rank 1, the protocol's stopping rule) -> DIR/head/;
3. `solve wfld` (the anti-slop edit of blk.47.ffn_down_shexp) -> DIR/wfld/;
4. score the wfld bundle on dev (`eval score`) -> DIR/wfld-dev/dev-report.*;
5. the one-shot blind sign-off of the wfld bundle on the fixture's blind document -> DIR/blind/,
   with the exact command line written to DIR/blind.cmd (running it again is refused).

The demo's bundles and blind document are the same on every run, so its blind run is claimed in a
registry of its own (DIR/ws/blind-registry) rather than the user-level one (evals.protocol.registry): a
second demo elsewhere is a second demonstration, not a second sign-off of real work.

Every step goes through the same library calls as the CLI commands; the fixture's files are only
read. Nothing here prints: the result carries what the CLI reports.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from exactedit.errors import ExacteditError
from exactedit.fixtures import DEFAULT_FIXTURE

Progress = Callable[[str, int, int], None]


class DemoError(ExacteditError):
    """The demo cannot run (missing fixture files, an output directory in the way)."""


@dataclass(frozen=True)
class DemoResult:
    out: Path
    workspace: Path
    head: object            # solvers.head.solve.HeadSolveResult
    head_bundle: object     # solvers.bundle.Bundle
    wfld: object            # solvers.l47.solve.WfldResult
    dev: object             # runs.eval.workflow.ScoreResult
    blind: object           # runs.eval.blind.BlindResult
    blind_cmd: str


def _quote(args) -> str:
    return " ".join(shlex.quote(str(a)) for a in args)


def _fixture_files(fixture: Path) -> dict[str, Path]:
    files = {"model": fixture / "model.gguf", "protocol": fixture / "protocol.toml",
             "phrases": fixture / "phrases.txt"}
    for role in ("train", "dev", "test", "blind", "anchors", "collateral"):
        files[role] = fixture / "dumps" / role
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise DemoError(f"{fixture}: the fixture lacks {missing}")
    return files


def run_demo(out, *, fixture=DEFAULT_FIXTURE, progress: Progress | None = None) -> DemoResult:
    """Run the demo into the new directory `out` (refused if it exists and is not empty)."""
    from exactedit.runs.eval import workflow
    from exactedit.evals.scoring.evaluate import ScoreConfig
    from exactedit.solvers.head.config import HeadSolveConfig
    from exactedit.runs.solve.head import solve_head, write_head_bundle
    from exactedit.solvers.l47.config import WfldConfig
    from exactedit.runs.solve.wfld import WfldInputs, solve_wfld

    out, fixture = Path(out).resolve(), Path(fixture).resolve()
    if out.exists() and any(out.iterdir()):
        raise DemoError(f"{out}: the demo's output directory exists and is not empty; give a new one")
    f = _fixture_files(fixture)
    ws = out / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    step = (lambda label: (lambda done, total: progress(label, done, total))) if progress else (lambda label: None)

    workflow.register(f["protocol"], ws, _quote(["exactedit", "eval", "register", f["protocol"], "--workspace", ws]))
    workflow.split(f["protocol"], ws, _quote(["exactedit", "eval", "split", "--protocol", f["protocol"],
                                              "--workspace", ws]))

    head_cmd = ["exactedit", "solve", "head", "--model", f["model"], "--train", f["train"], "--dev", f["dev"],
                "--test", f["test"], "--protocol", f["protocol"], "--rank", 1, "--workspace", ws,
                "--out", out / "head"]
    head = solve_head(HeadSolveConfig(rank=1), model=f["model"], train=[f["train"]], dev=[f["dev"]],
                      test=[f["test"]], protocol=f["protocol"], workspace=ws, command=_quote(head_cmd),
                      progress=step("solve head"))
    head_bundle = write_head_bundle(head, out / "head")

    wfld_cmd = ["exactedit", "solve", "wfld", "--model", f["model"], "--phrases", f["phrases"],
                "--train", f["train"], "--heldout", f["dev"], "--collateral", f["collateral"],
                "--anchors", f["anchors"], "--protocol", f["protocol"], "--workspace", ws, "--out", out / "wfld"]
    wfld = solve_wfld(WfldConfig(), WfldInputs(str(f["model"]), str(f["phrases"]), (str(f["train"]),),
                                               (str(f["dev"]),), (str(f["collateral"]),), (str(f["anchors"]),),
                                               (), str(f["protocol"])),
                      out / "wfld", workspace=ws, command=_quote(wfld_cmd), progress=step("solve wfld"))

    dev_dir = out / "wfld-dev"
    dev = workflow.score(f["protocol"], ws, f["model"], dev_dir,
                         _quote(["exactedit", "eval", "score", "--protocol", f["protocol"], "--model", f["model"],
                                 "--bundle", wfld.bundle, "--out", dev_dir, "--workspace", ws]),
                         bundle=wfld.bundle, config=ScoreConfig(), progress=step("eval score (dev)"))

    dev_report = dev.files.paths["json"]
    blind_dir = out / "blind"
    blind_args = ["exactedit", "eval", "blind", "--model", f["model"], "--bundle", wfld.bundle, "--doc", f["blind"],
                  "--dev-report", dev_report, "--protocol", f["protocol"], "--out", blind_dir, "--workspace", ws]
    blind_cmd = _quote(blind_args)
    (out / "blind.cmd").write_text(blind_cmd + "\n")
    blind = workflow.blind(f["model"], wfld.bundle, f["blind"], dev_report, ws, blind_dir, blind_cmd,
                           protocol_path=f["protocol"], home=Path(ws) / "blind-registry",
                           progress=step("eval blind"))
    return DemoResult(out, ws, head, head_bundle, wfld, dev, blind, blind_cmd)


def demo_report(r: DemoResult) -> tuple[dict, str]:
    """What `exactedit demo` prints: (JSON summary, text of every step)."""
    from exactedit.runs.solve.head_report import summary_table
    from exactedit.runs.eval.render import blind_report
    from exactedit.solvers.l47.report import format_report

    blind_obj, blind_text = blind_report(r.blind)
    obj = {"out": str(r.out), "head_bundle": str(r.head_bundle.path), "head_chosen_step": r.head.chosen_step,
           "wfld_bundle": str(r.wfld.bundle), "wfld_verdict": r.wfld.verdict, "dev_verdict": r.dev.report.verdict,
           "blind": blind_obj, "blind_cmd": r.blind_cmd}
    text = "\n".join([
        "== solve head (rank 1, the protocol's stopping rule)\n" + summary_table(r.head),
        f"bundle {r.head_bundle.path}\n",
        "== solve wfld (anti-slop edit of the last layer's shared-expert down projection)\n"
        + format_report(r.wfld.report) + f"\nbundle {r.wfld.bundle}\n",
        f"== dev score of the wfld bundle: {r.dev.report.verdict} ({r.dev.files.paths['json']})\n",
        "== blind sign-off (one shot)\n" + blind_text,
        f"\nthe blind command is in {r.out / 'blind.cmd'}; running it again is refused."])
    return obj, text
