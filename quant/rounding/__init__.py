"""Rounding that keeps constraints: a row as fixed block scales times free codes (`grid`), codes
chosen to keep a quadratic form of the error small (`feedback`), and the round-trip rule that
re-quantizes only edited rows (`roundtrip`)."""
