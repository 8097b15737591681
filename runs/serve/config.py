"""What `exactedit serve` serves and its bounds: the model, the rules fixed at startup, where it
listens, and the limits every request is held to (the body's size, the tokens of a reply, the
requests waiting behind the one generating)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exactedit.errors import FieldError
from exactedit.native.llamacpp import EngineSettings
from exactedit.native.llamacpp.rewind import RULES_MODES

__all__ = ["DEFAULT_PORT", "ServeConfig", "ServeError"]

DEFAULT_PORT = 8080                 # llama.cpp's server's, which OpenAI clients are often pointed at


class ServeError(FieldError):
    """A serve setting is out of its range, or the model and its rules cannot be served."""


@dataclass(frozen=True)
class ServeConfig:
    """`exactedit serve`'s flags, 1:1. `rules`: compiled shaping rules (`exactedit shape compile`),
    live on every request, read once here and never from a request; `chat_template`: a Jinja2 file
    rendered instead of the model's own (without rules: compiled rules carry the template they were
    compiled with); `persona` overrides the rules' persona gate; `rules_mode` "rewind" rolls back the
    rules' phrases and their variants (native/llamacpp/rewind.py; a stream then holds back text
    while it may still become one). `model_id`: the name /v1/models lists (default: the GGUF file's
    name without .gguf).

    Bounds: `max_tokens` caps a request's max_tokens (and is the default when a request gives none,
    less where the context has no room); `max_body_bytes` caps a request body; one reply generates
    at a time (one engine), `max_waiting` more may wait for it, and past that a request is answered
    503 at once."""

    model: str
    rules: str | None = None
    chat_template: str | None = None
    persona: bool | None = None
    rules_mode: str = "penalty"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    model_id: str | None = None
    max_tokens: int = 512
    max_body_bytes: int = 1 << 20
    max_waiting: int = 8
    settings: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self):
        for key, low in (("max_tokens", 1), ("max_body_bytes", 1024), ("max_waiting", 0), ("port", 0)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ServeError("serve", key, f"expected an integer >= {low}, got {v!r}")
        if self.port > 65535:
            raise ServeError("serve", "port", f"expected 0..65535, got {self.port}")
        if self.max_tokens >= self.settings.n_ctx:
            raise ServeError("serve", "max_tokens", f"{self.max_tokens} leaves no room for a prompt in n_ctx "
                             f"{self.settings.n_ctx}")
        if self.rules is not None and self.chat_template is not None:
            raise ServeError(self.chat_template, "chat_template", "compiled rules render with the template they "
                             "were compiled with: put it in the rules file's [chat] table instead")
        if self.rules_mode not in RULES_MODES:
            raise ServeError("serve", "rules_mode",
                             f"expected one of {', '.join(RULES_MODES)}, got {self.rules_mode!r}")
        if self.rules_mode == "rewind" and self.rules is None:
            raise ServeError("serve", "rules_mode", "rewind rolls back the rules' banned phrases: give --rules")
        if self.model_id is not None and not (isinstance(self.model_id, str) and self.model_id.strip()):
            raise ServeError("serve", "model_id", f"expected a non-empty name, got {self.model_id!r}")

    @property
    def served_id(self) -> str:
        """The model's name in /v1/models and in every response."""
        return self.model_id or Path(self.model).name.removesuffix(".gguf")
