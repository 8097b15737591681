"""A reply's text as it may be sent: token pieces (bytes) in, text out, cut at the request's stop
strings. Text is held back while it could still turn out to be the start of a stop string, and
bytes while they are an incomplete UTF-8 character, so a streaming client is never sent text
that the final reply does not have: the concatenation of everything `push` and `finish` return
is the final text, which ends before the first stop string (the stop string not included). In the
rules' rewind mode the pieces come from tokens the generation loop can no longer roll back
(native/llamacpp/rewind.py `Rewinder.committed`): text that may still become a banned phrase is held
there, before it reaches this stream."""
from __future__ import annotations

import codecs
from typing import Sequence

__all__ = ["TextStream"]


class TextStream:
    """`push(piece) -> str`: the text newly safe to send; `stopped` once a stop string completed
    (push nothing more); `finish() -> str`: what was held back, at the reply's end."""

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.text = ""          # decoded so far (past a stop: cut before it)
        self.sent = 0           # chars of `text` handed out
        self.stopped = False

    def push(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        self.text += self._decoder.decode(piece)
        return self._release()

    def finish(self) -> str:
        if self.stopped:
            return ""
        self.text += self._decoder.decode(b"", final=True)      # a character cut at the end: U+FFFD
        out = self._release()
        out, self.sent = out + self.text[self.sent:], len(self.text)
        return out

    def _release(self) -> str:
        found = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if found:
            self.stopped = True
            self.text = self.text[:min(found)]
            end = len(self.text)
        else:
            end = len(self.text) - self._held()
        out, self.sent = self.text[self.sent:end], end
        return out

    def _held(self) -> int:
        """The longest unsent tail of `text` that is a proper prefix of a stop string."""
        tail = self.text[self.sent:]
        for k in range(min(len(tail), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
            if any(s.startswith(tail[-k:]) for s in self.stops):
                return k
        return 0
