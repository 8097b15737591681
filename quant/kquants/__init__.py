"""ggml's K-quant super-block formats: `q6_k`, `q4_k`, `q5_k`, and the scale-and-min super-block
that Q4_K and Q5_K share (`k_scale_min`). One module per format, numpy reference and numba kernel
side by side, byte-identical to ggml's C."""
