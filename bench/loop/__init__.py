"""`exactedit bench loop`: the antislop loop's engine work, each part beside the engine's own
ceiling measured in the same run (`rates`)."""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "LoopBenchConfig": "rates",
    "LoopBenchResult": "rates",
    "StepRate": "rates",
    "render_loop_bench": "rates",
    "run_loop_bench": "rates",
})
