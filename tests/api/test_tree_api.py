"""verify_tree's contract: shapes, the accepted path, validation, bad trees, lazy reading, keys."""

from __future__ import annotations

import pytest
import torch

import specdec_ext
from specdec_ext import available_backends, verify_tree

B, V = 4, 12
PARENTS = [-1, -1, 0, 0, 2, 1]  # depth 3 through node 0 -> 2 -> 4


def _inputs(seed=0, batch=B, parents=PARENTS, vocab=V):
    g = torch.Generator().manual_seed(seed)
    nodes = len(parents)
    target = torch.randn(batch, nodes + 1, vocab, generator=g) * 2
    draft = target + torch.randn(batch, nodes + 1, vocab, generator=g)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=g)
    return target, draft, tokens, torch.tensor(parents).expand(batch, -1).contiguous()


def _expect(match, **overrides):
    target, draft, tokens, parents = _inputs()
    args = {"target_logits": target, "draft_logits": draft, "draft_tokens": tokens, "parents": parents}
    kwargs = {"backend": "eager"}
    for key, value in overrides.items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(ValueError, match=match):
        verify_tree(args["target_logits"], args["draft_logits"], args["draft_tokens"], args["parents"], **kwargs)


def test_result_layout_and_accepted_path():
    target, draft, tokens, parents = _inputs()
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        out = verify_tree(target, draft, tokens, parents, generator=torch.Generator().manual_seed(1), backend=backend)
        assert out.tokens.shape == (B, len(PARENTS) + 1) and out.accepted_nodes.shape == (B, len(PARENTS)) and out.num_accepted.shape == (B,)
        for row in range(B):
            n = int(out.num_accepted[row])
            nodes = out.accepted_nodes[row, :n].tolist()
            assert (out.accepted_nodes[row, n:] == -1).all() and (out.tokens[row, n + 1 :] == -1).all()
            assert 0 <= int(out.tokens[row, n]) < V
            previous = -1
            for depth, node in enumerate(nodes):  # a root-to-leaf path of the tree
                assert PARENTS[node] == previous
                assert int(out.tokens[row, depth]) == int(tokens[row, node])
                previous = node


@pytest.mark.parametrize("backend", available_backends("cpu", "verify_tree"))
def test_the_output_width_follows_the_number_of_nodes_alone(backend):
    """tokens (B, N+1) and accepted_nodes (B, N) however deep the rows' trees or walks go: a width
    that depended on them would live on the device, and a device call would wait to read it."""
    target, draft, tokens, parents = _inputs()
    nodes = len(PARENTS)
    for num_nodes in (torch.tensor([0, 1, 2, 3]), torch.zeros(B, dtype=torch.int64)):  # at most node 2 (depth 2) in use; none
        out = verify_tree(target, draft, tokens, parents, num_nodes=num_nodes, backend=backend)
        assert out.tokens.shape == (B, nodes + 1) and out.accepted_nodes.shape == (B, nodes)
        for row in range(B):
            n = int(out.num_accepted[row])
            assert n <= min(int(num_nodes[row]), 2) and (out.tokens[row, n + 1 :] == -1).all() and (out.accepted_nodes[row, n:] == -1).all()
    out = verify_tree(target[:, :1], draft[:, :1], tokens[:, :0], parents[:, :0], backend=backend)
    assert out.tokens.shape == (B, 1) and out.accepted_nodes.shape == (B, 0) and (out.num_accepted == 0).all()
    empty = verify_tree(target[:0], draft[:0], tokens[:0], parents[:0], backend=backend)
    assert empty.tokens.shape == (0, nodes + 1) and empty.accepted_nodes.shape == (0, nodes)  # no row: still N + 1 wide


def test_same_seeds_same_tokens_and_rows_are_independent():
    target, draft, tokens, parents = _inputs()
    seeds = torch.tensor([5, 6, 7, 8])
    a = verify_tree(target, draft, tokens, parents, seeds=seeds, backend="eager")
    b = verify_tree(target, draft, tokens, parents, seeds=seeds, backend="eager")
    assert torch.equal(a.tokens, b.tokens)
    # A row's tokens depend on its own key, logits and tree only, not on its neighbours.
    alone = verify_tree(target[2:3], draft[2:3], tokens[2:3], parents[2:3], seeds=seeds[2:3], backend="eager")
    assert torch.equal(alone.tokens, a.tokens[2:3, : alone.tokens.shape[1]])
    # base_key + b: one draw per call from the generator.
    c = verify_tree(target, draft, tokens, parents, generator=torch.Generator().manual_seed(3), backend="eager")
    d = verify_tree(target, draft, tokens, parents, generator=torch.Generator().manual_seed(3), backend="eager")
    assert torch.equal(c.tokens, d.tokens)


def test_greedy_rows_take_the_argmax_path_and_ties_take_the_lowest_index():
    target, draft, tokens, parents = _inputs()
    target[:, 0, 3] = target[:, 0, 5] = target[:, 0].max() + 1  # a tie at the root: 3 wins
    tokens[:, 0], tokens[:, 1] = 5, 3  # node 1 holds the argmax, node 0 the tied id that loses
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        out = verify_tree(target, draft, tokens, parents, temperature=0.0, backend=backend)
        assert (out.accepted_nodes[:, 0] == 1).all() and (out.tokens[:, 0] == 3).all()
        # Under node 1 (context 2) there is one child (node 5): entered iff it is the argmax there.
        entered = tokens[:, 5] == target[:, 2].argmax(-1)
        assert torch.equal(out.num_accepted, 1 + entered.long())


def test_shapes_dtypes_and_devices():
    target, draft, tokens, parents = _inputs()
    _expect("target_logits must be 3-D", target_logits=target[:, 0])
    _expect("target_logits must be float32", target_logits=target.double())
    _expect(r"draft_tokens must have shape \(batch, N\)", draft_tokens=tokens[:, :2])
    _expect(r"parents must have shape \(batch, N\)", parents=parents[:, :2])
    _expect("parents must be int32 or int64", parents=parents.float())
    _expect(r"draft_logits must have shape \(batch, N\+1, draft_vocab\)", draft_logits=draft[:, :3])
    _expect("draft_logits vocabulary", draft_logits=torch.randn(B, len(PARENTS) + 1, V + 1))
    _expect("parents is on meta", parents=parents.to("meta"))
    _expect("siblings must be one of", siblings="with_replacement")
    _expect("backend must be one of", backend="cuda")
    _expect(r"seeds must have shape \(4,\)", seeds=torch.tensor([1, 2, 3]))
    _expect("offsets must be an int64 tensor", offsets=torch.zeros(4, dtype=torch.int32))
    _expect("generator must be a torch.Generator", generator=3)


def test_parameter_and_key_values():
    _expect("temperature must be a finite number >= 0", temperature=-1.0)
    _expect(r"temperature must be finite and >= 0 .*row 1", temperature=torch.tensor([1.0, -1.0, 1.0, 1.0]))
    _expect(r"top_p must lie in \(0, 1\]; row 3", top_p=torch.tensor([1.0, 1.0, 1.0, 0.0]))
    _expect(r"num_nodes must lie in \[0, N=6\]; row 2", num_nodes=torch.tensor([1, 2, 7, 0]))
    _expect("seeds: row 1 is negative", seeds=torch.tensor([0, -4, 1, 2]))
    _expect("offsets: row 0 is negative", offsets=torch.tensor([-1, 0, 0, 0]))


@pytest.mark.parametrize(
    "bad_parents,match",
    [
        ([-1, -1, 0, 3, 2, 1], "row 2 node 3 has parent 3"),  # its own parent (a cycle of one)
        ([-1, -1, 0, 0, 5, 1], "row 2 node 4 has parent 5"),  # a parent after the child: a cycle is possible
        ([-1, -1, 0, 0, -2, 1], "row 2 node 4 has parent -2"),
        ([-1, -1, 0, 0, 2, 6], "row 2 node 5 has parent 6"),  # out of range
    ],
)
def test_bad_trees_raise_or_blank_the_row(bad_parents, match):
    target, draft, tokens, parents = _inputs()
    parents = parents.clone()
    parents[2] = torch.tensor(bad_parents)
    with pytest.raises(ValueError, match=f"parents: {match}"):
        verify_tree(target, draft, tokens, parents, backend="eager")
    seeds = torch.tensor([1, 2, 3, 4])
    clean = verify_tree(target, draft, tokens, torch.tensor(PARENTS).expand(B, -1), seeds=seeds, backend="eager")
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        out = verify_tree(target, draft, tokens, parents, seeds=seeds, check=False, backend=backend)
        assert (out.tokens[2] == -1).all() and int(out.num_accepted[2]) == 0 and (out.accepted_nodes[2] == -1).all()
        others = [0, 1, 3]
        assert torch.equal(out.tokens[others], clean.tokens[others])


def test_unused_nodes_are_not_validated():
    target, draft, tokens, parents = _inputs()
    parents = parents.clone()
    parents[:, 5] = 9  # node 5 is beyond every row's num_nodes
    tokens[:, 5] = -3
    target[:, 6] = float("nan")
    out = verify_tree(target, draft, tokens, parents, num_nodes=torch.tensor([5, 4, 0, 2]), backend="eager")
    assert (out.tokens[:, 0] >= 0).all()


def test_bad_values():
    target, draft, tokens, parents = _inputs()
    bad = target.clone()
    bad[1, 4, 2] = float("nan")
    _expect("target_logits: row 1 contains NaN", target_logits=bad)
    bad = draft.clone()
    bad[3, 0] = float("-inf")
    _expect("draft_logits: row 3 has a context whose processed distribution is empty", draft_logits=bad)
    bad_tokens = tokens.clone()
    bad_tokens[0, 4] = V
    _expect(r"draft_tokens: row 0 holds an id outside \[0, 12\)", draft_tokens=bad_tokens)
    _expect("temperature: row 0 is so small", target_logits=target * 1e30, temperature=1e-10)
    # A leaf's draft line is never used: no children were drawn from it.
    leaf = draft.clone()
    leaf[:, 5] = float("nan")  # context 5 = node 4, a leaf
    verify_tree(target, leaf, tokens, parents, backend="eager")


@pytest.mark.parametrize("backend", available_backends("cpu", "verify_tree", interpreted=False))
def test_check_false_blanks_only_for_lines_the_walk_reads(backend):
    """check=False blanks a row for a bad line at a context its walk visited (target), or where it
    tested a child (draft, sampled rows); other lines leave the row exactly as the clean call had it."""
    target, draft, tokens, parents = _inputs(seed=3)
    temperature = torch.tensor([1.0, 1.0, 0.7, 0.0])
    seeds = torch.tensor([11, 12, 13, 14])
    tokens[3] = torch.tensor([int(target[3, 0].argmax()), 0, 1, 2, 3, 4])  # the greedy row enters node 0

    def run(t, d, check=False):
        return verify_tree(t, d, tokens, parents, temperature=temperature, seeds=seeds, backend=backend, check=check)

    clean = run(target, draft)
    children = {c: [i for i, p in enumerate(PARENTS) if p + 1 == c] for c in range(len(PARENTS) + 1)}
    for line in ("target", "draft"):
        for context in range(len(PARENTS) + 1):
            t, d = target.clone(), draft.clone()
            (t if line == "target" else d)[:, context, 1] = float("nan")
            out = run(t, d)
            for row in range(B):
                visited = [0] + [n + 1 for n in clean.accepted_nodes[row, : int(clean.num_accepted[row])].tolist()]
                read = context in visited and (line == "target" or (bool(children[context]) and float(temperature[row]) > 0))
                if read:
                    assert (out.tokens[row] == -1).all(), (line, context, row)
                else:
                    assert torch.equal(out.tokens[row], clean.tokens[row]), (line, context, row)
            if line == "target" or children[context]:
                with pytest.raises(ValueError, match=f"^{line}_logits: row 0 "):
                    run(t, d, check=True)


def test_bfloat16_and_a_smaller_draft_vocabulary():
    target, draft, tokens, parents = _inputs()
    out = verify_tree(target.bfloat16(), draft[:, :, :8].bfloat16(), tokens % 8, parents, top_k=5, top_p=0.9, backend="eager")
    assert (out.tokens[:, 0] >= 0).all()
    _expect(r"draft_tokens: row 0 holds an id outside \[0, 8\)", draft_logits=draft[:, :, :8], draft_tokens=tokens + 8 * (tokens < 8))


def test_deterministic_siblings_never_emit_a_rejected_sibling():
    """draft_logits=None: a rejected child is removed from the residual, so after rejecting every
    child of the root the emitted token is none of them."""
    target, _, tokens, parents = _inputs(batch=2000)
    out = verify_tree(target, None, tokens, parents, generator=torch.Generator().manual_seed(2), backend="eager")
    stopped_at_root = out.num_accepted == 0
    assert bool(stopped_at_root.any())
    root_children = tokens[:, [0, 1]]
    assert not bool((out.tokens[stopped_at_root, :1] == root_children[stopped_at_root]).any())


@pytest.mark.parametrize("siblings", ["iid", "without_replacement"])
@pytest.mark.parametrize("params", [{}, {"temperature": 0.7, "top_k": 5}, {"top_p": 0.8}, {"temperature": torch.tensor([0.0, 1.0, 0.5, 0.0] * 50)}],
                         ids=["plain", "temperature,top_k", "top_p", "mixed_greedy"])
def test_a_chain_verifies_exactly_as_verify_does(siblings, params):
    """verify_tree of a chain (node i's parent is i - 1) draws the same coins and races as verify of
    that chain: the same keys give the same tokens, ragged lengths and one-hot drafts included."""
    batch, k, vocab = 200, 4, 40
    g = torch.Generator().manual_seed(7)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target + torch.randn(batch, k + 1, vocab, generator=g)
    tokens = torch.multinomial(draft[:, :k].softmax(-1).reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    chain = torch.arange(-1, k - 1).expand(batch, -1)
    lengths = torch.randint(0, k + 1, (batch,), generator=g)
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    for backend in available_backends("cpu", "verify_tree", interpreted=False):
        for draft_logits in (draft, None):
            for ragged in (None, lengths):
                chained = specdec_ext.verify(target, None if draft_logits is None else draft_logits[:, :k], tokens, num_draft_tokens=ragged,
                                             offsets=offsets, generator=torch.Generator().manual_seed(8), backend="eager", **params)
                tree = verify_tree(target, draft_logits, tokens, chain, num_nodes=ragged, siblings=siblings, offsets=offsets,
                                   generator=torch.Generator().manual_seed(8), backend=backend, **params)
                width = tree.tokens.shape[1]
                assert torch.equal(chained.tokens[:, :width], tree.tokens), (backend, draft_logits is None, ragged is None)
                assert (chained.tokens[:, width:] == -1).all()
                assert torch.equal(chained.num_accepted, tree.num_accepted)


def test_block_method_is_validated():
    target, draft, tokens, _ = _inputs()
    with pytest.raises(ValueError, match="method must be one of"):
        specdec_ext.verify(target[:, :3], draft[:, :2], tokens[:, :2], method="tree")
