"""The code behind the commands, one layer above the libraries (quant ... native) and below cli.py and
bench/. Inside, bottom to top (tests/test_layers.py):

    solve/     `solve head`, `solve wfld`: the protocol, the ledger and the split around the solvers
    eval/      `eval register / split / score / test / blind / ledger` as library calls, and their reports
    data/      `mine`, `dataset build`, `dataset corpus`, `discover --model`, `kld` with llama.cpp's files
    loop/      what the loops share: resumable stages, preflight, bundled inputs, the edit's cost
    antislop/  `exactedit antislop` and `demo --model NAME`       (bundled inputs: bundled/NAME/antislop/)
    persona/   `exactedit persona` and `demo --model NAME --persona`  (bundled/NAME/persona/)
    demo       `exactedit demo`: the whole workflow on the bundled fixture
    serve/     `exactedit serve`: the OpenAI-compatible HTTP server, the rules live (its own face)

antislop/ and persona/ import the shared loop code, never each other. Only cli.py, bench/ and other
runs import this package.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    # solve/
    "WfldInputs": "solve.wfld",
    "head_solve_report": "solve.head_report",
    "solve_head": "solve.head",
    "solve_wfld": "solve.wfld",
    "wfld_solve_report": "solve.wfld",
    "write_head_bundle": "solve.head",
    # eval/
    "blind_report": "eval.render",
    "blind_signoff": "eval.workflow:blind",
    "export_report": "eval.render",
    "ledger_report": "eval.render",
    "recorded_test_report": "eval.render",
    "register": "eval.workflow",
    "register_report": "eval.render",
    "score": "eval.workflow",
    "score_report": "eval.render",
    "score_test": "eval.workflow",
    "split": "eval.workflow",
    "split_report": "eval.render",
    "test_report": "eval.render",
    # data/
    "CorpusConfig": "data.corpus",
    "DatasetConfig": "data.dataset",
    "KldFiles": "data.kld",
    "MineConfig": "data.mine",
    "ban_lines": "data.discover",
    "build_corpus": "data.corpus",
    "build_dataset": "data.dataset",
    "discover_with_model": "data.discover",
    "render_corpus": "data.corpus",
    "render_dataset": "data.dataset",
    "render_kld_run": "data.kld",
    "render_mine": "data.mine",
    "run_kld": "data.kld",
    "run_mine": "data.mine",
    "write_replies": "data.mine",
    # loop/
    "InputError": "loop.inputs",
    "read_lines": "loop.inputs:lines",
    "text_files": "loop.inputs",
    "PreflightError": "loop.preflight",
    "PreflightResult": "loop.preflight",
    "run_preflight": "loop.preflight:preflight",
    # the loops
    "AntislopConfig": "antislop.config",
    "run_antislop": "antislop.pipeline",
    "MAX_SYSTEM_CHARS": "persona.config",
    "PersonaConfig": "persona.config",
    "run_persona": "persona.pipeline",
    # demo
    "DEFAULT_FIXTURE": "demo",
    "demo_report": "demo",
    "run_demo": "demo",
})
