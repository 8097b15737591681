"""`exactedit antislop` (and `exactedit demo --model NAME`, the same run on bundled inputs): the
whole anti-slop loop on a GGUF, in resumable stages (`pipeline`, on runs/loop/stages.py), from a
config (`config`), the four-arm rates (`rates`), the cost on ordinary text (`cost`) and the
report (`report`)."""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "AntislopConfig": "config",
    "AntislopError": "config",
    "AntislopResult": "pipeline",
    "LOOP": "config",
    "run_antislop": "pipeline",
})
