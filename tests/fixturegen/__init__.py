"""The generator of the bundled fixture (fixtures/default), a dev tool kept out of the wheel: the wheel
ships the fixture's files, which `exactedit demo` reads. Rebuild from a source checkout with
`python -m tests.fixturegen --out DIR [--seed 0]`; tests/fixtures/test_fixture.py checks that the
default seed gives the committed bytes."""
