"""A model's metadata read from its GGUF: the tail's architecture (`arch`), its special tokens
(`specials`) and its chat template (`chat_template`), compiled and rendered in a child process
under a budget (`template_sandbox`)."""
