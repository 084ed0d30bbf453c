"""The stop strings of a `Serving`'s running requests (`StopTexts`): each request's text so far,
detokenized a few ids at a time, searched only where a new token could end a stop string."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

from .detok import Detok, stop_after

__all__ = ["StopTexts"]


class StopTexts:
    """Each running request's text so far (`Detok`), for its stop strings."""

    def __init__(self, text: Callable[[Seq[int]], str] | None) -> None:
        self._text = text
        self._detoks: dict[int, Detok] = {}

    def stops(self, rid: int, stop_text: tuple[str, ...], generated: list[int], token: int) -> bool:
        """Whether the text of request `rid`'s `generated` tokens and `token` holds one of
        `stop_text`. Its tokens so far held none (it would have ended), so only a string ending in
        the text `token` adds is looked for: a decode of a few ids and a search of a short tail."""
        if not stop_text or self._text is None:
            return False
        detok = self._detoks.get(rid)
        if detok is None:
            detok = self._detoks[rid] = Detok(self._text)
        return stop_after(detok, generated, token, stop_text)

    def forget(self, rid: int) -> None:
        """Request `rid` ended: its text goes."""
        self._detoks.pop(rid, None)
