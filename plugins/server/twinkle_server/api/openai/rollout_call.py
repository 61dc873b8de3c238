"""One chat completion inside a rollout session (`service.rollouts`): the three points where it differs from a
plain `/v1/chat/completions` call (`router.chat`).

1. `prepare`: assistant messages the agent sends back are replaced by the text that was sampled for them, so the
   chat template renders those turns exactly as sampled (`rollout_episodes.substitute`);
2. `prompt`: a prompt that extends an earlier call of the session is that call's prompt and sampled ids followed
   by the new tokens only -- what the policy is sampled on -- otherwise the rendered text tokenised;
3. `record`: the call's prompt ids and each choice's sampled ids and log-probs are stored as the session's
   next call.
"""

from __future__ import annotations

from typing import Any

from twinkle_server.api.openai.chat import RenderedChat
from twinkle_server.api.openai.responses import chat_answer
from twinkle_server.api.openai.schemas import ChatCompletionRequest
from twinkle_server.api.openai.text import DecodedSequence, Detokenizer
from twinkle_server.service.core import Service
from twinkle_server.service.rollout_episodes import Node, extended_prompt, message_key, parent_of, substitute
from twinkle_server.store import RolloutRow

#: the header that puts a plain /v1/chat/completions call into a rollout session (or ``rollout_session`` in the body)
SESSION_HEADER = 'x-rollout-session'


class SessionCall:
    """A call of rollout session `row` by `tenant`; `nodes`: what the session recorded before it."""

    def __init__(self, svc: Service, row: RolloutRow, nodes: list[Node]) -> None:
        self.svc, self.row, self.nodes = svc, row, nodes
        self.parent: Node | None = None

    @classmethod
    def open(cls, svc: Service, tenant: str, session_id: str, req: ChatCompletionRequest) -> SessionCall:
        """The session (404 unless `tenant`'s and live) checked for this call (caps, the pinned model)."""
        row = svc.rollouts.get(tenant, session_id)
        nodes = svc.rollouts.nodes(row)
        svc.rollouts.check_call(row, nodes, req.model)
        return cls(svc, row, nodes)

    def prepare(self, req: ChatCompletionRequest) -> ChatCompletionRequest:
        messages, replaced = substitute(req.messages, self.nodes)
        return req.model_copy(update={'messages': messages}) if replaced else req

    def prompt(self, encode: Any, text: str) -> list[int]:
        self.parent = parent_of(text, self.nodes)
        return extended_prompt(self.parent, text, encode) if self.parent is not None else list(encode(text))

    def record(
        self,
        det: Detokenizer,
        rendered: RenderedChat,
        prompt_ids: list[int],
        sequences: list[Any],
        decoded: list[DecodedSequence],
    ) -> int:
        """Store the call (what the response returned, as tokens); returns its number in the session."""
        choices = []
        for raw, seq in zip(sequences, decoded):
            tokens, logprobs = list(seq.tokens), list(seq.logprobs)
            if len(raw.tokens) == len(tokens) + 1 and raw.tokens[-1] in det.special:  # the dropped end token
                tokens.append(raw.tokens[-1])
                logprobs.append(float((raw.logprobs or [0.0] * len(raw.tokens))[-1]))
            answer = chat_answer(seq, rendered)
            calls = [(c.function.name, c.function.arguments) for c in answer.tool_calls]
            body = det.tokenizer.decode(seq.tokens, skip_special_tokens=False)
            choices.append(
                {
                    'tokens': tokens,
                    'logprobs': logprobs,
                    'text': det.tokenizer.decode(tokens, skip_special_tokens=False),
                    'assistant': rendered.prefill + body,
                    'key': message_key(answer.content, calls),
                    'finish_reason': answer.finish_reason,
                    'tool_calls': [{'name': n, 'arguments': a} for n, a in calls],
                }
            )
        return self.svc.rollouts.record(self.row, rendered.text, prompt_ids, self.parent, choices)
