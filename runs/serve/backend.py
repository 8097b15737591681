"""The engine side of `exactedit serve`: the model loaded once, the rules and the chat template
opened once (native/shaping/live.py `reply_setup`, where `exactedit generate` starts too), and
each reply sampled through generation's one door (native/llamacpp/sample.py `sample_replies`,
the one-at-a-time loop with the rules' live shaper, stopping at the rules' turn end) exactly as
`exactedit generate` samples it: a greedy reply here is token for token `generate`'s, in either
rules mode (`--rules-mode rewind`: the loop hands over a token only once it can no longer be
rolled back, so a stream never sends a phrase it would take back).

`prompt_of_chat` and `prompt_of_text` may run on any thread (the template renders under its own
lock, tokenizing reads the vocabulary only); `run` must run on one thread at a time (the app's
single generation worker): the engine and the shaper are one."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from exactedit import __version__
from exactedit.files import file_sha256
from exactedit.native.llamacpp import LlamaEngine, Sampling, sample_replies
from exactedit.native.llamacpp.chat import prompt_tokens
from exactedit.native.shaping.live import reply_setup, rewind_for, shaper_for
from exactedit.quant.model.chat_template import ChatTemplateError
from exactedit.runs.serve.config import ServeConfig
from exactedit.runs.serve.protocol import ApiError, Reply
from exactedit.runs.serve.stream import TextStream

__all__ = ["Backend"]

_FINISH = {"turn_end": "stop", "end_of_generation": "stop", "halt": "stop", "max_new": "length"}


class Backend:
    """One model, its rules and its template, served. Close it (or use `with`) to free the engine."""

    def __init__(self, cfg: ServeConfig):
        compiled, self.template = reply_setup(cfg.model, cfg.rules, cfg.chat_template)
        self.model_id = cfg.served_id
        self.shaper = shaper_for(compiled, persona=cfg.persona) if compiled is not None else None
        self.rewind = rewind_for(compiled, cfg.rules_mode, cfg.rules)
        self.rule_names = tuple(r.name for r in compiled.rules) if compiled is not None else ()
        self.stop_ids = frozenset(compiled.vocab.turn_end) if compiled is not None else None
        self.fingerprint = f"exactedit-{__version__}" + (f"-rules-{file_sha256(cfg.rules)[:12]}" if cfg.rules else "")
        self.engine = LlamaEngine(cfg.model, cfg.settings)
        self.n_ctx, self.n_vocab = cfg.settings.n_ctx, self.engine.n_vocab
        self._bos = self.engine.bos_if_added()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.engine.close()
        self.template.close()

    def prompt_of_chat(self, turns: Sequence[dict]) -> np.ndarray:
        """The conversation in the chat template, ready for the assistant's reply, as tokens."""
        try:
            text = self.template.render(list(turns), add_generation_prompt=True)
        except ChatTemplateError as exc:
            raise ApiError(400, f"the chat template cannot render these messages: {exc.message}",
                           param="messages") from None
        return prompt_tokens(self.engine, text, self._bos)

    def prompt_of_text(self, text: str) -> np.ndarray:
        """A plain prompt (/v1/completions) as tokens, tokenized as `generate` tokenizes its rendered one."""
        toks = prompt_tokens(self.engine, text, self._bos)
        if toks.size == 0:
            raise ApiError(400, "prompt: empty", param="prompt")
        return toks

    def _is_stop(self, tok: int) -> bool:
        return tok in self.stop_ids if self.stop_ids is not None else self.engine.is_eog(tok)

    def run(self, prompt: np.ndarray, sampling: Sampling, stops: Sequence[str] = (),
            on_text: Callable[[str], None] | None = None, cancelled: Callable[[], bool] = lambda: False) -> Reply:
        """One reply to `prompt`, the rules live; `on_text(text)` with each piece of text that can
        no longer change (runs/serve/stream.py); ends early at a stop string or once `cancelled()`."""
        stream = TextStream(stops)

        def on_token(_job: int, tok: int) -> bool:
            if self._is_stop(tok):               # the loop ends here by itself; its text is not the reply's
                return False
            text = stream.push(self.engine.piece(tok))
            if text and on_text is not None:
                on_text(text)
            return stream.stopped or cancelled()

        gen, = sample_replies(self.engine, [(prompt, sampling)], processor=self.shaper, stop_ids=self.stop_ids,
                              on_token=on_token, rewind=self.rewind)
        tail = stream.finish()
        if tail and on_text is not None:
            on_text(tail)
        fired = {name: int(n) for name, n in zip(self.rule_names, gen.fired.sum(axis=0))}
        rewinds = None if self.rewind is None else tuple(e.phrase for e in gen.rewinds if not e.kept)
        return Reply(stream.text, int(prompt.size), int(gen.tokens.size), _FINISH[gen.stop], sampling.seed, fired,
                     rewinds)
