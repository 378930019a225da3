"""One model's KV cache inside the loop, and why it never serves stale entries.

Each model keeps one DynamicCache whose slots are shared by all rows, plus a (rows, slots) bool mask
of the slots that hold a live token of that row. Every row feeds the same number of tokens per
forward, so the batch stays rectangular; a slot whose token was not accepted (or a padding slot) is
dead: masked out of every later query, and never fed again. Positions come from per-row token counts
(``position_ids``), not from slot indices, so dead slots do not shift them.

A step commits its slots in one of two ways:

* :meth:`ModelCache.keep_prefix` (chains): a row that rejects draft j turns the slots of draft j and
  after into holes, and the slots past the longest row's live end are cropped;
* :meth:`ModelCache.keep_segment` (trees): the step's slots form a segment; per row the accepted
  path's slots are gathered to the segment's front, in order, and the rest is cut.

Holes are squeezed out (a per-row gather) once they outweigh the live slots; rows that finish are
dropped from the batch (:meth:`ModelCache.select_rows`), so they stop costing work.
"""

from __future__ import annotations

import inspect

import torch

#: Squeeze holes out of a cache once they exceed COMPACT_MIN_HOLES slots and COMPACT_HOLE_RATIO times
#: the longest row's live slots: one gather of the cache then saves attention work on every later step.
COMPACT_MIN_HOLES = 64
COMPACT_HOLE_RATIO = 0.5


def new_cache(model):
    """An empty DynamicCache for ``model`` (the constructor's arguments differ across transformers 5.x)."""
    from transformers import DynamicCache

    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=model.config)
    return DynamicCache()


class ModelCache:
    """A model, its KV cache and the mask of live slots; prefilled with every prompt token but the last
    (each step feeds the pending token first).

    ``tree_masks``: every forward gets a 4-D mask built from the visibility it is given (tree
    attention; needs sdpa or eager attention and plain DynamicCache layers). Otherwise new tokens see
    every live slot before them, and no mask at all is built while the cache has no dead slot.
    """

    def __init__(self, model, name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, tree_masks: bool = False):
        parameters = inspect.signature(model.forward).parameters
        if "position_ids" not in parameters:
            # Dead slots make slot index and position differ, so positions must be passed explicitly.
            raise ValueError(f"{name} ({type(model).__name__}): forward takes no position_ids, which speculative generation needs")
        self.attention = getattr(model.config, "_attn_implementation", None)
        if tree_masks and self.attention not in ("sdpa", "eager"):
            raise ValueError(f"{name} uses attn_implementation={self.attention!r}; tree generation builds a 4-D attention mask, "
                             "which needs 'sdpa' or 'eager'")
        self.model = model
        self.name = name
        self.tree_masks = tree_masks
        self.device = model.device
        self.dtype = model.dtype
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.keeps_logits = "logits_to_keep" in parameters
        self.vocab_in = model.get_input_embeddings().num_embeddings
        self.cache = new_cache(model)
        self.forwards = 0
        self.logits_device: torch.device | None = None
        self.live = torch.zeros(input_ids.shape[0], 0, dtype=torch.bool, device=self.device)
        self.segment_start = 0
        # Host flag: some live-slot mask entry is False (prompt padding, or a rejected draft's hole).
        # Without holes, slot index equals position and the model's own causal masking is exact.
        self.holes = not bool(attention_mask.all())
        prompt, mask = input_ids[:, :-1], attention_mask[:, :-1].to(self.device).bool()
        if prompt.shape[1]:
            positions = (mask.long().cumsum(1) - 1).clamp(min=0)
            within = None
            if tree_masks:
                causal = torch.tril(torch.ones(prompt.shape[1], prompt.shape[1], dtype=torch.bool, device=self.device))
                within = causal[None].expand(prompt.shape[0], -1, -1) & mask[:, None, :]
            self.forward(prompt, positions, mask, within=within, all_live=not self.holes, logits_to_keep=1)
        if not getattr(self.cache, "is_croppable", True):
            raise ValueError(f"{name} ({type(model).__name__}): speculative decoding needs a KV cache that can be cropped "
                             "(no recurrent or linear-attention layers)")
        layers = getattr(self.cache, "layers", None)
        if tree_masks and prompt.shape[1] and (not layers or not all(_plain_layer(layer) for layer in layers)):
            raise ValueError(f"{name} ({type(model).__name__}): tree generation needs a DynamicCache of plain attention layers "
                             "(no sliding-window, recurrent or quantized caches)")

    def forward(self, tokens, positions, live, *, within=None, all_live: bool = True, logits_to_keep: int | None = None) -> torch.Tensor:
        """Run the model on (rows, Q) new tokens appended after the cache; returns their logits.

        ``live``: (rows, Q) the new slots that hold a real token (``all_live``: the caller knows all do).
        ``within``: None, each new token sees every live slot up to its own; or (rows, Q, S_seg) bool,
        which slots of the current segment (its earlier slots, then these Q) each new token sees, every
        live slot before the segment being visible to all (tree attention).
        """
        tokens = tokens.to(self.device)
        # A token the model cannot embed (an id only the larger target vocabulary has, or -1 from an
        # invalid row) is shown as id 0: only this model's proposals depend on it, never exactness.
        tokens = torch.where((tokens >= 0) & (tokens < self.vocab_in), tokens, 0)
        self.live = torch.cat([self.live, live.to(self.device, torch.bool)], dim=1)
        self.holes = self.holes or not all_live
        mask = self._causal_mask(tokens.shape[1]) if within is None else self._segment_mask(within)
        kwargs = {self.cache_argument: self.cache}
        if logits_to_keep is not None and self.keeps_logits:
            kwargs["logits_to_keep"] = logits_to_keep
        output = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions.to(self.device), use_cache=True, **kwargs)
        self.forwards += 1
        logits = output.logits
        self.logits_device = logits.device
        return logits[:, -logits_to_keep:] if logits_to_keep is not None else logits

    def _causal_mask(self, width: int):
        """The 2-D live-slot mask, or for sdpa / eager the (rows, 1, W, slots) mask: new token i sees live slots up to its own.

        None while no slot is a hole: the model's causal mask is then the same, and cheaper. (For sdpa
        and eager the 4-D mask is built here: from a 2-D mask with holes, transformers would test on the
        host whether the mask is all ones, a sync per forward.)
        """
        if not self.holes:
            return None
        if self.attention not in ("sdpa", "eager"):
            return self.live.long()
        slot = torch.arange(self.live.shape[1], device=self.device)
        visible = (slot[None, :] <= slot[slot.shape[0] - width:, None])[None, None] & self.live[:, None, None, :]
        return self._as_mask(visible)

    def _segment_mask(self, within: torch.Tensor) -> torch.Tensor:
        queries = within.shape[1]
        before = self.live[:, : self.segment_start]
        visible = torch.cat([before[:, None, :].expand(-1, queries, -1), within.to(self.device)], dim=2)
        return self._as_mask((visible & self.live[:, None, :])[:, None])

    def _as_mask(self, visible: torch.Tensor) -> torch.Tensor:
        """(rows, 1, Q, S) visibility -> the model's mask (bool for sdpa, additive for eager)."""
        # A query that sees nothing (padding in the prefill) would give NaN: let it see all, as transformers does.
        visible = visible | ~visible.any(-1, keepdim=True)
        if self.attention == "sdpa":
            return visible
        return torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, torch.finfo(self.dtype).min)

    # -------------------------------------------------------------------------------- chain commit

    def keep_prefix(self, live_tail: torch.Tensor, drop: int, all_live: bool = False) -> None:
        """Mark the step's last slots dead where ``live_tail`` (rows, W) is False (never attended again),
        then crop the last ``drop`` slots. ``all_live``: every slot that survives the crop is live."""
        width = live_tail.shape[1]
        if width:
            self.live[:, -width:] = live_tail.to(self.device)
            self.holes = self.holes or not all_live
        if drop > 0:  # crop(0) would mean "crop to length 0" in older transformers
            self.cache.crop(-drop)
            self.live = self.live[:, :-drop]

    # --------------------------------------------------------------------------------- tree commit

    def begin_segment(self) -> None:
        self.segment_start = self.live.shape[1]

    def keep_segment(self, keep: torch.Tensor, width: int) -> None:
        """Keep, per row, the segment's slots where ``keep`` (rows, S_seg) is True, in order; cut the rest.
        ``width``: the most slots any row keeps (known on the host: no sync)."""
        keep = keep.to(self.device) & self.live[:, self.segment_start:]
        # A stable sort puts each row's kept slots first, in slot order.
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
        self._gather_tail(self.segment_start, order, keep.gather(1, order))

    # ------------------------------------------------------------------------------ both modes

    def select_rows(self, index: torch.Tensor) -> None:
        index = index.to(self.device)
        self.cache.batch_select_indices(index)
        self.live = self.live[index]
        if self.holes:
            self.holes = not bool(self.live.all())

    def squeeze(self, max_live: int) -> None:
        """Gather every row's live slots to the right end, when holes outweigh them (``max_live``: the most any row has)."""
        total = self.live.shape[1]
        holes = total - max_live
        if holes <= 0 or holes <= COMPACT_MIN_HOLES or holes <= COMPACT_HOLE_RATIO * max_live:
            return
        layers = getattr(self.cache, "layers", None)
        if not layers or not all(_plain_layer(layer, total) for layer in layers):
            return  # unknown cache layout: holes only cost attention work
        # A stable sort puts dead slots first and live ones last, each in slot order.
        order = torch.sort(self.live.to(torch.int8), dim=1, stable=True).indices[:, total - max_live:]
        self._gather_tail(0, order, self.live.gather(1, order))
        self.holes = not bool(self.live.all())

    def _gather_tail(self, start: int, order: torch.Tensor, live: torch.Tensor) -> None:
        """Replace slots [start, end) by the per-row slots ``start + order`` (rows, W), in place."""
        index = order[:, None, :, None]
        end = start + order.shape[1]
        for layer in getattr(self.cache, "layers", []):
            if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
                continue
            for name in ("keys", "values"):
                stored = getattr(layer, name)
                stored[:, :, start:end] = torch.take_along_dim(stored[:, :, start:], index, dim=2)
                setattr(layer, name, stored[:, :, :end])
        self.live = torch.cat([self.live[:, :start], live], dim=1)


def _plain_layer(layer, total: int | None = None) -> bool:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    plain = type(layer).__name__ == "DynamicLayer" and isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == 4
    return plain and (total is None or (keys.shape[2] == total and values.shape[2] == total))
