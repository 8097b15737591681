"""`exactedit bench solve-wfld` (the whole solve at production size: `whole` on the host, `gpu` on a
JAX device), `bench frontier` (its strength search along lines against a pass per point) and
`bench ship` (its feedback ship with the metric's upper factor against the factor as a general one)."""
