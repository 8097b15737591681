"""The exact forwards and where they run: the head (`head_ref` float64 reference, `head_fast`), the
last layer's tail (`last_layer_ref`, `last_layer_fast`), the jitted functions' row buckets (`buckets`),
JAX's compilation cache (`jax_cache`) and the device configuration (`device`)."""
