"""Model Runner V2's verification with the plugin installed, called through vLLM's own objects: its
``RejectionSampler`` (``_verify_in_chunks`` -> ``_verify``), ``Sampler`` and sampling states built from
``SamplingParams``, and an ``InputBatch``. Each law check sits beside a deliberately wrong sampler that the
same check rejects."""

import pytest

pytest.importorskip("vllm.sampling_params")

import torch  # noqa: E402
from engine_objects import plugin_log, v2_add_requests, v2_rejection_sampler, v2_step, v2_verify, v2_verify_once  # noqa: E402
from support.laws import chi_square_fails, naive_verify, position_laws_fail, processed_probs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402

import specdec_ext  # noqa: E402

V, K = 24, 3


def laws_of(target: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """(K+1, V) processed target law per position (transformers' warpers: the independent reference)."""
    return processed_probs(target, temperature, top_k if top_k > 0 else None, top_p)


def batch_of(num_reqs: int, params, *, method: str = "standard", logprobs_mode: str = "raw_logprobs", custom_logits_processors=()):
    rejection_sampler, sampler = v2_rejection_sampler(num_reqs, V, K, method=method, logprobs_mode=logprobs_mode,
                                                      custom_logits_processors=custom_logits_processors)
    v2_add_requests(sampler, range(num_reqs), params)
    return rejection_sampler, sampler


def draw_drafts(draft_logits: torch.Tensor, temperature: float, num_reqs: int, generator) -> torch.Tensor:
    """(N, K) drafts from vLLM's probabilistic draft law: softmax(draft logits / T), no top-k / top-p."""
    probs = torch.softmax(draft_logits / temperature, dim=-1)
    return torch.stack([torch.multinomial(probs[k], num_reqs, replacement=True, generator=generator) for k in range(K)], dim=1)


def run_law_case(temperature, top_k, top_p, probabilistic: bool, *, num_reqs=10000, method="standard", seed=0):
    """One position-law scenario through vLLM's objects; returns the check's verdicts for the plugin and
    for the deliberately wrong samplers."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(K + 1, V, generator=g) * 1.5
    draft_logits = target[:K] + torch.randn(K, V, generator=g) * 1.2
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=1000 + i) for i in range(num_reqs)]
    rejection_sampler, _ = batch_of(num_reqs, params, method=method)
    if probabilistic:
        drafts = draw_drafts(draft_logits, temperature, num_reqs, g)
        cached = draft_logits.expand(num_reqs, K, V).contiguous()  # vLLM's per-request-state cache, unscaled
        draft_law = torch.softmax(draft_logits / temperature, dim=-1).expand(num_reqs, K, V)
    else:
        drafts = draft_logits.argmax(dim=-1).expand(num_reqs, K)  # a deterministic drafter: one-hot q
        cached = None
        draft_law = torch.nn.functional.one_hot(drafts, V).double()
    step = v2_step(list(range(num_reqs)), drafts.tolist(), [7] * num_reqs)
    logits = target.repeat(num_reqs, 1)
    sampled, num_sampled = v2_verify(rejection_sampler, step, logits, cached)
    law = laws_of(target, temperature, top_k, top_p)
    ours, report = position_laws_fail(sampled, num_sampled.long() - 1, law)

    naive_tokens, naive_accepted = naive_verify(law.expand(num_reqs, K + 1, V).double(), draft_law.double(), drafts, g)
    naive, _ = position_laws_fail(naive_tokens, naive_accepted, law)
    verdicts = {"plugin": ours, "redraw from p after a rejection": naive}
    if probabilistic and (top_k or top_p < 1):
        # What a plugin that treats vLLM's drafts as drawn with the row's filters would do: the same fused
        # verification with top-k / top-p applied to q too. q is then not the law the drafts came from.
        both = specdec_ext.verify(target.expand(num_reqs, K + 1, V), cached, drafts, temperature=temperature, top_k=top_k,
                                  top_p=top_p, seeds=torch.arange(num_reqs), method="block" if method == "block" else "token")
        verdicts["filters applied to the drafts too"], _ = position_laws_fail(both.tokens, both.num_accepted, law)
    return verdicts, report


@pytest.mark.parametrize("temperature,top_k,top_p,probabilistic", [
    (0.8, 10, 0.9, True),     # probabilistic drafts (draft_sample_method="probabilistic"), all three filters
    (1.0, -1, 0.8, False),    # vLLM's default greedy drafter: one-hot q, top-p only
    (0.7, 5, 1.0, True),      # top-k only
], ids=["T0.8-k10-p0.9-probabilistic", "T1-p0.8-one-hot", "T0.7-k5-probabilistic"])
def test_sampled_rows_follow_the_processed_target_law_at_every_position(plugin, temperature, top_k, top_p, probabilistic):
    verdicts, report = run_law_case(temperature, top_k, top_p, probabilistic)
    assert not verdicts.pop("plugin"), report
    for name, failed in verdicts.items():
        assert failed, f"the check did not reject the wrong sampler ({name})"


def test_block_verification_follows_the_processed_target_law(plugin):
    verdicts, report = run_law_case(0.8, 10, 0.9, True, method="block", seed=3)
    assert not verdicts.pop("plugin"), report
    assert all(verdicts.values()), verdicts


def test_peaked_row_top_p_keeps_exactly_the_smallest_set_reaching_top_p(plugin):
    # One token holds ~0.93 of the mass; top-p 0.95 keeps it and the next few: the set an inexact
    # top-p gets wrong on such rows.
    num_reqs = 10000
    line = torch.full((V,), -1.0)
    line[:6] = torch.tensor([6.0, 3.2, 2.9, 2.5, 2.2, 1.0])
    target = line.expand(K + 1, V)
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=i) for i in range(num_reqs)]
    rejection_sampler, _ = batch_of(num_reqs, params)
    step = v2_step(list(range(num_reqs)), [[5, 5, 5]] * num_reqs, [0] * num_reqs)  # one-hot drafts, mostly rejected
    sampled, num_sampled = v2_verify(rejection_sampler, step, target.repeat(num_reqs, 1))
    law = laws_of(target, 1.0, 0, 0.95)
    assert int((law[0] > 0).sum()) == 4, law[0]  # the kept set: the peak and three more
    counts = torch.bincount(sampled[:, 0], minlength=V)
    failed, line_report = chi_square_fails(counts, law[0])
    assert not failed, line_report
    # Wrong variant: a top-p that also keeps the token at the boundary.
    wrong = torch.softmax(torch.where(torch.arange(V) < 5, line, torch.tensor(float("-inf"))), dim=0)
    wrong_counts = torch.bincount(torch.multinomial(wrong, num_reqs, replacement=True, generator=torch.Generator().manual_seed(1)), minlength=V)
    assert chi_square_fails(wrong_counts, law[0])[0]


def test_greedy_rows_give_the_target_argmax_mixed_with_sampled_rows(plugin):
    g = torch.Generator().manual_seed(5)
    num_reqs = 8
    params = [SamplingParams(temperature=0.0) if b % 2 == 0 else SamplingParams(temperature=0.9, top_k=4, seed=b) for b in range(num_reqs)]
    rejection_sampler, _ = batch_of(num_reqs, params)
    logits = torch.randn(num_reqs * (K + 1), V, generator=g)
    argmax = logits.argmax(dim=-1).reshape(num_reqs, K + 1)
    # Greedy request b matches the argmax for its first b // 2 drafts, then proposes a wrong token.
    drafts = []
    for b in range(num_reqs):
        row = argmax[b, :K].tolist()
        agree = min(b // 2, K)
        drafts.append(row[:agree] + [(t + 1) % V for t in row[agree:]])
    step = v2_step(list(range(num_reqs)), drafts, [3] * num_reqs)
    sampled, num_sampled = v2_verify(rejection_sampler, step, logits)
    for b in range(0, num_reqs, 2):
        agree = min(b // 2, K)
        assert int(num_sampled[b]) == agree + 1
        assert sampled[b, : agree + 1].tolist() == argmax[b, : agree + 1].tolist()
    assert sampled.dtype == torch.int64 and num_sampled.dtype == torch.int32 and sampled.shape == (num_reqs, K + 1)
    assert ((sampled[1::2, 0] >= 0) & (sampled[1::2, 0] < V)).all()


def test_ragged_draft_counts_one_hot_drafts_and_mixed_rows(plugin):
    g = torch.Generator().manual_seed(11)
    num_reqs = 12000
    target = torch.randn(K + 1, V, generator=g) * 1.5
    counts = [b % (K + 1) for b in range(num_reqs)]  # 0, 1, 2 or 3 drafts
    greedy = [b % 5 == 0 for b in range(num_reqs)]
    params = [SamplingParams(temperature=0.0) if greedy[b] else SamplingParams(temperature=0.9, top_p=0.85, seed=b) for b in range(num_reqs)]
    rejection_sampler, _ = batch_of(num_reqs, params)
    one_hot = (target[:K] + torch.randn(K, V, generator=g)).argmax(dim=-1).tolist()
    drafts = [one_hot[:n] for n in counts]
    step = v2_step(list(range(num_reqs)), drafts, [b % 50 for b in range(num_reqs)])
    logits = torch.cat([target[: n + 1] for n in counts])
    sampled, num_sampled = v2_verify(rejection_sampler, step, logits)
    accepted = num_sampled.long() - 1
    assert (accepted <= torch.tensor(counts)).all()
    sampled_rows = ~torch.tensor(greedy)
    law = laws_of(target, 0.9, 0, 0.85)
    failed, report = position_laws_fail(sampled[sampled_rows], accepted[sampled_rows], law, torch.tensor(counts)[sampled_rows])
    assert not failed, report
    wrong_tokens, wrong_accepted = naive_verify(law.expand(num_reqs, K + 1, V).double(), torch.nn.functional.one_hot(torch.tensor(one_hot), V).double().expand(num_reqs, K, V),
                                                torch.tensor(one_hot).expand(num_reqs, K), g)
    assert position_laws_fail(wrong_tokens, wrong_accepted, law)[0]
    argmax = target.argmax(dim=-1)
    for b in [b for b in range(num_reqs) if greedy[b]][:200]:
        n = int(accepted[b])
        assert sampled[b, : n + 1].tolist() == argmax[: n + 1].tolist()


def test_seeded_requests_give_the_same_tokens_in_any_batch(plugin):
    g = torch.Generator().manual_seed(2)
    lines = torch.randn(K + 1, V, generator=g)
    drafts = (lines[:K] + torch.randn(K, V, generator=g) * 2).argmax(dim=-1).tolist()
    mine = SamplingParams(temperature=1.0, top_k=12, top_p=0.9, seed=424242)
    alone, _ = batch_of(1, [mine])
    sampled_alone, num_alone = v2_verify(alone, v2_step([0], [drafts], [40]), lines)
    # The same request, now the 4th of 6 requests in request state 9, beside unseeded neighbours.
    others = [SamplingParams(temperature=0.7) for _ in range(5)]
    crowd, sampler = v2_rejection_sampler(12, V, K)
    states = [2, 5, 0, 9, 3, 7]
    v2_add_requests(sampler, states, others[:3] + [mine] + others[3:])
    noise = torch.randn(6 * (K + 1), V, generator=g)
    noise[3 * (K + 1): 4 * (K + 1)] = lines
    sampled_crowd, num_crowd = v2_verify(crowd, v2_step(states, [drafts] * 6, [5, 6, 7, 40, 8, 9]), noise)
    assert int(num_crowd[3]) == int(num_alone[0])
    assert sampled_crowd[3].tolist() == sampled_alone[0].tolist()
    # Other positions draw other numbers (over many positions the tokens differ somewhere).
    assert any(v2_verify(alone, v2_step([0], [drafts], [p]), lines)[0][0].tolist() != sampled_alone[0].tolist() for p in range(41, 60))


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_logprobs_are_log_p_of_the_emitted_tokens(plugin, mode):
    g = torch.Generator().manual_seed(9)
    num_reqs = 64
    params = [SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=b, logprobs=2) for b in range(num_reqs - 4)]
    params += [SamplingParams(temperature=0.0, logprobs=2) for _ in range(4)]
    rejection_sampler, _ = batch_of(num_reqs, params, logprobs_mode=mode)
    logits = torch.randn(num_reqs * (K + 1), V, generator=g) * 2
    drafts = logits.reshape(num_reqs, K + 1, V)[:, :K].argmax(dim=-1).tolist()
    step = v2_step(list(range(num_reqs)), drafts, [0] * num_reqs)
    lines, sampled, num_sampled = v2_verify_once(rejection_sampler, step, logits)
    if mode == "raw_logprobs":
        assert lines is logits  # vLLM reads the raw logits itself in raw modes: nothing is copied
        return
    for b in range(num_reqs):
        temperature = 0.8 if b < num_reqs - 4 else 0.0
        per_position = logits.reshape(num_reqs, K + 1, V)[b]
        if temperature:
            expected = torch.log(laws_of(per_position, 0.8, 10, 0.9))
        else:
            expected = torch.log_softmax(per_position, dim=-1)  # greedy rows: unscaled, unfiltered
        got = torch.log_softmax(lines.reshape(num_reqs, K + 1, V)[b], dim=-1)
        for k in range(int(num_sampled[b])):
            token = int(sampled[b, k])
            assert torch.isfinite(got[k, token])
            torch.testing.assert_close(got[k, token], expected[k, token].float(), atol=2e-5, rtol=1e-5)
    # The same tokens' processed log-probabilities straight from specdec_ext's verify.
    first = specdec_ext.verify(logits.reshape(num_reqs, K + 1, V)[:1], None, torch.tensor(drafts[:1]), temperature=0.8, top_k=10, top_p=0.9,
                               seeds=torch.tensor([0]), offsets=torch.tensor([0]), return_logprobs="processed")
    n = int(first.num_accepted[0]) + 1
    assert first.tokens[0, :n].tolist() == sampled[0, :n].tolist()
    torch.testing.assert_close(first.logprobs[0, :n], torch.log_softmax(lines[: K + 1], dim=-1)[torch.arange(n), sampled[0, :n]], atol=2e-5, rtol=1e-5)


def test_min_p_and_vllm_processors_apply_before_the_fused_filters(plugin):
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

    class BoostToken(LogitsProcessor):
        """A custom V2 processor (pure torch): +3 on token 1 for requests that ask for it."""

        def __init__(self):
            self.on = torch.zeros(64, dtype=torch.bool)

        def add_request(self, req_idx, sampling_params):
            self.on[req_idx] = bool((sampling_params.extra_args or {}).get("boost"))
            return bool(self.on[req_idx])

        def apply(self, logits, ctx):
            logits[self.on[ctx.expanded_idx_mapping], 1] += 3.0
            return logits

    g = torch.Generator().manual_seed(4)
    num_reqs = 10000
    target = torch.randn(K + 1, V, generator=g)
    params = [SamplingParams(temperature=0.9, min_p=0.05, top_p=0.9, seed=b, extra_args={"boost": True}) for b in range(num_reqs)]
    boost = BoostToken()
    boost.on = torch.zeros(num_reqs, dtype=torch.bool)
    rejection_sampler, _ = batch_of(num_reqs, params, custom_logits_processors=[boost])
    drafts = [[2, 2, 2]] * num_reqs
    sampled, num_sampled = v2_verify(rejection_sampler, v2_step(list(range(num_reqs)), drafts, [0] * num_reqs), target.repeat(num_reqs, 1))
    boosted = target.clone()
    boosted[:, 1] += 3.0
    scaled = boosted / 0.9
    min_p_cut = scaled.amax(dim=-1, keepdim=True) + torch.log(torch.tensor(0.05))  # vLLM's min-p, on l / T
    law = processed_probs(torch.where(scaled < min_p_cut, torch.tensor(float("-inf")), boosted), 0.9, None, 0.9)
    failed, report = position_laws_fail(sampled, num_sampled.long() - 1, law)
    assert not failed, report
    # Wrong variant: the same verification without the processor (vLLM's own processing skipped).
    unboosted = processed_probs(target, 0.9, None, 0.9)
    assert position_laws_fail(sampled, num_sampled.long() - 1, unboosted)[0]


def test_what_specdec_ext_does_not_implement_goes_to_vllm_once(plugin, monkeypatch):
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler as v2

    calls = []

    def vllm_rejection_sample(*args, **kwargs):  # stands in for vLLM's Triton kernels, which need a GPU
        calls.append(args[11] is not None)  # vLLM passes its synthetic acceptance rates 12th
        num_reqs = args[3].shape[0] - 1
        return torch.zeros(num_reqs, K + 1, dtype=torch.int64), torch.ones(num_reqs, dtype=torch.int32)

    monkeypatch.setattr(v2, "rejection_sample", vllm_rejection_sample)
    rejection_sampler, sampler = v2_rejection_sampler(2, V, K)
    v2_add_requests(sampler, [0, 1], [SamplingParams(temperature=0.0)] * 2)
    rejection_sampler.synthetic_conditional_rates = torch.tensor([0.9, 0.8, 0.7])
    step = v2_step([0, 1], [[1, 2, 3]] * 2, [0, 0])
    with plugin_log() as records:
        for _ in range(3):
            v2_verify(rejection_sampler, step, torch.randn(8, V))
    assert calls == [True, True, True]  # vLLM's own rejection_sample ran
    notes = [r.getMessage() for r in records if "not implemented by specdec_ext" in r.getMessage()]
    assert len(notes) == 1 and "synthetic" in notes[0]


def test_placeholder_drafts_end_verification_and_that_position_draws_from_the_target(plugin):
    # vLLM marks drafts that must not be accepted with -1 (a grammar's rejection, a step inside the prefill).
    g = torch.Generator().manual_seed(13)
    num_reqs = 10000
    target = torch.randn(K + 1, V, generator=g) * 1.5
    argmax = target.argmax(dim=-1).tolist()
    params = [SamplingParams(temperature=0.0) if b % 10 == 0 else SamplingParams(temperature=1.0, top_k=8, seed=b) for b in range(num_reqs)]
    rejection_sampler, _ = batch_of(num_reqs, params)
    drafts = [[argmax[0], 3, argmax[2]]] * num_reqs
    step = v2_step(list(range(num_reqs)), drafts, [0] * num_reqs)
    verify_drafts = step.draft_sampled.clone()
    verify_drafts[2::K + 1] = -1  # every request's second draft
    batch = step.input_batch
    _, sampled, num_sampled = rejection_sampler._verify(
        target.repeat(num_reqs, 1), None, step.draft_sampled, step.pos, batch.cu_num_logits, batch.idx_mapping, batch.idx_mapping_np,
        batch.expanded_idx_mapping, batch.expanded_local_pos, batch.seq_lens_cpu_upper_bound.numpy(), verify_drafts,
    )
    assert (num_sampled <= 2).all()  # the placeholder is never accepted
    greedy = torch.arange(num_reqs) % 10 == 0
    assert (sampled[greedy, :2] == torch.tensor(argmax[:2])).all()  # greedy rows emit the argmax there
    law = laws_of(target, 1.0, 8, 1.0)
    reached = ~greedy & (num_sampled == 2)
    failed, report = chi_square_fails(torch.bincount(sampled[reached, 1], minlength=V), law[1])
    assert not failed, report
    # Wrong variant: the placeholder treated as a rejected draft of some id (here the likeliest), so that
    # position draws from the residual max(p - q, 0) instead of from p.
    residual = (law[1] - torch.nn.functional.one_hot(law[1].argmax(), V)).clamp(min=0)
    wrong = torch.multinomial(residual / residual.sum(), int(reached.sum()), replacement=True, generator=g)
    assert chi_square_fails(torch.bincount(wrong, minlength=V), law[1])[0]
