"""`solve head` (`head`, with its inputs, test-once and report) and `solve wfld` (`wfld`): the
protocol, the ledger and the split put around the solvers' math."""
