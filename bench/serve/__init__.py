"""`exactedit bench serve`: `exactedit serve` with the shaping rules against the same server
without them, over HTTP (`throughput`)."""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "ServeBenchConfig": "throughput",
    "ServeBenchResult": "throughput",
    "render_serve_bench": "throughput",
    "run_serve_bench": "throughput",
})
