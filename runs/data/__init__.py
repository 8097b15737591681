"""The data commands: `mine` (replies), `dataset build` (`dataset`), `dataset corpus` (`corpus`),
`discover --model` (`discover`) and `kld` with llama.cpp's files (`kld`)."""
