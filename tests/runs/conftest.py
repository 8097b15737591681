"""The protocol file the eval commands' tests share (tests/evals/conftest.py)."""
from tests.evals.conftest import protocol_file  # noqa: F401 - a pytest fixture, found by its name here
