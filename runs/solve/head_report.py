"""Reports of a head solve: JSON, a readable table, and a PNG of the dev/train trajectory.

All three are pure functions of a `HeadSolveResult`; nothing is printed here. A run on an
unregistered protocol carries its marker at the top of every report.
"""
from __future__ import annotations

import math
import textwrap

from exactedit.solvers.head.scores import SplitReport
from exactedit.runs.solve.head_testonce import bars_json, to_json
from exactedit.files import png_bytes


def _checkpoint_json(c) -> dict:
    return {"step": c.step, "terms": dict(c.terms._asdict()), "train": dict(c.train.__dict__),
            "dev": dict(c.dev.__dict__), "dev_kl": c.dev_kl, "dev_kl_off": c.dev_kl_off, "ratio": c.ratio,
            "rows_changed": c.rows_changed}


def result_json(r) -> dict:
    """Everything the solve measured, JSON-safe (NaN -> null)."""
    return to_json({
        "kind": "exactedit.solve-head", "marker": r.marker,
        "protocol": {"name": r.protocol, "sha256": r.protocol_sha256},
        "model": {"path": r.model, "sha256": r.model_sha256},
        "inputs": [{"role": a, "path": b, "sha256": c} for a, b, c in r.inputs],
        "config": r.config.to_json(),
        "edit_set": {"ids": list(r.edit_set.ids), "tokens": list(r.edit_tokens), "rule": r.edit_set.rule,
                     "counts": list(r.edit_set.counts)},
        "n_params": r.n_params, "anchor_energy_kept": r.anchor_energy_kept, "term_rows": dict(r.term_rows),
        "stopping": dict(r.stopping), "chosen_step": r.chosen_step, "shipped_edit": r.shipped_edit,
        "rows_changed": r.rows_changed, "quant_rel_error": r.quant_rel_error, "edit_norm_ratio": r.edit_norm_ratio,
        "trajectory": [_checkpoint_json(c) for c in r.trajectory], "losses": list(r.losses),
        "splits": [s.to_json() for s in r.splits], "anchors": [s.to_json() for s in r.anchors],
        "test": {"status": r.test.status, "ledger_entry": r.test.ledger_entry,
                 "report": r.test.report.to_json() if r.test.report else None},
        "bars": bars_json(r.bars, "test" if r.test.status in ("scored", "recorded") else "dev", r.marker)["bars"],
        "seconds": dict(r.seconds),
    })


def _num(x: float, fmt: str = "{:+.4f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _split_line(s: SplitReport, note: str = "") -> str:
    g = s.gains
    return (f"  {s.name:<10}{s.rows:>7}  {_num(g.style):>8} ({g.n_style:>4})  {_num(g.ordinary):>8} ({g.n_ordinary:>5})"
            f"  {_num(s.kl_mean, '{:.5f}'):>8}  {_num(s.kl_max, '{:.4f}'):>7}  {s.special_flips:>5}"
            f"  {_num(s.turn_end_p_base, '{:.4f}')} -> {_num(s.turn_end_p_edit, '{:.4f}')}{note}")


def summary_table(r) -> str:
    """The readable summary the CLI prints and the bundle keeps as report.txt."""
    cfg, st = r.config, r.stopping
    lines = [r.marker] if r.marker else []
    lines += [
        f"solve head: protocol {r.protocol!r} ({r.protocol_sha256[:12]}), model {r.model_sha256[:12]}",
        f"edit set ({r.edit_set.rule}, {len(r.edit_set.ids)} rows): " + " ".join(repr(t) for t in r.edit_tokens),
        f"{'full rows' if cfg.rank == 0 else f'rank {cfg.rank}'}, null space k = {cfg.null_k} "
        f"(anchor energy kept {100 * r.anchor_energy_kept:.1f}%), {r.n_params:,} parameters, Adam lr {cfg.lr:g}",
        "terms: " + ", ".join(f"{k} {v}" for k, v in r.term_rows.items()),
        f"stopping: every {st['every']} steps up to {st['max_steps']}, metric {st['metric']}: keep the last step "
        f"with dev/train >= {st['min_ratio']} and dev gain > {st['min_dev_gain']}",
    ]
    if r.chosen_step is None:
        lines.append("chosen step: none qualifies -> no edit ships")
    else:
        c = next(c for c in r.trajectory if c.step == r.chosen_step)
        lines.append(f"chosen step: {r.chosen_step} (dev/train {_num(c.ratio, '{:.3f}')}); shipped "
                     f"{r.rows_changed} re-quantized rows, round-trip error {100 * r.quant_rel_error:.2f}%, "
                     f"|dW|/|W_S| {r.edit_norm_ratio:.3f}")
    lines += ["", "  split        rows  style gain (n)    ordinary (n)     KL mean   KL max  flips  p(turn end) base -> edit"]
    lines += [_split_line(s) for s in r.splits]
    test_note = {"scored": f"   [test scored once: ledger entry {r.test.ledger_entry}]",
                 "recorded": f"   [recorded earlier, ledger entry {r.test.ledger_entry}: not recomputed]"}
    if r.test.report is not None:
        lines.append(_split_line(r.test.report, test_note.get(r.test.status, "")))
    else:
        lines.append(f"  test       ({r.test.status}: test rows not read)")
    if r.anchors:
        lines += ["  anchor traces:"] + [_split_line(s) for s in r.anchors]
    if r.bars:
        lines += ["", "  bars:"]
        for b in r.bars:
            verdict = {True: "pass", False: "FAIL", None: "n/a"}[b.passed] if b.gating else "reported"
            lines.append(f"  {b.label:<48} {_num(b.number, '{:.4f}'):>9} {b.op} {b.threshold:g}   {verdict}")
    lines.append(f"\ntime: full-vocab pass {r.seconds['vocab_pass']:.1f} s, Adam step "
                 f"{1000 * r.seconds['adam_step']:.2f} ms, total {r.seconds['total']:.1f} s")
    return "\n".join(lines)


def trajectory_png(r) -> bytes:
    """Dev and train gains (stopping metric) and their ratio per checkpoint; the chosen step marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = r.stopping["metric"]
    steps = [c.step for c in r.trajectory]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    ax.plot(steps, [c.train.of(metric) for c in r.trajectory], "o-", ms=3, label=f"train {metric} gain")
    ax.plot(steps, [c.dev.of(metric) for c in r.trajectory], "s-", ms=3, label=f"dev {metric} gain")
    ax.set_ylabel("mean d log p (nats/token)")
    ax.axhline(0, color="0.7", lw=0.8)
    ax2.plot(steps, [c.ratio for c in r.trajectory], "o-", ms=3, color="C2", label="dev / train")
    ax2.axhline(r.stopping["min_ratio"], color="C3", ls="--", lw=1, label=f"rule: >= {r.stopping['min_ratio']}")
    ax2.set_ylabel("dev / train")
    ax2.set_xlabel("Adam step")
    for a in (ax, ax2):
        if r.chosen_step is not None:
            a.axvline(r.chosen_step, color="k", ls=":", lw=1.2, label=f"chosen step {r.chosen_step}")
        a.legend(fontsize=8, loc="best")
    title = f"solve head: {r.protocol}, " + ("no step qualifies (no edit)" if r.chosen_step is None else
                                             f"chosen step {r.chosen_step}")
    marker = textwrap.fill(r.marker, 110) + "\n" if r.marker else ""
    fig.suptitle(marker + title, fontsize=8 if marker else 9)
    return png_bytes(fig)


def head_solve_report(r, bundle) -> tuple[dict, str]:
    """What `solve head` prints: (JSON, text) of the result and the bundle it wrote."""
    where = {"path": str(bundle.path), "sha256": bundle.sha256}
    return {**result_json(r), "bundle": where}, summary_table(r) + f"\nbundle {bundle.path} (sha256 {bundle.sha256})"
