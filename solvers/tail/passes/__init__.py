"""The streaming passes over the full vocabulary: logits and LSE (`vocab_pass`, on a JAX device
`device_pass`) and KL(base || edited) with its three implementations side by side (`kl_pass`,
`kl_pass_numba`, `kl_pass_jax`)."""
