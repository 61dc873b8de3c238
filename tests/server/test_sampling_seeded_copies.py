"""The server batches sample requests with the same settings into one sampler call; a sampler tells identical
prompts of one call apart (so a GRPO group of copies draws apart). Two requests are not a group: each seeded request
gets exactly the completions it gets alone, whoever else sent the same prompt and seed at the same time."""

from __future__ import annotations

from twinkle_core.types import SamplingParams


def test_seeded_copies_from_separate_requests_get_what_they_get_alone(tiny_model_dir):
    from twinkle_server.engine.model_host.base import SampleJob
    from twinkle_server.engine.model_host.local import AdapterSampler
    from twinkle_transformers.sampler import TorchSampler

    host = AdapterSampler(TorchSampler(str(tiny_model_dir), device='cpu'), str(tiny_model_dir))
    params = SamplingParams(max_tokens=4, temperature=2.0, seed=5)

    def job(prompt: list[int]) -> SampleJob:
        return SampleJob(prompt=prompt, params=params)

    def tokens(response) -> list[list[int]]:
        return [seq.tokens for seq in response.sequences]

    alone = tokens(host.sample([job([5, 6, 7])])[0])
    together = host.sample([job([5, 6, 7]), job([10, 11]), job([5, 6, 7])])
    assert tokens(together[0]) == alone and tokens(together[2]) == alone
    assert tokens(together[1]) == tokens(host.sample([job([10, 11])])[0])
