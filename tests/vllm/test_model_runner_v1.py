"""The V1 runner's ``RejectionSampler.forward`` with the plugin installed, on CPU, with vLLM's own
``SpecDecodeMetadata`` and ``SamplingMetadata``. Each law check sits beside a deliberately wrong sampler
that the same check rejects."""

import pytest

pytest.importorskip("vllm.sampling_params")

import torch  # noqa: E402
from engine_objects import v1_rejection_sampler, v1_sampling_metadata, v1_spec_metadata  # noqa: E402
from support.laws import naive_verify, position_laws_fail, processed_probs  # noqa: E402

import specdec_ext  # noqa: E402

V, K = 32, 3


def test_forward_with_temperature_top_k_top_p_follows_the_processed_target_law(plugin):
    g = torch.Generator().manual_seed(21)
    num_reqs = 12000
    target = torch.randn(K + 1, V, generator=g) * 1.5
    draft_logits = target[:K] + torch.randn(K, V, generator=g) * 1.2
    draft_law = torch.softmax(draft_logits / 0.8, dim=-1)  # what V1's drafter samples from: temperature only
    drafts = torch.stack([torch.multinomial(draft_law[k], num_reqs, replacement=True, generator=g) for k in range(K)], dim=1)
    metadata = v1_spec_metadata(drafts.tolist())
    sampling = v1_sampling_metadata([0.8] * num_reqs, top_k=[10] * num_reqs, top_p=[0.9] * num_reqs)
    draft_probs = draft_law.repeat(num_reqs, 1)  # (num_tokens, V), flattened like V1's cache
    out = v1_rejection_sampler()(metadata, draft_probs, target.repeat(num_reqs, 1), sampling)
    tokens = out.sampled_token_ids
    assert tokens.dtype == torch.int32 and tokens.shape == (num_reqs, K + 1)
    accepted = (tokens >= 0).sum(dim=1) - 1
    law = processed_probs(target, 0.8, 10, 0.9)
    failed, report = position_laws_fail(tokens.long(), accepted, law)
    assert not failed, report
    # Wrong variants: redrawing from p after a rejection; verifying with the filters applied to q too.
    wrong, wrong_accepted = naive_verify(law.expand(num_reqs, K + 1, V).double(), draft_law.expand(num_reqs, K, V).double(), drafts, g)
    assert position_laws_fail(wrong, wrong_accepted, law)[0]
    both = specdec_ext.verify(target.expand(num_reqs, K + 1, V), (torch.log(draft_law) * 0.8).expand(num_reqs, K, V), drafts,
                              temperature=0.8, top_k=10, top_p=0.9, seeds=torch.arange(num_reqs))
    assert position_laws_fail(both.tokens, both.num_accepted, law)[0]


def test_one_hot_drafts_ragged_counts_and_greedy_rows(plugin):
    g = torch.Generator().manual_seed(8)
    num_reqs = 12000
    target = torch.randn(K + 1, V, generator=g) * 1.5
    one_hot = (target[:K] + torch.randn(K, V, generator=g)).argmax(dim=-1).tolist()
    counts = [b % (K + 1) for b in range(num_reqs)]
    temperature = [0.0 if b % 7 == 0 else 1.2 for b in range(num_reqs)]
    metadata = v1_spec_metadata([one_hot[:n] for n in counts])
    sampling = v1_sampling_metadata(temperature, top_p=[0.8] * num_reqs)
    logits = torch.cat([torch.cat([target[:n], target[n:n + 1]]) for n in counts])
    tokens = v1_rejection_sampler()(metadata, None, logits, sampling).sampled_token_ids.long()
    assert tokens.shape == (num_reqs, max(counts) + 1)
    accepted = (tokens >= 0).sum(dim=1) - 1
    sampled_rows = torch.tensor(temperature) > 0
    law = processed_probs(target, 1.2, None, 0.8)
    failed, report = position_laws_fail(tokens[sampled_rows], accepted[sampled_rows], law, torch.tensor(counts)[sampled_rows])
    assert not failed, report
    wrong, wrong_accepted = naive_verify(law.expand(num_reqs, K + 1, V).double(), torch.nn.functional.one_hot(torch.tensor(one_hot), V).double().expand(num_reqs, K, V),
                                         torch.tensor(one_hot).expand(num_reqs, K), g)
    assert position_laws_fail(wrong, wrong_accepted, law)[0]
    argmax = target.argmax(dim=-1).tolist()
    for b in range(0, 700, 7):
        n = counts[b]
        agree = next((k for k in range(n) if one_hot[k] != argmax[k]), n)
        assert tokens[b, : agree + 1].tolist() == argmax[: agree + 1], (b, n)


def test_seeded_requests_give_the_same_tokens_in_any_batch(plugin):
    g = torch.Generator().manual_seed(3)
    lines = torch.randn(K + 1, V, generator=g)
    drafts = (lines[:K] + torch.randn(K, V, generator=g) * 2).argmax(dim=-1).tolist()
    sampler = v1_rejection_sampler()

    def run(batch_drafts, row, logits):
        generators = {row: torch.Generator().manual_seed(1234)}  # what V1 builds from SamplingParams(seed=1234)
        size = len(batch_drafts)
        sampling = v1_sampling_metadata([1.0] * size, top_k=[12] * size, generators=generators)
        return sampler(v1_spec_metadata(batch_drafts), None, logits, sampling).sampled_token_ids[row].tolist()

    alone = run([drafts], 0, lines)
    crowd_logits = torch.randn(5 * (K + 1), V, generator=g)
    crowd_logits[2 * (K + 1): 3 * (K + 1)] = lines
    assert run([drafts] * 5, 2, crowd_logits) == alone
    assert run([drafts, [1], drafts, [], drafts], 2, torch.cat([crowd_logits[:4], crowd_logits[4:6], lines, crowd_logits[6:7], crowd_logits[7:11]])) == alone


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_logprobs_are_log_p_of_the_emitted_tokens(plugin, mode):
    g = torch.Generator().manual_seed(6)
    num_reqs = 16
    logits = torch.randn(num_reqs * (K + 1), V, generator=g) * 2
    drafts = logits.reshape(num_reqs, K + 1, V)[:, :K].argmax(dim=-1)
    temperature = [0.8] * (num_reqs - 2) + [0.0, 0.0]
    sampling = v1_sampling_metadata(temperature, top_k=[10] * num_reqs, top_p=[0.9] * num_reqs, max_num_logprobs=2)
    out = v1_rejection_sampler(mode)(v1_spec_metadata(drafts.tolist()), None, logits, sampling)
    tokens, logprobs = out.sampled_token_ids.long(), out.logprobs_tensors
    assert logprobs.logprob_token_ids.shape == (num_reqs * (K + 1), 3)  # sampled token, then the top 2
    for b in range(num_reqs):
        lines = logits.reshape(num_reqs, K + 1, V)[b]
        if mode == "raw_logprobs" or temperature[b] == 0:
            expected = torch.log_softmax(lines, dim=-1)
        else:
            expected = torch.log(processed_probs(lines, 0.8, 10, 0.9))
        for k in range(int((tokens[b] >= 0).sum())):
            row = b * (K + 1) + k
            token = int(tokens[b, k])
            assert int(logprobs.logprob_token_ids[row, 0]) == token
            torch.testing.assert_close(logprobs.logprobs[row, 0], expected[k, token].float(), atol=2e-5, rtol=1e-5)
