"""ggml-cpu's dot-product orders, bit for bit: Q6_K x Q8_K (`q6_k_dot`, tiled `q6_k_gemm`), Q8_0 x
Q8_0 (`q8_0_dot`), Q4_1 x Q8_1 (`q4_1_dot`), the fused multiply-add they use (`fma32`), and what the
engine multiplies with for a stored tensor (`runtime`)."""
