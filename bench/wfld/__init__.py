"""`exactedit bench solve-wfld` (the whole solve at production size: `whole` on the host, `gpu` on a
JAX device) and `bench frontier` (its strength search along lines against a pass per point)."""
