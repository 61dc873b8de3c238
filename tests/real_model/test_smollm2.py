"""A real model, from a PyPI wheel: SmolLM2-135M-Instruct (Llama: 30 layers, vocabulary 49,152, tied embeddings, the
ChatML template its GGUF embeds), converted once per machine (`twinkle fixtures smollm2`). The smoke test the CI can
afford (~1-2 minutes on 2 cores): the conversion is exact, LoRA trains with the model's own chat template, the saved
adapter reloads to the same loss, and TorchSampler's greedy answers from it equal PEFT's `generate`."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.fixtures import data_path

pytestmark = pytest.mark.slow

LORA = {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear'}
QUESTIONS = ['What is 12 + 35? Answer with just the number.', 'Who are you?']


def chat_ids(tokenizer, question: str, add_generation_prompt: bool) -> list[int]:
    """The token ids of one user turn in the tokenizer's own chat template."""
    messages = [{'role': 'user', 'content': question}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, return_dict=True)
    return list(encoded['input_ids'])


@pytest.fixture(scope='module')
def smollm2_dir():
    from twinkle_core.fixtures.real_models import ensure_real_model

    return ensure_real_model('smollm2')


@pytest.fixture(scope='module')
def identity_rows(tmp_path_factory):
    """A file of eight self-cognition conversations (the model renamed Twinkle), as the SFT example trains on."""
    lines = data_path('self_cognition.jsonl').read_text().splitlines()[:8]
    path = tmp_path_factory.mktemp('identity') / 'identity.jsonl'
    path.write_text('\n'.join(lines) + '\n')
    return path


def test_the_conversion_is_the_gguf_model(smollm2_dir):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from twinkle_core.fixtures.real_models import REAL_MODELS, gguf_path

    config = AutoConfig.from_pretrained(smollm2_dir)
    assert config.architectures == ['LlamaForCausalLM'] and config.vocab_size == 49152 and config.tie_word_embeddings
    assert 'quantization_config' not in config.to_dict()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.chat_template and tokenizer.eos_token == '<|im_end|>'
    gguf = gguf_path('smollm2', smollm2_dir.parent)
    assert gguf.name == REAL_MODELS['smollm2'].member.rsplit('/', 1)[1]
    ids = torch.tensor([chat_ids(tokenizer, QUESTIONS[0], add_generation_prompt=False)])
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, original(ids).logits, atol=1e-5, rtol=0)


def test_lora_trains_saves_reloads_and_samples_like_peft(smollm2_dir, identity_rows, tmp_path):
    from twinkle_core.dataset import Dataset, DatasetMeta
    from twinkle_core.types import SamplingParams
    from twinkle_transformers.model import TransformersModel
    from twinkle_transformers.sampler import TorchSampler

    torch.manual_seed(0)
    dataset = Dataset(DatasetMeta(str(identity_rows)))
    dataset.map('SelfCognitionProcessor', init_args={'model_name': 'Twinkle', 'model_author': 'ModelScope'})
    dataset.set_template('Template', model_id=str(smollm2_dir), max_length=256)
    dataset.encode()
    batch = [dataset[i] for i in range(len(dataset))]

    model = TransformersModel(model_id=str(smollm2_dir))
    model.add_adapter_to_model('default', LORA)
    model.set_template('Template')
    model.set_processor('CausalLMProcessor')
    model.set_optimizer('AdamW', lr=1e-3, weight_decay=0.0)
    losses = []
    for _ in range(2):  # the same batch twice: the second loss must be lower
        losses.append(model.forward_backward(inputs=batch)['loss'])
        model.clip_grad_and_step()
    assert losses[1] < losses[0], losses
    saved = model.save('smoke', output_dir=str(tmp_path))
    after = model.forward_only(inputs=batch)['loss']

    reloaded = TransformersModel(model_id=str(smollm2_dir))
    reloaded.load(saved)
    assert reloaded.forward_only(inputs=batch)['loss'] == pytest.approx(after, abs=1e-5)

    sampler = TorchSampler(str(smollm2_dir), device='cpu')
    sampler.set_template('Template')
    sampler.load_weights(str(saved), adapter_name='smoke')
    prompts = [{'messages': [{'role': 'user', 'content': q}]} for q in QUESTIONS]
    answers = sampler.sample(prompts, SamplingParams(max_tokens=16, temperature=0.0), adapter_name='smoke')
    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    reference = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir), str(saved))
    for question, answer in zip(QUESTIONS, answers):
        ids = chat_ids(tokenizer, question, add_generation_prompt=True)
        with torch.no_grad():
            out = reference.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
        assert answer.sequences[0].tokens == out[0, len(ids) :].tolist(), question
