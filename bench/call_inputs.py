"""The inputs the GPU model's calls are measured on (``bench.gpu_rows``) and walked on
(``bench.gpu_model``'s tree rows): target logits ``3 * randn``, draft logits the target's plus
``randn``; lines whose cut the candidates settle have four tokens raised by 20 (about 99 % of the
mass); the whole-line rows' lines are flat (``0.2 * randn``). Trees have the model's shape
(:data:`TREE_PARENTS`)."""

from __future__ import annotations

TREE_PARENTS = [-1, 0, 0, 1, 2, 3, -1, 6]  # the model's tree: 8 nodes, 4 deep
INPUTS = ("target 3*randn, draft = target + randn; lines the candidates settle: four tokens raised by 20 (~99 % of the mass); "
          "whole-line rows: flat lines, 0.2*randn")


def inputs(call, device: str, seed: int = 0) -> dict:
    """The tensors and keyword arguments of ``call`` (a ``bench.gpu_model.Call``), generated on
    ``device`` as the module says."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[call.dtype]
    batch, k, vocab = call.batch, call.k, call.vocab
    contexts = k + 1
    draft_lines = k + 1 if call.method == "tree" else k
    if call.whole_line:
        target = 0.2 * torch.randn(batch, contexts, vocab, device=device, generator=g)
    else:
        target = 3 * torch.randn(batch, contexts, vocab, device=device, generator=g)
        raised = torch.randint(0, vocab, (batch, contexts, 4), device=device, generator=g)
        target.scatter_add_(2, raised, torch.full(raised.shape, 20.0, device=device))
    draft = target[:, :draft_lines] + torch.randn(batch, draft_lines, vocab, device=device, generator=g)
    tokens = torch.randint(0, vocab, (batch, k), device=device, generator=g)
    kwargs = {"backend": "triton", "check": False, "seeds": torch.arange(batch, device=device) + 7}
    if call.temperature != 1.0:
        kwargs["temperature"] = call.temperature
    if call.top_k:
        kwargs["top_k"] = call.top_k
    if call.top_p < 1.0:
        kwargs["top_p"] = call.top_p
    if call.method == "tree":
        kwargs["siblings"] = call.siblings
    elif call.method == "block":
        kwargs["method"] = "block"
    args = {"target": target.to(dtype), "draft": None if call.draft == "one-hot" else draft.to(dtype), "tokens": tokens}
    if call.method == "tree":
        args["parents"] = torch.tensor([TREE_PARENTS[:k]] * batch, device=device)
    return {"args": args, "kwargs": kwargs}
