"""Kinds of attention: which rows are scored, which keys each row sees, and the row statistics that follow.

A kind is the geometry of one head's attention map A (A[i, j]: the weight query row i puts on key j of a window of
`length` real tokens, right-padded). Everything that differs between a decoder and an encoder is a method here,
so the rest of the code never asks which one it has:

    DECODER (causal, GPT-2): row i sees keys 0 <= j <= i. Scored rows 1 <= i < length (row 0 sees only itself:
        A[0, 0] = 1 and entropy 0 by construction). Windows start with BOS. Local window: max(1, i-w) .. i.
    ENCODER (bidirectional, BERT): every row sees all `length` keys. Scored rows 1 <= i <= length-2 (the text
        between [CLS] and [SEP]), each with a previous and a next token. Local window: max(1, i-w) .. min(length-2,
        i+w). Two more scores: next_token A[i, i+1] and last_token A[i, length-1] (the [SEP] sink).

Row statistics (means over scored rows are taken in `scores.rows`), with `visible` the keys a row sees:

    previous_token A[i, i-1]    first_token A[i, 0]    self A[i, i]    local Σ_{j in window} A[i, j]
    entropy -Σ_j A[i, j] ln A[i, j] (nats)    entropy_normalized entropy / ln(visible)    confidence max_j A[i, j]
    local_uniform |window| / visible (what `local` would be for uniform attention)

Pure functions of tensors: no model, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnscope.scores import catalog

DEFAULT_WINDOW = 3


@dataclass(frozen=True)
class Kind:
    """What a kind of attention map looks like; subclasses hold the maths."""

    name: str  # catalog.DECODER or catalog.ENCODER
    causal: bool  # row i sees only keys j <= i
    special_tokens: str  # "bos": BOS before each window; "cls_sep": [CLS] window [SEP]
    probe: bool  # the repeated-random-token probe measures left-to-right copying: decoders only

    @property
    def row_score_names(self) -> tuple[str, ...]:
        """The row scores summed for this kind (the catalog's scores measured on every row), in the order of the
        sums' last dimension."""
        return tuple(score.name for score in catalog.scores_for(self.name) if score.source == catalog.ROWS)

    @property
    def score_names(self) -> tuple[str, ...]:
        """Every score this kind measures (the probe's included), in catalog order."""
        return tuple(score.name for score in catalog.scores_for(self.name))

    def scored_rows(self, lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, b) bool: query row `positions[r]` of window B is scored (real text, neither the first row nor, for
        an encoder, the last)."""
        raise NotImplementedError

    def visible_keys(self, positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B or 1, b) keys that rows `positions` of windows of `lengths` see."""
        raise NotImplementedError

    def window_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
        """(B or 1, b, n_keys) bool: key j is in the local window of row `positions[r]`."""
        raise NotImplementedError

    def window_size(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        """(B or 1, b) keys in the local window of rows `positions` (0 or more)."""
        raise NotImplementedError

    def gathered_keys(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        """The keys whose logits `layer_row_scores` needs for rows `positions`: (b, m) when the same for every
        window, (B, b, m) when they depend on a window's length; each a key the row sees."""
        raise NotImplementedError

    def row_scores(
        self, attn: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor, window: int = DEFAULT_WINDOW
    ) -> dict[str, torch.Tensor]:
        """Every row statistic from probabilities (the reference form): attn (B, H, b, n) of rows `positions` (b,)
        over keys 0..n-1 of windows of `lengths` (B,). Returns name -> (B, H, b); unscored rows hold anything."""
        B, H, b, n = attn.shape

        def at(keys: torch.Tensor) -> torch.Tensor:  # keys (B, b) -> A[.., r, keys[B, r]] (B, H, b)
            index = keys.clamp(0, n - 1).view(B, 1, b, 1).expand(B, H, b, 1)  # (B, H, b, 1)
            return attn.gather(-1, index).squeeze(-1)

        rows = positions[None, :].expand(B, b)  # (B, b)
        entropy = -torch.special.xlogy(attn, attn).sum(-1)  # (B, H, b); 0·ln 0 = 0
        visible = self.visible_keys(positions, lengths).to(attn.dtype)[:, None, :]  # (B or 1, 1, b)
        in_window = self.window_mask(positions, lengths, n, window)[:, None].to(attn.dtype)  # (B or 1, 1, b, n)
        return {
            "previous_token": at(rows - 1),
            "first_token": attn[..., 0],  # (B, H, b)
            "self": at(rows),
            "local": (attn * in_window).sum(-1),  # (B, H, b)
            "entropy": entropy,
            "entropy_normalized": entropy / torch.log(visible).clamp(min=1e-12),  # (B, H, b)
            "confidence": attn.amax(-1),  # (B, H, b)
            **self._extra_row_scores(at, rows, lengths),
        }

    def _extra_row_scores(self, at, rows: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """The row scores only this kind has (from probabilities), given `at(keys)` -> A at keys (B, b)."""
        return {}

    def layer_row_scores(
        self,
        normalizer: torch.Tensor,
        expected_logit: torch.Tensor,
        gathered: torch.Tensor,
        lengths: torch.Tensor,
        window: int = DEFAULT_WINDOW,
    ) -> dict[str, torch.Tensor]:
        """The statistics of `row_scores` for every row of a layer, without any (n × n) tensor.

        With s_ij the scaled logits shifted so each row's maximum is 0 (the capture's form), the inputs are per row
        (all (B, H, n)): normalizer Z_i = Σ_j exp(s_ij), expected_logit = Σ_j A_ij s_ij, and `gathered`
        (B, H, n, m) s_ij at the keys of `gathered_keys`. Then exactly, with A_ij = exp(s_ij) / Z_i:
            confidence = max_j A_ij = 1 / Z_i               (the row maximum is exp(0))
            entropy    = -Σ_j A_ij ln A_ij = ln Z_i - expected_logit
            A at a gathered key = exp(gathered) / Z_i
        """
        raise NotImplementedError


class CausalKind(Kind):
    """A decoder's causal map: gathered keys are i, i-1, ..., i-w (clamped at 0), then 0."""

    def scored_rows(self, lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (positions[None, :] >= 1) & (positions[None, :] < lengths[:, None])  # (B, b)

    def visible_keys(self, positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return (positions + 1)[None, :]  # (1, b)

    def window_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
        keys = torch.arange(n_keys, device=positions.device)  # (n,)
        low = (positions - window).clamp(min=1)  # (b,)
        return ((keys[None, :] >= low[:, None]) & (keys[None, :] <= positions[:, None]))[None]  # (1, b, n)

    def window_size(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        return (positions - (positions - window).clamp(min=1) + 1)[None, :]  # (1, b); row 0: 0

    def gathered_keys(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        offsets = torch.arange(window + 1, device=positions.device)  # (w+1,) 0 = self, 1 = previous, ...
        window_keys = (positions[:, None] - offsets[None, :]).clamp(min=0)  # (b, w+1)
        return torch.cat([window_keys, torch.zeros_like(positions)[:, None]], dim=1)  # (b, w+2)

    def layer_row_scores(self, normalizer, expected_logit, gathered, lengths, window=DEFAULT_WINDOW):
        n = normalizer.shape[-1]
        positions = torch.arange(n, device=normalizer.device)  # (n,)
        probs = torch.exp(gathered) / normalizer[..., None]  # (B, H, n, w+2)
        in_window = (positions[:, None] - torch.arange(window + 1, device=normalizer.device) >= 1).to(probs.dtype)
        entropy = torch.log(normalizer) - expected_logit  # (B, H, n)
        return {
            "previous_token": probs[..., 1],
            "first_token": probs[..., -1],
            "self": probs[..., 0],
            "local": (probs[..., : window + 1] * in_window).sum(-1),  # (B, H, n); token 0 is never local
            "entropy": entropy,
            "entropy_normalized": entropy / torch.log((positions + 1).to(entropy.dtype)).clamp(min=1e-12),
            "confidence": 1.0 / normalizer,
        }


class BidirectionalKind(Kind):
    """An encoder's map: gathered keys are i, i-1, ..., i-w, i+1, ..., i+w, then 0 and length-1 (the last real
    token, which differs per window), each clamped into 0..length-1 (a clamped key is never inside a scored row's
    window)."""

    def scored_rows(self, lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (positions[None, :] >= 1) & (positions[None, :] <= lengths[:, None] - 2)  # (B, b)

    def visible_keys(self, positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return lengths[:, None].expand(-1, positions.shape[0])  # (B, b)

    def window_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
        keys = torch.arange(n_keys, device=positions.device)  # (n,)
        low = (positions - window).clamp(min=1)  # (b,)
        high = torch.minimum(positions[None, :] + window, lengths[:, None] - 2)  # (B, b)
        return (keys[None, None, :] >= low[None, :, None]) & (keys[None, None, :] <= high[:, :, None])  # (B, b, n)

    def window_size(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        high = torch.minimum(positions[None, :] + window, lengths[:, None] - 2)  # (B, b)
        return (high - (positions - window).clamp(min=1)[None, :] + 1).clamp(min=0)  # (B, b)

    def _extra_row_scores(self, at, rows, lengths):
        return {"next_token": at(rows + 1), "last_token": at((lengths - 1)[:, None].expand_as(rows))}

    @staticmethod
    def offsets(window: int, device: torch.device | None = None) -> torch.Tensor:
        """(2w+1,) key offsets of the local window in gathered order: 0 (self), -1 .. -w, +1 .. +w."""
        back = -torch.arange(window + 1, device=device)  # (w+1,) 0, -1, ..., -w
        return torch.cat([back, torch.arange(1, window + 1, device=device)])  # (2w+1,)

    def gathered_keys(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        window_keys = positions[:, None] + self.offsets(window, positions.device)[None, :]  # (b, 2w+1)
        last = (lengths - 1)[:, None, None]  # (B, 1, 1)
        B, b = lengths.shape[0], positions.shape[0]
        keys = torch.cat(
            [window_keys[None].expand(B, -1, -1), torch.zeros_like(last).expand(B, b, 1), last.expand(B, b, 1)], dim=-1
        )  # (B, b, 2w+3)
        return torch.minimum(keys.clamp(min=0), last)

    def layer_row_scores(self, normalizer, expected_logit, gathered, lengths, window=DEFAULT_WINDOW):
        n = normalizer.shape[-1]
        positions = torch.arange(n, device=normalizer.device)  # (n,)
        probs = torch.exp(gathered) / normalizer[..., None]  # (B, H, n, 2w+3)
        keys = positions[:, None] + self.offsets(window, normalizer.device)[None, :]  # (n, 2w+1) unclamped
        in_window = (keys[None] >= 1) & (keys[None] <= (lengths - 2)[:, None, None])  # (B, n, 2w+1)
        entropy = torch.log(normalizer) - expected_logit  # (B, H, n)
        visible = lengths.to(entropy.dtype)[:, None, None]  # (B, 1, 1)
        return {
            "previous_token": probs[..., 1],
            "first_token": probs[..., -2],
            "self": probs[..., 0],
            "local": (probs[..., : 2 * window + 1] * in_window[:, None].to(probs.dtype)).sum(-1),  # (B, H, n)
            "entropy": entropy,
            "entropy_normalized": entropy / torch.log(visible).clamp(min=1e-12),
            "confidence": 1.0 / normalizer,
            "next_token": probs[..., window + 1],
            "last_token": probs[..., -1],
        }


DECODER = CausalKind(catalog.DECODER, causal=True, special_tokens="bos", probe=True)
ENCODER = BidirectionalKind(catalog.ENCODER, causal=False, special_tokens="cls_sep", probe=False)
KINDS = {kind.name: kind for kind in (DECODER, ENCODER)}
