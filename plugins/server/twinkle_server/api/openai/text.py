"""Token ids -> OpenAI text: the served model's tokenizer, a completion's text split per token (for streaming),
stop sequences cut off, and log-prob entries.

A sampler keeps the token that stopped a sequence (docs/tinker_api.md); OpenAI leaves stop sequences and the
end-of-sequence token out of the answer. So a final special token (EOS) is dropped, and text from the first stop
sequence on is cut, together with the tokens that lie wholly after the cut (the log-probs cover exactly the tokens
whose text is returned, the one a cut runs through included).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from twinkle_core.template.tokenizer import load_tokenizer

_TOKENIZERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def tokenizer_for(model_dir: str) -> Any:
    """The (shared, lazily loaded) tokenizer of a served model directory."""
    with _LOCK:
        if model_dir not in _TOKENIZERS:
            _TOKENIZERS[model_dir] = load_tokenizer(model_dir)
        return _TOKENIZERS[model_dir]


@dataclass(frozen=True)
class DecodedSequence:
    """`pieces[i]`: the text token `tokens[i]` adds (``''.join(pieces) == text``); `logprobs` / `top` per kept token."""

    text: str
    tokens: list[int]
    pieces: list[str]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    finish_reason: str  # 'stop' | 'length'


class Detokenizer:
    """Decodes completions of one tokenizer (special tokens skipped, as OpenAI-compatible servers do)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.special = frozenset(getattr(tokenizer, 'all_special_ids', []) or [])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each id's own text (what a log-prob entry names)."""
        return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def sequence(
        self,
        tokens: list[int],
        logprobs: list[float] | None,
        top: list[list[tuple[int, float]]] | None,
        stop_reason: str,
        stop: list[str],
        prefix: str = '',
    ) -> DecodedSequence:
        """One sampled sequence as text. `prefix`: text the prompt already holds of the answer (a forced tool-call
        start), put in front of the text (and of the first piece)."""
        lps = list(logprobs or [0.0] * len(tokens))
        tops = list(top or [[] for _ in tokens])
        if stop_reason == 'stop' and tokens and tokens[-1] in self.special:
            tokens, lps, tops = tokens[:-1], lps[:-1], tops[:-1]
        pieces = self._pieces(tokens)
        text = ''.join(pieces)
        finish = 'length' if stop_reason == 'length' else 'stop'
        cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
        if cut >= 0:
            kept, pos = [], 0
            for piece in pieces:
                if pos >= cut:
                    break
                kept.append(piece[: cut - pos])
                pos += len(piece)
            pieces, text, finish = kept, text[:cut], 'stop'
            tokens, lps, tops = tokens[: len(kept)], lps[: len(kept)], tops[: len(kept)]
        if prefix:
            pieces = [prefix + pieces[0], *pieces[1:]] if pieces else [prefix]
            text = prefix + text
        pairs = [[(int(tok), float(lp)) for tok, lp in t] for t in tops]
        return DecodedSequence(text, list(tokens), pieces, lps, pairs, finish)

    def _pieces(self, tokens: list[int]) -> list[str]:
        """The text each token adds, decoded incrementally (a token ending inside a multi-byte character adds ''
        and the next one the whole character). A tokenizer whose incremental text differs from its full decode gets
        the full text as the first piece."""
        pieces: list[str] = []
        prefix_at, read_at = 0, 0
        for k in range(len(tokens)):
            before = self.decode(tokens[prefix_at:read_at])
            after = self.decode(tokens[prefix_at : k + 1])
            if len(after) > len(before) and not after.endswith('\ufffd'):
                pieces.append(after[len(before) :])
                prefix_at, read_at = read_at, k + 1
            else:
                pieces.append('')
        full = self.decode(tokens)
        if ''.join(pieces) != full:
            joined = ''.join(pieces)
            if full.startswith(joined):  # characters left undecided at the end (a trailing partial character)
                pieces[-1] += full[len(joined) :]
            else:
                pieces = [full] + [''] * (len(tokens) - 1) if tokens else []
        return pieces
