"""A tokenizer for the tiny model on the CPU: characters as their code point mod 4000, the chat
template's special tokens as 4001.. (the real tokenizer's ids are beyond the tiny vocabulary)."""

from __future__ import annotations

__all__ = ["TinyTok"]


class TinyTok:
    """Text to the tiny model's ids: characters as their code point mod 4000, the chat template's
    special tokens as 4001.. (the real tokenizer's ids are beyond the tiny vocabulary)."""

    SPECIAL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            hit = next((j for j, s in enumerate(self.SPECIAL) if text.startswith(s, i)), None)
            if hit is not None:
                out.append(4001 + hit)
                i += len(self.SPECIAL[hit])
            else:
                out.append(ord(text[i]) % 4000)
                i += 1
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.SPECIAL[i - 4001] if 4001 <= i < 4004 else chr(i) for i in ids)
