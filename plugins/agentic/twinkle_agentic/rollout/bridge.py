"""Token-in, token-out turn accounting: the tokens of the turns a rollout inserts between two samples.

An episode's ``input_ids`` are the prompt, then every sampled turn exactly as the sampler returned its tokens,
then the inserted turns (tool responses, env observations, and the chat-template glue up to the next
generation prompt). The sampled text is never re-tokenised: `TurnBridge.tokens` renders the conversation with
the chat template before and after the inserted messages and tokenises only the difference -- the text that
follows the sampled turn's end-of-turn token. Re-tokenising a whole conversation can split the sampled tokens
differently from how they were sampled, which makes their behaviour log-probs wrong (verl traced PPO divergence
to it).

A template that does not render tools itself (e.g. SmolLM2's plain ChatML) gets the episode's tools, calls and
results as plain turns in the hermes format (`twinkle_core.template.tool_calls`), as `ChatTemplate` and the
server's ``/v1`` render them.
"""

from __future__ import annotations

from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.template import labels as L
from twinkle_core.template.tool_calls import HERMES, plain_tool_turns, renders_tools, uses_tools


class TurnBridge:
    """Renders inserted turns with `tokenizer`'s chat template (the ``tools`` of the episode passed through)."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, 'chat_template', None):
            raise InvalidInputError(
                'MultiTurnRollout needs a tokenizer with a chat template (the template renders turns).'
            )
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.renders_tools = renders_tools(tokenizer)

    def render(self, messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, **kw: Any) -> str:
        if not self.renders_tools and uses_tools(messages, list(tools or [])):
            messages, tools = plain_tool_turns(messages, list(tools or []), HERMES)[0], None
        kwargs = {**self.kwargs, **({'tools': list(tools)} if tools else {})}
        return L.render(self.tokenizer, messages, **kwargs, **kw)

    def prompt_tokens(self, messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[int]:
        """The first prompt: `messages` rendered with the generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def tokens(
        self,
        messages: list[dict[str, Any]],
        inserted: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        sampled_text: str,
    ) -> list[int]:
        """Tokens that follow the sampled turn (the last of `messages`; `sampled_text`: its tokens decoded, the
        end-of-turn token included when it was sampled) when `inserted` messages come next, up to and including
        the next generation prompt: the rest of the turn's closing (e.g. the newline after ``<|im_end|>``), the
        inserted turns, and the generation prompt."""
        before = self.render(messages, tools)
        after = self.render(messages + inserted, tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise InvalidInputError(
                'The chat template does not render a conversation as a prefix of its continuation (it rewrites '
                'earlier turns, e.g. drops past reasoning); token-exact multi-turn rollouts need one that appends.'
            )
        # the sampled turn is located by position (what precedes it is the previous generation prompt), never by
        # searching its text: a short turn (``n``, ``>``, a newline) also occurs inside the template's closing
        head = self.render(messages[:-1], tools, add_generation_prompt=True)
        if not before.startswith(head + sampled_text):
            raise InvalidInputError(
                f'The chat template does not render the sampled turn {sampled_text[:80]!r} verbatim right after the '
                'generation prompt (it rewrites the turn, e.g. strips whitespace or reasoning); token-exact '
                'multi-turn rollouts need a template that keeps sampled turns as they were generated.'
            )
        return self.encode(before[len(head) + len(sampled_text) :] + after[len(before) :])

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)['input_ids'])

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))
