"""Template: assistant-only labels, Message.loss overrides, truncation, generation prompts, lookup errors."""

from __future__ import annotations

import pytest

from twinkle_core import resolve
from twinkle_core.errors import ComponentNotFoundError, HubError, InvalidInputError
from twinkle_core.template.labels import IGNORE_INDEX, mask_runs

CONVERSATION = {
    'messages': [
        {'role': 'system', 'content': 'You are Twinkle.'},
        {'role': 'user', 'content': 'Who are you?'},
        {'role': 'assistant', 'content': 'I am Twinkle, a small model.'},
        {'role': 'user', 'content': 'What can you do?'},
        {'role': 'assistant', 'content': 'I can answer short questions.'},
    ],
    'ground_truth': '42',
}


def labelled_spans(template, row) -> list[str]:
    """Decoded text of each run of labelled tokens."""
    mask = [int(t != IGNORE_INDEX) for t in row['labels']]
    return [template.decode(row['input_ids'][a:b], skip_special_tokens=False) for a, b in mask_runs(mask)]


@pytest.fixture(scope='module')
def marker_free_template(tiny_model_dir):
    """The same tokenizer with the {% generation %} markers removed: exercises prefix rendering."""
    from transformers import AutoTokenizer

    from twinkle_core.template.chat_template import ChatTemplate

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tok.chat_template = tok.chat_template.replace('{%- generation %}', '').replace('{%- endgeneration %}', '')
    template = ChatTemplate(tok)
    assert not template.uses_generation_markers
    return template


def test_labels_are_exactly_the_assistant_turns(chat_template):
    assert chat_template.uses_generation_markers
    row = chat_template.encode(CONVERSATION)
    assert len(row['labels']) == len(row['input_ids']) and row['labels'][0] == IGNORE_INDEX
    expected = [m['content'] + '<|im_end|>' for m in CONVERSATION['messages'] if m['role'] == 'assistant']
    assert labelled_spans(chat_template, row) == expected
    assert row['ground_truth'] == '42'  # extra trajectory fields pass through
    labelled = [t for t in row['labels'] if t != IGNORE_INDEX]
    assert chat_template.decode_completion(row, skip_special_tokens=False) == chat_template.decode(
        labelled, skip_special_tokens=False
    )


def test_prefix_rendering_fallback_matches_generation_mask(chat_template, marker_free_template):
    with_markers = chat_template.encode(CONVERSATION)
    without = marker_free_template.encode(CONVERSATION)
    assert without['input_ids'] == with_markers['input_ids']
    assert without['labels'] == with_markers['labels']


@pytest.mark.parametrize('which', ['markers', 'prefix'])
def test_message_loss_overrides(which, chat_template, marker_free_template):
    template = chat_template if which == 'markers' else marker_free_template
    messages = [dict(m) for m in CONVERSATION['messages']]
    messages[2]['loss'] = False  # do not train on the first answer
    row = template.encode({'messages': messages})
    assert labelled_spans(template, row) == ['I can answer short questions.<|im_end|>']
    messages[3]['loss'] = True  # train on a user turn too: its whole rendered turn is labelled
    row = template.encode({'messages': messages})
    spans = labelled_spans(template, row)
    assert len(spans) == 2 and 'What can you do?<|im_end|>' in spans[0]
    assert spans[1] == 'I can answer short questions.<|im_end|>'


def test_truncation_strategies(tiny_model_dir, chat_template):
    from twinkle_core.template.chat_template import ChatTemplate

    full = chat_template.encode(CONVERSATION)
    n, limit = len(full['input_ids']), 20
    right = ChatTemplate(str(tiny_model_dir), max_length=limit, truncation_strategy='right').encode(CONVERSATION)
    left = ChatTemplate(str(tiny_model_dir), max_length=limit, truncation_strategy='left').encode(CONVERSATION)
    assert right['input_ids'] == full['input_ids'][:limit] and right['labels'] == full['labels'][:limit]
    assert left['input_ids'] == full['input_ids'][-limit:]
    assert left['labels'][0] == IGNORE_INDEX and left['labels'][1:] == full['labels'][n - limit + 1 :]
    strict = ChatTemplate(str(tiny_model_dir), max_length=limit, truncation_strategy='error')
    with pytest.raises(InvalidInputError, match=f'has {n} tokens, more than max_length={limit}'):
        strict.encode(CONVERSATION)
    assert ChatTemplate(str(tiny_model_dir), max_length=n, truncation_strategy='error').encode(CONVERSATION) == full
    with pytest.raises(InvalidInputError, match='truncation_strategy must be one of'):
        ChatTemplate(str(tiny_model_dir), truncation_strategy='middle')


def test_generation_prompt_encodes_the_prompt_only(chat_template):
    from twinkle_core.template.chat_template import ChatTemplate

    prompt = chat_template.encode(CONVERSATION, add_generation_prompt=True)
    assert 'labels' not in prompt and prompt['ground_truth'] == '42'
    text = chat_template.decode(prompt['input_ids'], skip_special_tokens=False)
    assert text.endswith('What can you do?<|im_end|>\n<|im_start|>assistant\n')
    full = chat_template.encode(CONVERSATION)
    assert full['input_ids'][: len(prompt['input_ids'])] == prompt['input_ids']
    short = ChatTemplate(chat_template.tokenizer, max_length=10, truncation_strategy='right')
    assert short.encode(CONVERSATION, add_generation_prompt=True)['input_ids'] == prompt['input_ids'][-10:]
    with pytest.raises(InvalidInputError, match='Not a valid Trajectory'):
        chat_template.encode({'messages': [{'role': 'robot', 'content': 'x'}]})
    with pytest.raises(InvalidInputError, match='only assistant turns'):
        chat_template.encode({'messages': [{'role': 'assistant', 'content': 'x'}]}, add_generation_prompt=True)


def test_encode_batch_and_decode_completion(chat_template):
    rows = chat_template.encode_batch([CONVERSATION, CONVERSATION])
    assert rows[0] == rows[1] == chat_template.encode(CONVERSATION)
    eos = chat_template.tokenizer.eos_token_id
    ids = chat_template.tokenizer('forty two', add_special_tokens=False)['input_ids'] + [eos]
    assert chat_template.decode_completion(ids) == 'forty two'


def test_templates_resolve_by_name(tiny_model_dir, chat_template):
    template = resolve('template', 'Template', model_id_or_tokenizer=str(tiny_model_dir), max_length=64)
    assert template.max_length == 64
    qwen3 = resolve('template', 'Qwen3Template', model_id_or_tokenizer=str(tiny_model_dir))
    assert qwen3.encode(CONVERSATION) == chat_template.encode(CONVERSATION)  # ChatML fixture: same encoding
    with pytest.raises(ComponentNotFoundError) as err:
        resolve('template', 'Qwen3Templat', model_id_or_tokenizer=str(tiny_model_dir))
    assert 'Did you mean: Qwen3Template' in str(err.value)


@pytest.fixture(scope='module')
def qwen3_tokenizer(tiny_model_dir):
    """The fixture tokenizer (same ChatML special tokens) with Qwen3's official chat template."""
    from pathlib import Path

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tok.chat_template = (Path(__file__).parent / 'assets' / 'qwen3_chat_template.jinja').read_text()
    return tok


def test_qwen3_multi_turn_labels_with_the_official_template(qwen3_tokenizer):
    from twinkle_core.template.qwen3 import Qwen3Template

    template = Qwen3Template(qwen3_tokenizer)
    assert not template.uses_generation_markers
    messages = [dict(m) for m in CONVERSATION['messages']]
    messages[2]['content'] = '<think>\nrecall my name\n</think>\n\nI am Twinkle, a small model.'
    row = template.encode({'messages': messages})
    text = template.decode(row['input_ids'], skip_special_tokens=False)
    assert 'recall my name' not in text  # Qwen3 drops reasoning from history, and the labels follow the rendering
    assert labelled_spans(template, row) == [
        'I am Twinkle, a small model.<|im_end|>',
        '<think>\n\n</think>\n\nI can answer short questions.<|im_end|>',  # Qwen3 renders the last answer so
    ]


def test_qwen3_enable_thinking_reaches_the_chat_template(qwen3_tokenizer):
    from twinkle_core.template.qwen3 import Qwen3Template

    no_think = Qwen3Template(qwen3_tokenizer, enable_thinking=False).encode(CONVERSATION, add_generation_prompt=True)
    default = Qwen3Template(qwen3_tokenizer).encode(CONVERSATION, add_generation_prompt=True)
    decode = lambda ids: qwen3_tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert decode(no_think['input_ids']).endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n')
    assert decode(default['input_ids']).endswith('What can you do?<|im_end|>\n<|im_start|>assistant\n')


def test_tokenizer_without_chat_template_is_rejected(tiny_model_dir):
    from transformers import AutoTokenizer

    from twinkle_core.template.chat_template import ChatTemplate

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tok.chat_template = None
    with pytest.raises(InvalidInputError, match='no chat template'):
        ChatTemplate(tok)
    tok.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(InvalidInputError, match=r"rejected a conversation with roles \['system', 'user'.*alternate"):
        ChatTemplate(tok).encode(CONVERSATION)


def test_fingerprint_tracks_what_changes_encoding(tiny_model_dir, chat_template):
    from twinkle_core.template.chat_template import ChatTemplate

    same = ChatTemplate(str(tiny_model_dir))
    assert same.fingerprint() == chat_template.fingerprint()
    assert ChatTemplate(str(tiny_model_dir), max_length=32).fingerprint() != chat_template.fingerprint()


def test_tokenizer_from_a_hub_reference(tiny_model_dir, tmp_path, monkeypatch, chat_template):
    """ms://org/name goes through twinkle_core.hub (here its local stand-in, TWINKLE_HUB_ROOT)."""
    import shutil

    from twinkle_core.template.chat_template import ChatTemplate

    repo = tmp_path / 'ms' / 'acme' / 'tiny-chat' / 'master'
    repo.mkdir(parents=True)
    for name in ('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja'):
        shutil.copy(tiny_model_dir / name, repo / name)
    monkeypatch.setenv('TWINKLE_HUB_ROOT', str(tmp_path))
    template = ChatTemplate('ms://acme/tiny-chat')
    assert template.encode(CONVERSATION) == chat_template.encode(CONVERSATION)
    with pytest.raises(HubError, match='not in the local hub'):
        ChatTemplate('ms://acme/missing')
