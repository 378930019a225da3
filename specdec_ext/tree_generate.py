"""Batched speculative generation with draft trees and with block verification.

One step, for every row still generating:

1. the draft expands a tree level by level: at depth d every node of depth d - 1 gets ``branching[d-1]``
   children, sampled from the draft's processed law at that node (i.i.d. or without replacement) or
   its top tokens for greedy decoding; each level is one draft forward over all its nodes, with a 4-D
   tree attention mask (a node sees the committed sequence and its own ancestors) and per-node
   position ids (committed length + depth);
2. the target scores the pending token and every node in ONE forward with the same kind of mask;
3. :func:`specdec_ext.verify_tree` (or block / token verification of a chain) picks a path and
   emits one more token;
4. in both KV caches only the accepted path's entries stay: the step's slots are gathered per row to
   the accepted ones (ragged rows leave dead slots, masked out for good and squeezed out once they
   outweigh the live ones).

A chain is the tree with branching (1, ..., 1): ``method="block"`` verifies it with block verification.
Exactness holds as for :func:`specdec_ext.generate`: the children of a context are drawn from exactly
the law q that verification is given (the same raw logits and processing), so the emitted tokens
follow the target's processed law whatever the tree.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from ._params import _check_scalar_params
from .api import verify, verify_tree
from .generate import _Clock, stderr_of_mean
from .reference import process_lines

#: Candidate trees for ``tree="auto"``: branching factors per depth, at most AUTO_MAX_NODES nodes.
AUTO_MAX_NODES = 8
#: Squeeze dead slots out of a cache once they exceed SQUEEZE_MIN_DEAD and SQUEEZE_DEAD_RATIO times the
#: live slots of the longest row: one gather then saves attention work on every later step.
SQUEEZE_MIN_DEAD = 32
SQUEEZE_DEAD_RATIO = 1.0


@dataclass(frozen=True)
class DraftTree:
    """A tree shape: ``branching[d]`` children for every node at depth d (the root is depth 0).

    Nodes are numbered level by level (breadth first), children of one parent consecutively, so the
    nodes up to any depth are a prefix of the node list (a ragged row uses ``num_nodes`` of them).
    """

    branching: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]  # depth of each node, 1 for the root's children
    levels: tuple[tuple[int, int], ...]  # [start, end) node range of each depth 1..D

    @classmethod
    def from_branching(cls, branching) -> DraftTree:
        branching = tuple(int(w) for w in branching)
        if not branching or any(w < 1 for w in branching):
            raise ValueError(f"tree must give at least one depth and >= 1 child per node at each depth, got {branching!r}")
        parents, depths, levels = [], [], []
        previous = [-1]
        for depth, width in enumerate(branching, start=1):
            start = len(parents)
            for parent in previous:
                parents.extend([parent] * width)
                depths.extend([depth] * width)
            levels.append((start, len(parents)))
            previous = list(range(start, len(parents)))
        return cls(branching, tuple(parents), tuple(depths), tuple(levels))

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return len(self.branching)

    def nodes_within(self, depth: int) -> int:
        """How many nodes lie at depth <= ``depth`` (a prefix of the node list)."""
        return self.levels[min(depth, self.max_depth) - 1][1] if depth >= 1 else 0

    def ancestors(self) -> torch.Tensor:
        """(N, N) bool: [i, j] when node j is node i or one of its ancestors."""
        n = self.num_nodes
        table = torch.eye(n, dtype=torch.bool)
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                table[node] |= table[parent]
        return table


def candidate_trees(max_nodes: int = AUTO_MAX_NODES) -> list[DraftTree]:
    """Every branching (w_1, ..., w_D) with w_1 >= w_2 >= ... >= 1 and at most ``max_nodes`` nodes."""
    found = []

    def extend(prefix: tuple[int, ...], nodes: int, width_at_depth: int):
        if prefix:
            found.append(DraftTree.from_branching(prefix))
        top = prefix[-1] if prefix else max_nodes
        for w in range(1, top + 1):
            more = width_at_depth * w
            if nodes + more <= max_nodes:
                extend(prefix + (w,), nodes + more, more)

    extend((), 0, 1)
    return found


def expected_tokens(tree: DraftTree, child_acceptance: float) -> float:
    """Tokens one step emits in expectation if each child is entered with probability ``a``
    independently of its siblings (a planning model, not the exact law): a node with w children is
    left through one of them with probability 1 - (1 - a)^w, plus the one corrected / bonus token."""
    a = min(max(child_acceptance, 0.0), 1.0)
    reach, total = 1.0, 1.0
    for width in tree.branching:
        reach *= 1.0 - (1.0 - a) ** width
        total += reach
    return total


class _TreeShapes:
    """The tree of each step: fixed, or "auto" from the running per-child acceptance and costs.

    "auto" picks, among :func:`candidate_trees`, the one maximising expected tokens per unit of time,
    with the time of a step modelled as target forward (growing with the nodes scored, measured) plus
    one draft forward per depth (measured ratio).
    """

    def __init__(self, tree, num_draft_tokens: int):
        self.auto = tree == "auto"
        if self.auto:
            self.fixed = None
        elif tree is None:
            self.fixed = DraftTree.from_branching((1,) * num_draft_tokens)
        elif isinstance(tree, DraftTree):
            self.fixed = tree
        elif isinstance(tree, (list, tuple)) and all(isinstance(w, int) and not isinstance(w, bool) for w in tree):
            self.fixed = DraftTree.from_branching(tree)
        else:
            raise ValueError(f"tree must be None, a sequence of children per node at each depth (e.g. (2, 2, 1)) or 'auto', got {tree!r}")
        self.entered = self.tested = 0.0
        self.draft_cost = None  # seconds of one draft forward / seconds of one target forward
        self.node_cost = 0.0  # extra target seconds per scored node / target forward seconds
        self.steps = 0

    def choose(self) -> DraftTree:
        if not self.auto:
            return self.fixed
        if self.draft_cost is None:
            return DraftTree.from_branching((2, 1, 1))
        a = (self.entered + 1.0) / (self.tested + 2.0)

        def value(tree: DraftTree) -> float:
            cost = 1.0 + self.node_cost * tree.num_nodes + self.draft_cost * tree.max_depth
            return expected_tokens(tree, a) / cost

        return max(candidate_trees(), key=lambda tree: (value(tree), -tree.num_nodes))

    def update(self, entered: int, tested: int, tree: DraftTree, draft_seconds: float, target_seconds: float) -> None:
        self.steps += 1
        self.entered = 0.8 * self.entered + entered
        self.tested = 0.8 * self.tested + tested
        if self.steps == 1 or target_seconds <= 0:
            return
        ratio = draft_seconds / tree.max_depth / target_seconds
        self.draft_cost = ratio if self.draft_cost is None else 0.8 * self.draft_cost + 0.2 * ratio


# ------------------------------------------------------------------------------------------------------
# KV caches


def _new_cache(model):
    from transformers import DynamicCache

    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=model.config)
    return DynamicCache()


class _ModelCache:
    """A model, its KV cache, and the (rows, slots) mask of slots holding a live token of that row.

    Every row feeds the same number of tokens per forward, so the batch stays rectangular; a slot
    whose token was not accepted (or a padding slot) is dead: masked out of every later query. Each
    step's slots form a *segment*: the step ends by gathering, per row, the accepted slots of its
    segment to the segment's front and cutting the rest.
    """

    def __init__(self, model, name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        parameters = inspect.signature(model.forward).parameters
        if "position_ids" not in parameters:
            raise ValueError(f"{name} ({type(model).__name__}) takes no position_ids, which tree attention needs")
        self.attention = getattr(model.config, "_attn_implementation", None)
        if self.attention not in ("sdpa", "eager"):
            raise ValueError(f"{name} uses attn_implementation={self.attention!r}; tree generation builds a 4-D attention mask, "
                             "which needs 'sdpa' or 'eager'")
        self.model = model
        self.device = model.device
        self.dtype = model.dtype
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.keeps_logits = "logits_to_keep" in parameters
        self.vocab_in = model.get_input_embeddings().num_embeddings
        self.cache = _new_cache(model)
        self.forwards = 0
        self.live = torch.zeros(input_ids.shape[0], 0, dtype=torch.bool, device=self.device)
        self.segment_start = 0
        # Prefill every prompt token but the last, which each step feeds as the pending token.
        prompt, mask = input_ids[:, :-1], attention_mask[:, :-1].bool()
        if prompt.shape[1]:
            positions = (mask.long().cumsum(1) - 1).clamp(min=0)
            causal = torch.tril(torch.ones(prompt.shape[1], prompt.shape[1], dtype=torch.bool, device=self.device))
            self.feed(prompt, positions, causal[None].expand(prompt.shape[0], -1, -1) & mask[:, None, :], mask, logits_to_keep=1)
        layers = getattr(self.cache, "layers", None)
        if prompt.shape[1] and (not layers or not all(_plain_layer(layer) for layer in layers)):
            raise ValueError(f"{name} ({type(model).__name__}): tree generation needs a DynamicCache of plain attention layers "
                             "(no sliding-window, recurrent or quantized caches)")

    def begin_segment(self) -> None:
        self.segment_start = self.live.shape[1]

    def feed(self, tokens, positions, visible_in_segment, live_new, logits_to_keep: int | None = None) -> torch.Tensor:
        """Run the model on (rows, Q) tokens appended to the cache.

        ``visible_in_segment``: (rows, Q, S_seg) bool, which slots of the current segment (its earlier
        slots, then these Q) each query sees; every live slot before the segment is visible to all.
        ``live_new``: (rows, Q) bool, the new slots that hold a real token.
        """
        tokens = tokens.to(self.device)
        tokens = torch.where((tokens >= 0) & (tokens < self.vocab_in), tokens, 0)  # ids only the target has: shown as 0
        before = self.live[:, : self.segment_start]
        self.live = torch.cat([self.live, live_new.to(self.device)], dim=1)
        queries = tokens.shape[1]
        visible = torch.cat([before[:, None, :].expand(-1, queries, -1), visible_in_segment.to(self.device)], dim=2)
        visible &= self.live[:, None, :]
        visible |= ~visible.any(-1, keepdim=True)  # a padding query seeing nothing would give NaN: let it see all
        if self.attention == "sdpa":
            mask = visible[:, None]
        else:
            mask = torch.zeros(visible[:, None].shape, dtype=self.dtype, device=self.device).masked_fill_(~visible[:, None], torch.finfo(self.dtype).min)
        kwargs = {self.cache_argument: self.cache}
        if logits_to_keep is not None and self.keeps_logits:
            kwargs["logits_to_keep"] = logits_to_keep
        output = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions.to(self.device), use_cache=True, **kwargs)
        self.forwards += 1
        logits = output.logits
        return logits[:, -logits_to_keep:] if logits_to_keep is not None else logits

    def end_segment(self, keep: torch.Tensor) -> None:
        """Keep, per row, the segment's slots where ``keep`` (rows, S_seg) is True, in order; cut the rest."""
        keep = keep.to(self.device) & self.live[:, self.segment_start :]
        width = int(keep.sum(1).max()) if keep.numel() else 0
        # A stable sort puts each row's kept slots first, in slot order.
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
        self._gather_tail(self.segment_start, order, keep.gather(1, order))

    def squeeze(self) -> None:
        """Gather every row's live slots to the end once dead ones dominate (attention work saved later)."""
        live_per_row = self.live.sum(1)
        longest = int(live_per_row.max()) if live_per_row.numel() else 0
        dead = self.live.shape[1] - longest
        if dead <= 0 or dead <= SQUEEZE_MIN_DEAD or dead <= SQUEEZE_DEAD_RATIO * longest:
            return
        order = torch.sort(self.live.to(torch.int8), dim=1, stable=True).indices[:, self.live.shape[1] - longest :]
        self._gather_tail(0, order, self.live.gather(1, order))

    def _gather_tail(self, start: int, order: torch.Tensor, live: torch.Tensor) -> None:
        """Replace slots [start, end) by the per-row slots ``start + order`` (rows, W)."""
        index = order[:, None, :, None]
        for layer in getattr(self.cache, "layers", []):
            if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
                continue
            head_k, head_v = layer.keys[:, :, :start], layer.values[:, :, :start]
            tail_k = torch.take_along_dim(layer.keys[:, :, start:], index, dim=2)
            tail_v = torch.take_along_dim(layer.values[:, :, start:], index, dim=2)
            layer.keys, layer.values = torch.cat([head_k, tail_k], 2), torch.cat([head_v, tail_v], 2)
        self.live = torch.cat([self.live[:, :start], live], dim=1)

    def select_rows(self, index: torch.Tensor) -> None:
        index = index.to(self.device)
        self.cache.batch_select_indices(index)
        self.live = self.live[index]


def _plain_layer(layer) -> bool:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    return type(layer).__name__ == "DynamicLayer" and isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == 4


# ------------------------------------------------------------------------------------------------------
# Drafting


def _draw_children(logits: torch.Tensor, width: int, sampling: dict, siblings: str, generator) -> torch.Tensor:
    """(R, width) children of R contexts from their (R, Vd) raw draft logits.

    Sampled rows: i.i.d. draws from the processed law q (one exponential race per child), or the first
    ``width`` of one race (a draw without replacement: the order statistics of q(y) / E_y).
    Greedy (temperature 0): the top ``width`` raw logits, lowest id first on ties.
    """
    rows, vocab = logits.shape
    if sampling["temperature"] == 0:
        return torch.sort(logits.float(), dim=1, descending=True, stable=True).indices[:, :width]
    q = process_lines(logits, torch.full((rows,), float(sampling["temperature"]), device=logits.device),
                      torch.full((rows,), int(sampling["top_k"] or 0), device=logits.device),
                      torch.full((rows,), float(1.0 if sampling["top_p"] is None else sampling["top_p"]), device=logits.device)).probs()
    copies = width if siblings == "iid" else 1
    noise_device = generator.device if generator is not None else logits.device  # a CPU generator may drive a CUDA model
    noise = torch.empty(rows, copies, vocab, device=noise_device).exponential_(generator=generator).to(logits.device)
    keys = q[:, None, :] / noise
    if siblings == "iid":
        return keys.argmax(dim=2)
    return torch.topk(keys[:, 0], width, dim=1).indices


def _expand(draft: _ModelCache, shape: DraftTree, rows: _Rows, sampling: dict, siblings: str, generator):
    """Draft a tree per row: (tokens (b, N), draft logits (b, N+1, Vd) at every context (zeros at leaves))."""
    batch = rows.pending.shape[0]
    device = rows.pending.device
    draft.begin_segment()
    unfed = rows.draft_unfed  # (b, U) committed tokens the draft has not seen, -1 = none (left padding)
    u = unfed.shape[1]
    live = unfed >= 0
    positions = rows.length[:, None] - u + torch.arange(u, device=device)[None, :]
    causal = torch.tril(torch.ones(u, u, dtype=torch.bool, device=device))[None].expand(batch, -1, -1)
    context_logits = [draft.feed(unfed, positions.clamp(min=0), causal, live, logits_to_keep=1)[:, -1].to(device)]
    tokens = torch.zeros(batch, shape.num_nodes, dtype=torch.long, device=device)
    ancestors = shape.ancestors().to(device)
    for depth, (start, end) in enumerate(shape.levels, start=1):
        above = (0, 1) if depth == 1 else (1 + shape.levels[depth - 2][0], 1 + shape.levels[depth - 2][1])  # contexts of the parents
        parents_logits = torch.stack(context_logits[above[0] : above[1]], 1)
        width = shape.branching[depth - 1]
        children = _draw_children(parents_logits.reshape(-1, parents_logits.shape[-1]), width, sampling, siblings, generator)
        tokens[:, start:end] = children.reshape(batch, end - start)
        if depth < shape.max_depth:  # the deepest level's own laws are never needed
            seen = torch.cat([live[:, None, :].expand(-1, end - start, -1), ancestors[None, start:end, :end].expand(batch, -1, -1)], 2)
            node_positions = rows.length[:, None] - 1 + depth
            logits = draft.feed(tokens[:, start:end], node_positions.expand(-1, end - start), seen, torch.ones(batch, end - start, dtype=torch.bool))
            context_logits.extend(logits.to(device).unbind(1))
    vocab = context_logits[0].shape[-1]
    missing = shape.num_nodes + 1 - len(context_logits)
    leaves = [torch.zeros(batch, vocab, dtype=context_logits[0].dtype, device=device)] * missing
    return tokens, torch.stack(context_logits + leaves, 1)


def _score(target: _ModelCache, shape: DraftTree, rows: _Rows, tokens: torch.Tensor) -> torch.Tensor:
    """One target forward over the pending token and every node: (b, N+1, V) logits at each context."""
    batch = tokens.shape[0]
    device = tokens.device
    target.begin_segment()
    nodes = shape.num_nodes
    ancestors = shape.ancestors().to(device)
    seen = torch.zeros(batch, nodes + 1, nodes + 1, dtype=torch.bool, device=device)
    seen[:, :, 0] = True  # everyone sees the pending token
    seen[:, 1:, 1:] = ancestors[None]
    depth = torch.tensor((0,) + shape.depths, device=device)
    positions = rows.length[:, None] - 1 + depth[None, :]
    block = torch.cat([rows.pending[:, None], tokens], 1)
    return target.feed(block, positions, seen, torch.ones(batch, nodes + 1, dtype=torch.bool)).to(device)


# ------------------------------------------------------------------------------------------------------
# The loop


@dataclass
class _Rows:
    """The rows still generating (device tensors unless marked host)."""

    index: torch.Tensor  # (b,) output row
    pending: torch.Tensor  # (b,) last committed token: fed to the target next step
    draft_unfed: torch.Tensor  # (b, U) committed tokens the draft has not seen yet (the pending one last), -1 padded on the left
    length: torch.Tensor  # (b,) committed tokens without padding, pending included
    generated: torch.Tensor  # (b,) new tokens so far
    generated_host: list[int] = field(default_factory=list)


@dataclass
class TreeStats:
    """What a tree / block :func:`generate` call did.

    acceptance_per_position: entry d-1 is the rate at which a row at depth d-1 with children entered one.
    mean_acceptance: children entered / contexts with children the walks reached (the chain's per-token rate).
    mean_accepted_per_step: nodes entered per row per step.
    tokens_per_target_forward: new tokens per row per verification forward.
    target_forwards / draft_forwards: model calls, prefill included.
    draft_seconds / target_seconds / verify_seconds: time in drafting (forwards and sampling), in the
        target's forwards, and in verifying and writing tokens out.
    draft_lengths: nodes scored at each step. trees: the branching of each step.
    tokens_per_target_forward_stderr: standard error of ``tokens_per_target_forward``.
    """

    acceptance_per_position: list[float]
    mean_acceptance: float
    mean_accepted_per_step: float
    tokens_per_target_forward: float
    target_forwards: int
    draft_forwards: int
    draft_seconds: float
    target_seconds: float
    verify_seconds: float
    draft_lengths: list[int]
    trees: list[tuple[int, ...]]
    tokens_per_target_forward_stderr: float = float("nan")


@dataclass
class TreeOutput:
    """sequences: (B, L_in + max_new_tokens) int64; stats: :class:`TreeStats`."""

    sequences: torch.Tensor
    stats: TreeStats


def generate_tree(target_model, draft_model, input_ids, attention_mask=None, *, max_new_tokens: int, do_sample: bool = True,
                  temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, tree=None, method: str = "token",
                  num_draft_tokens: int = 4, siblings: str = "without_replacement", generator: torch.Generator | None = None,
                  eos_token_id=None, pad_token_id: int | None = None) -> TreeOutput:
    """Speculative generation with a draft tree (or a chain verified blockwise); exactly the target's law.

    Args:
        target_model, draft_model: transformers causal LMs sharing a vocabulary (the draft's may be a
            prefix of the target's), with sdpa or eager attention and a DynamicCache.
        input_ids, attention_mask: (B, L_in) left-padded prompts and their mask (None = all ones).
        max_new_tokens, do_sample, temperature, top_k, top_p, generator, eos_token_id, pad_token_id:
            as for :func:`specdec_ext.generate`.
        tree: None (a chain of ``num_draft_tokens``), children per node at each depth, e.g. (2, 2, 1)
            (2 + 4 + 4 = 10 nodes), or "auto" (a tree of at most AUTO_MAX_NODES nodes chosen each step
            from the running acceptance rate and measured costs).
        method: "token" (token-wise / recursive rejection sampling) or "block": block verification of
            a chain (Sun et al.); block needs a chain (tree None or all ones).
        siblings: how a node's sampled children are drawn: "without_replacement" (distinct children,
            the default) or "iid".

    Returns:
        TreeOutput(sequences (B, L_in + max_new_tokens), stats).
    """
    from .generate import _check_inputs, _check_models, _eos_ids, _pad_value

    if method not in ("token", "block"):
        raise ValueError(f"method must be 'token' or 'block', got {method!r}")
    if siblings not in ("iid", "without_replacement"):
        raise ValueError(f"siblings must be 'iid' or 'without_replacement', got {siblings!r}")
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be an integer >= 1 with a tree or block verification, got {num_draft_tokens!r}")
    shapes = _TreeShapes(tree, num_draft_tokens)
    if method == "block" and (shapes.auto or any(w != 1 for w in shapes.fixed.branching)):
        raise ValueError(f"method='block' verifies chains: give tree=None or (1, ..., 1), got tree={tree!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    _check_models(target_model, draft_model)
    device = target_model.device
    input_ids, attention_mask = _check_inputs(input_ids, attention_mask, device)
    sampling = _sampling(do_sample, temperature, top_k, top_p)
    eos = _eos_ids(target_model, eos_token_id, device)
    pad = _pad_value(target_model, pad_token_id, eos)
    batch, width = input_ids.shape
    sequences = torch.full((batch, width + max_new_tokens + 1), pad, dtype=torch.long, device=device)  # last column: scratch
    sequences[:, :width] = input_ids
    clock = _Clock(device)
    tally = _Tally()
    with torch.no_grad():
        marks = [clock.mark()]
        target = _ModelCache(target_model, "target_model", input_ids, attention_mask)
        marks.append(clock.mark())
        draft = _ModelCache(draft_model, "draft_model", input_ids, attention_mask)
        marks.append(clock.mark())
        length = attention_mask.sum(1)
        rows = _Rows(torch.arange(batch, device=device), input_ids[:, -1], input_ids[:, -1:], length, torch.zeros_like(length), [0] * batch)
        while max_new_tokens and rows.index.numel():
            _step(target, draft, rows, shapes, method, siblings, sampling, generator, eos, sequences, width, max_new_tokens, clock, tally)
        target_prefill, draft_prefill = clock.spans(marks)
    tally.seconds[0] += draft_prefill
    tally.seconds[1] += target_prefill
    return TreeOutput(sequences[:, :-1].contiguous(), tally.stats(target, draft))


def _sampling(do_sample, temperature, top_k, top_p) -> dict:
    if not do_sample:
        return {"temperature": 0.0, "top_k": None, "top_p": None}
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} must be a number or None, got {value!r}")
    if top_k is not None and not isinstance(top_k, int):
        raise ValueError(f"top_k must be an integer or None, got {top_k!r}")
    _check_scalar_params(temperature, top_k, top_p)
    return {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}


@dataclass
class _Tally:
    reached: list[int] = field(default_factory=list)
    entered_at: list[int] = field(default_factory=list)
    emitted: int = 0
    emitted_squares: int = 0
    accepted: int = 0
    row_steps: int = 0
    nodes: list[int] = field(default_factory=list)
    trees: list[tuple[int, ...]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])

    def stats(self, target: _ModelCache, draft: _ModelCache) -> TreeStats:
        steps = max(self.row_steps, 1)
        tested = sum(self.reached)
        return TreeStats(
            acceptance_per_position=[e / r if r else float("nan") for e, r in zip(self.entered_at, self.reached, strict=True)],
            mean_acceptance=sum(self.entered_at) / tested if tested else float("nan"),
            mean_accepted_per_step=self.accepted / steps,
            tokens_per_target_forward=self.emitted / steps,
            target_forwards=target.forwards, draft_forwards=draft.forwards,
            draft_seconds=self.seconds[0], target_seconds=self.seconds[1], verify_seconds=self.seconds[2],
            draft_lengths=self.nodes, trees=self.trees,
            tokens_per_target_forward_stderr=stderr_of_mean(self.emitted, self.emitted_squares, self.row_steps),
        )


def _step(target, draft, rows: _Rows, shapes: _TreeShapes, method, siblings, sampling, generator, eos, sequences, prompt_width,
          max_new_tokens, clock: _Clock, tally: _Tally) -> None:
    """One step for every row still generating: expand, score, verify, commit. One host sync."""
    shape = shapes.choose()
    remaining_host = [max_new_tokens - g for g in rows.generated_host]
    # Rows near the end verify only the levels whose tokens they can still use.
    depth_cap = min(shape.max_depth, max(remaining_host) - 1)
    if depth_cap < shape.max_depth:
        shape = DraftTree.from_branching(shape.branching[: max(depth_cap, 1)])
    budget = torch.tensor([shape.nodes_within(r - 1) for r in remaining_host], device=rows.pending.device)
    marks = [clock.mark()]
    tokens, draft_logits = _expand(draft, shape, rows, sampling, siblings, generator)
    marks.append(clock.mark())
    target_logits = _score(target, shape, rows, tokens)
    marks.append(clock.mark())
    greedy = sampling["temperature"] == 0
    device = tokens.device
    batch = tokens.shape[0]
    parents = torch.tensor(shape.parents, device=device).expand(batch, -1)
    if method == "block":
        result = verify(target_logits, None if greedy else draft_logits[:, :-1], tokens, num_draft_tokens=budget, generator=generator, check=False,
                        method=method, **sampling)
        emitted_tokens, accepted = result.tokens, result.num_accepted
        path = torch.where(torch.arange(shape.num_nodes, device=device)[None, :] < accepted[:, None], torch.arange(shape.num_nodes, device=device)[None, :], -1)
    else:
        result = verify_tree(target_logits, None if greedy else draft_logits, tokens, parents, num_nodes=budget, siblings=siblings,
                             generator=generator, check=False, **sampling)
        emitted_tokens, accepted, path = result.tokens, result.num_accepted, result.accepted_nodes
    emitted = accepted + 1
    offsets = torch.arange(emitted_tokens.shape[1], device=device)[None, :]
    hit_eos = torch.zeros_like(accepted, dtype=torch.bool)
    if eos is not None:
        is_eos = torch.isin(emitted_tokens, eos) & (offsets < emitted[:, None])
        hit_eos = is_eos.any(1)
        emitted = torch.where(hit_eos, is_eos.long().argmax(1) + 1, emitted)
    inside = offsets < emitted[:, None]
    columns = torch.where(inside, prompt_width + rows.generated[:, None] + offsets, sequences.shape[1] - 1)
    sequences.index_put_((rows.index[:, None].expand_as(columns), columns), emitted_tokens)
    # Per depth: rows that reached a context with children, and those that entered one.
    depth_index = torch.arange(shape.max_depth, device=device)[None, :]
    has_children = depth_index < torch.tensor([shape.depths[n - 1] if n else 0 for n in range(shape.num_nodes + 1)], device=device)[budget][:, None]
    reached = (accepted[:, None] >= depth_index) & has_children
    entered = accepted[:, None] > depth_index
    marks.append(clock.mark())
    counts = torch.cat([accepted, emitted, hit_eos.long(), (emitted_tokens[:, 0] < 0).long(), reached.sum(0), entered.sum(0)])
    host = counts.tolist()  # the step's one sync
    accepted_host, emitted_host, eos_host, invalid_host = host[:batch], host[batch : 2 * batch], host[2 * batch : 3 * batch], host[3 * batch : 4 * batch]
    reached_host, entered_host = host[4 * batch : 4 * batch + shape.max_depth], host[4 * batch + shape.max_depth :]
    if any(invalid_host):
        row = int(rows.index[invalid_host.index(1)])
        raise ValueError(f"row {row}: the target or draft model produced NaN / +inf logits, or logits that are -inf everywhere")
    spans = clock.spans(marks)
    while len(tally.reached) < shape.max_depth:
        tally.reached.append(0)
        tally.entered_at.append(0)
    for d in range(shape.max_depth):
        tally.reached[d] += reached_host[d]
        tally.entered_at[d] += entered_host[d]
    tally.emitted += sum(emitted_host)
    tally.emitted_squares += sum(e * e for e in emitted_host)
    tally.accepted += sum(accepted_host)
    tally.row_steps += batch
    tally.nodes.append(shape.num_nodes)
    tally.trees.append(shape.branching)
    tally.seconds = [total + span for total, span in zip(tally.seconds, spans, strict=True)]
    shapes.update(sum(entered_host), sum(reached_host), shape, spans[0], spans[1])
    _commit(target, draft, rows, shape, tokens, path, accepted, emitted_tokens, emitted, accepted_host, emitted_host, eos_host, max_new_tokens)


def _commit(target, draft, rows: _Rows, shape: DraftTree, tokens, path, accepted, emitted_tokens, emitted, accepted_host, emitted_host, eos_host,
            max_new_tokens) -> None:
    """Keep only the accepted path in both caches, advance the rows, drop the finished ones."""
    device = tokens.device
    batch = tokens.shape[0]
    nodes = shape.num_nodes
    if path.shape[1] < shape.max_depth:  # the verifier sizes its path to the deepest node any row used
        path = torch.cat([path, path.new_full((batch, shape.max_depth - path.shape[1]), -1)], 1)
    on_path = (path[:, :, None] == torch.arange(nodes, device=device)[None, None, :]).any(1)  # (b, N)
    # Target segment: the pending token, then every node.
    target.end_segment(torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=device), on_path], 1))
    # Draft segment: the unfed tokens, then the nodes it was fed (all levels but the deepest).
    fed = shape.levels[-2][1] if shape.max_depth > 1 else 0
    draft.end_segment(torch.cat([rows.draft_unfed >= 0, on_path[:, :fed]], 1))
    final = emitted_tokens.gather(1, accepted[:, None])[:, 0]
    # The draft has not seen a deepest-level node the row accepted, nor the final token.
    deepest = accepted == shape.max_depth
    last_node = tokens.gather(1, path.gather(1, (accepted - 1).clamp(min=0)[:, None]).clamp(min=0))[:, 0]
    unfed = torch.stack([torch.where(deepest, last_node, -1), final], 1)
    rows.draft_unfed = unfed if bool(deepest.any()) else unfed[:, 1:]
    rows.pending = final
    rows.length = rows.length + accepted + 1
    rows.generated = rows.generated + emitted
    rows.generated_host = [g + e for g, e in zip(rows.generated_host, emitted_host, strict=True)]
    keep = [b for b, g in enumerate(rows.generated_host) if not eos_host[b] and g < max_new_tokens]
    if len(keep) < batch:
        index = torch.tensor(keep, dtype=torch.long, device=device)
        target.select_rows(index)
        draft.select_rows(index)
        for name in ("index", "pending", "draft_unfed", "length", "generated"):
            setattr(rows, name, getattr(rows, name)[index])
        rows.generated_host = [rows.generated_host[b] for b in keep]
    if keep:
        target.squeeze()
        draft.squeeze()
