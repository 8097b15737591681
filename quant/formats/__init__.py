"""ggml's plain and legacy block formats, one module each (`f32`, `f16`, `bf16`, `q8_0`, `q4_0`, `q4_1`,
`q5_0`; the activation formats `q8_1`, `q8_k`), C's float -> int conversions they use (`c_int`), the
type registry (`registry`) and dequantization in JAX from the raw bytes (`jax_dequant`). The
K-quants are in quant/kquants/; `quant.quantize` / `quant.dequantize` are the face."""
