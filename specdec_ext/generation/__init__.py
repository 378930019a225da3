"""The generation core shared by chains, trees and block verification.

Modules, one job each (imports only point down this list):

* ``shapes`` -- :class:`DraftTree` (a chain of K is the tree (1, ..., 1)), candidate trees, the planning model;
* ``adaptive`` -- the shape of each step: fixed, or "auto" (K of a chain, or a tree);
* ``inputs`` -- checks of models, prompts, keys, sampling, EOS and padding;
* ``cache`` -- one model's KV cache with its live-slot mask and its two commit modes;
* ``rows`` -- the rows still generating;
* ``stats`` / ``output`` -- phase clocks, tallies, :class:`SpeculativeStats`, :class:`SpeculativeOutput`;
* ``draws`` -- the one place draft tokens are drawn;
* ``steps``, ``chain_steps``, ``tree_steps`` -- the step functions (draft, score, verify, commit) of each kind;
* ``loop`` -- the loop: one step for every row, the shared cut-write-sync-stop-tally-commit part.

:func:`specdec_ext.generate` is the public entry point; :func:`loop.speculate` serves it and the
transformers hook.
"""
