"""sample_replies' check of each job's room in the context, before any token is sampled: a reply
cap that leaves no room for a prompt says so (it said "needs 1..-999997952 tokens")."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from exactedit.native.llamacpp.engine import EngineError, EngineSettings
from exactedit.native.llamacpp.generate import Sampling
from exactedit.native.llamacpp.sample import sample_replies

ENGINE = SimpleNamespace(settings=EngineSettings(n_ctx=64), path="m.gguf")


@pytest.mark.parametrize("max_new, prompt, says", [
    (10**9, 3, r"prompt\[0\]: max_new 1000000000 leaves no room for a prompt in the context of n_ctx 64 tokens"),
    (64, 3, "max_new 64 leaves no room for a prompt"),
    (60, 5, r"prompt\[0\]: needs 1\.\.4 tokens \(n_ctx 64 less max_new 60\), got 5"),
    (8, 0, r"needs 1\.\.56 tokens \(n_ctx 64 less max_new 8\), got 0"),
])
def test_a_job_the_context_cannot_hold_is_refused_saying_why(max_new, prompt, says):
    with pytest.raises(EngineError, match=says):
        sample_replies(ENGINE, [(np.ones(prompt, np.int32), Sampling(max_new=max_new))])
