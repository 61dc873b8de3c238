"""Token-exact episodes from the calls of a rollout session (`service.rollouts`), never from re-tokenised text.

Every call records, per sampled choice, a **node**: the prompt token ids the policy saw, the tokens it sampled
and their log-probs, and two texts -- ``text`` (the prompt text followed by the sampled tokens' text, special
tokens included) and ``assistant`` (the sampled turn as the chat template must render it in a later prompt).

A later call of an agent that only appends to its conversation sends the earlier answer back as an assistant
message. `substitute` puts the sampled text in place of that message (matched by its content and tool calls:
`message_key`), so the template renders the turn exactly as it was sampled. If the rendered prompt then starts
with an earlier node's ``text`` (`parent_of`), the call **extends** that node: its prompt ids are the node's prompt
and sampled ids followed by the tokens of the rest of the text only (`extended_prompt`) -- the policy is sampled
on exactly those ids. A prompt that extends no node (the agent rewrote or summarised its history, or branched off
elsewhere) starts a new segment, reported as a split.

The episodes are the leaves of the tree the nodes form (`episodes`): a leaf's ids are its prompt + sampled ids;
the labels are -100 except on the tokens sampled along its path, and the log-probs are those tokens' (one per
trained label, in order: `MultiTurnRollout`'s episode format, which `episode_datum` turns into a tinker Datum).
Concurrent calls in one session (parallel tool agents) extend different nodes and stay apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

IGNORE = -100
SPLIT_REASON = 'its prompt does not extend an earlier call of the session token for token (history rewritten)'


@dataclass(frozen=True)
class Node:
    """One sampled choice of one call."""

    call: int
    choice: int
    parent: tuple[int, int] | None  # (call, choice) of the node this call extended
    prompt_ids: list[int]
    tokens: list[int]
    logprobs: list[float]
    text: str
    assistant: str
    key: str
    finish_reason: str

    @property
    def ident(self) -> tuple[int, int]:
        return (self.call, self.choice)


def message_key(content: str | None, calls: Iterable[tuple[str, str]]) -> str:
    """What identifies an assistant message an agent sends back: its text and its tool calls (arguments compared
    as JSON values, so re-serialised arguments still match)."""
    return json.dumps([content or '', [[name, _canonical(arguments)] for name, arguments in calls]])


def _canonical(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def nodes_of(calls: Sequence[dict[str, Any]]) -> list[Node]:
    """The nodes of a session's call records (as `call_record` writes them)."""
    out = []
    for record in calls:
        parent = tuple(record['parent']) if record.get('parent') else None
        for j, c in enumerate(record['choices']):
            out.append(
                Node(
                    record['call'],
                    j,
                    parent,
                    record['prompt_ids'],
                    c['tokens'],
                    c['logprobs'],
                    record['prompt_text'] + c['text'],
                    c['assistant'],
                    c['key'],
                    c['finish_reason'],
                )
            )
    return out


def call_record(
    call: int, prompt_text: str, prompt_ids: list[int], parent: Node | None, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """The stored record of one call. `choices`: per choice ``tokens``, ``logprobs``, ``text`` (the sampled tokens'
    text, special tokens included), ``assistant``, ``key``, ``finish_reason`` and ``tool_calls``."""
    return {
        'call': call,
        'prompt_text': prompt_text,
        'prompt_ids': prompt_ids,
        'parent': list(parent.ident) if parent is not None else None,
        'choices': choices,
    }


def substitute(messages: Sequence[Any], nodes: Sequence[Node]) -> tuple[list[Any], int]:
    """`messages` (request `ChatMessage` models) with each assistant message that repeats a recorded answer
    replaced by that answer's sampled text; returns them and how many were replaced."""
    by_key = {n.key: n.assistant for n in nodes}
    out, replaced = [], 0
    for m in messages:
        if m.role == 'assistant':
            calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
            content = m.content if isinstance(m.content, str) or m.content is None else None
            sampled = by_key.get(message_key(content, calls)) if content is not None or calls else None
            if sampled is not None:
                m = m.model_copy(update={'content': sampled, 'tool_calls': None})
                replaced += 1
        out.append(m)
    return out, replaced


def parent_of(text: str, nodes: Sequence[Node]) -> Node | None:
    """The node whose ``text`` is the longest prefix of a new prompt's `text` (None: a new segment)."""
    best = None
    for n in nodes:
        if len(text) > len(n.text) and text.startswith(n.text) and (best is None or len(n.text) > len(best.text)):
            best = n
    return best


def extended_prompt(parent: Node, text: str, encode: Any) -> list[int]:
    """The prompt ids of a call extending `parent`: its prompt and sampled ids, then `text`'s rest tokenised."""
    return parent.prompt_ids + parent.tokens + list(encode(text[len(parent.text) :]))


def episodes(nodes: Sequence[Node]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the episodes, the splits): one episode per leaf, in the order the leaves were sampled; a split per
    segment after the first (the call that started it)."""
    by_id = {n.ident: n for n in nodes}
    extended = {n.parent for n in nodes if n.parent is not None}
    roots = sorted({_root(n, by_id).call for n in nodes})
    out = []
    for leaf in (n for n in nodes if n.ident not in extended):
        path = _path(leaf, by_id)
        ids = leaf.prompt_ids + leaf.tokens
        labels = [IGNORE] * len(ids)
        logprobs: list[float] = []
        for node in path:
            start = len(node.prompt_ids)
            if ids[start : start + len(node.tokens)] != node.tokens:
                raise RuntimeError(f'rollout episode of call {leaf.call}: the tokens of call {node.call} moved')
            labels[start : start + len(node.tokens)] = node.tokens
            logprobs += node.logprobs
        out.append(
            {
                'input_ids': ids,
                'labels': labels,
                'logprobs': logprobs,
                'calls': [n.call for n in path],
                'segment': roots.index(path[0].call),
                'finish_reason': leaf.finish_reason,
                'truncated': leaf.finish_reason == 'length',
            }
        )
    splits = [{'call': call, 'reason': SPLIT_REASON} for call in roots[1:]]
    return out, splits


def _path(leaf: Node, by_id: dict[tuple[int, int], Node]) -> list[Node]:
    path = [leaf]
    while path[-1].parent is not None:
        path.append(by_id[path[-1].parent])
    return path[::-1]


def _root(node: Node, by_id: dict[tuple[int, int], Node]) -> Node:
    return _path(node, by_id)[0]
