"""The tiny world the output-guard and full-disk CLI tests write around: a synthetic GGUF, an
rmsnorm dump of it and a one-row bundle for it."""
from __future__ import annotations

import numpy as np

from exactedit.dumps import DocInfo, write_dump
from exactedit.quant.gguf.write import synthetic_model
from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

N, H, V, T = 256, 32, 40, 6


def make_inputs(root):
    """root/m.gguf, root/d (a dump of it), root/b (a bundle editing one head row); returns the model."""
    from exactedit import quant

    model = synthetic_model(root / "m.gguf", vocab=V, n=N, h=H, layers=1, head_type="Q8_0")
    rng = np.random.default_rng(0)
    write_dump(root / "d", arch="rmsnorm", layer=0, docs=[DocInfo("x", 0, T, "s", "c")],
               fields={"tokens": np.zeros(T, int), "next": np.ones(T, int),
                       "R": rng.standard_normal((T, N)), "hh": rng.standard_normal((T, H))})
    edit = TensorEdit("output.weight", "rows", "Q8_0", (V, N), quant.quantize(np.zeros((1, N), np.float32), "Q8_0"),
                      np.array([3]))
    write_bundle(root / "b", solver="test", inputs=[InputRef("model", str(model.path), model.sha256)],
                 config={}, edits=[edit])
    return model
