"""The `eval` commands as library calls (`workflow`), the one-shot blind sign-off (`blind`) and what
the commands print (`render`)."""
