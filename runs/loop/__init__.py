"""What the loop commands (antislop, persona) share: resumable stages on a hash-chained state
(`stages`), what is refused before generating (`preflight`), the bundled and given inputs
(`inputs`) and the edit's cost on ordinary text (`cost`)."""
