"""Bridges to compiled engines: llama.cpp (llamacpp, capture, verify, mine), the production
engine's file contract (strata), the real public models of the `live` extra (models), and the
untie of a tied head (untie). See docs/live.md."""
