"""The code behind `exactedit mine` (`mine`), `dataset build` (`dataset`), `dataset corpus`
(`corpus`), `discover --model` (`discover`), `kld` with llama.cpp's files (`kld`), `antislop` and `demo --model`
(`antislop`; the bundled inputs of `demo --model NAME` in `data/`), `persona` and `demo --model NAME
--persona` (`persona`), what both refuse before generating (`preflight`) and their resumable stages
(`stages`). Imported only by
cli.py, fixtures/, bench/ and other runs (tests/test_layers.py).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "CorpusConfig": "corpus",
    "DatasetConfig": "dataset",
    "KldFiles": "kld",
    "MineConfig": "mine",
    "PreflightError": "preflight",
    "PreflightResult": "preflight",
    "AntislopConfig": "antislop.config",
    "build_corpus": "corpus",
    "ban_lines": "discover",
    "build_dataset": "dataset",
    "discover_with_model": "discover",
    "render_corpus": "corpus",
    "render_dataset": "dataset",
    "render_kld_run": "kld",
    "render_mine": "mine",
    "write_replies": "mine",
    "run_kld": "kld",
    "run_mine": "mine:mine",
    "run_preflight": "preflight:preflight",
    "run_antislop": "antislop.pipeline",
    "PersonaConfig": "persona.config",
    "MAX_SYSTEM_CHARS": "persona.config",
    "run_persona": "persona.pipeline",
})
