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
from typing import Any

import torch

from attnscope.scores import catalog

DEFAULT_WINDOW = catalog.DEFAULT_WINDOW


@dataclass(frozen=True)
class Kind:
    """What a kind of attention map looks like; subclasses hold what differs.

    The capture hands over, for every row, s at a few gathered keys (`gathered_keys`, in a layout of slots that
    starts with the local window's keys, the row's own key first, then the previous one) and whether the model's
    mask lets the row see them; a row's visible keys come from the model's mask too, so that sliding windows
    count only the keys a row actually sees.
    """

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

    # Tokens of a window that are never scored nor local: the first (BOS or [CLS]), and an encoder's last ([SEP]).
    sinks: int = 1

    def only_first_rows(self, longest: int) -> bool:
        """Whether windows of at most `longest` tokens have no scored row but row 1, whose previous token is the
        first token itself: previous-token and first-token attention are then one weight (and an encoder's next
        token its last), and no pattern role can be told."""
        return longest <= self.sinks + 1

    def window_covers(self, longest: int, window: int) -> bool:
        """Whether the local window of every scored row of windows of at most `longest` tokens holds every key the
        row sees but the sinks: `local` is then everything not on a sink, and `local_lift` measures no locality."""
        return longest <= window + self.sinks + 1

    def visible_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int) -> torch.Tensor:
        """(B, b, n_keys) bool: the keys rows `positions` see without a sliding window (the reference form; the
        capture reads a layer's real mask)."""
        raise NotImplementedError

    def window_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
        """(B or 1, b, n_keys) bool: key j is in the local window of row `positions[r]` (by position only)."""
        raise NotImplementedError

    def window_offsets(self, window: int, device: torch.device | None = None) -> torch.Tensor:
        """(s,) key offsets of the local window's slots, the first slots of the gathered layout: 0 (self), -1 ..."""
        raise NotImplementedError

    def in_window(self, keys: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B or 1, b, s) bool: which window keys (b, s) are local by position (never the first token; for an
        encoder, never the last)."""
        raise NotImplementedError

    def gathered_keys(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        """The keys whose logits `layer_row_scores` needs for rows `positions`: the window's keys (in
        `window_offsets` order, clamped into the window), then the sinks; (b, m) when the same for every window,
        (B, b, m) when they depend on a window's length."""
        raise NotImplementedError

    def slots(self, window: int) -> dict[str, int]:
        """score -> the gathered slot it reads: previous_token, first_token, self (and next_token, last_token)."""
        raise NotImplementedError

    def row_scores(
        self,
        attn: torch.Tensor,
        positions: torch.Tensor,
        lengths: torch.Tensor,
        window: int = DEFAULT_WINDOW,
        visible: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Every row statistic from probabilities (the reference form): attn (B, H, b, n) of rows `positions` (b,)
        over keys 0..n-1 of windows of `lengths` (B,); `visible` (B, b, n) the keys each row sees (default: the
        kind's geometry). Returns name -> (B, H, b), and `local_uniform` (B, b); unscored rows hold anything."""
        B, H, b, n = attn.shape
        if visible is None:
            visible = self.visible_mask(positions, lengths, n)
        keys = positions[:, None] + self.window_offsets(window, positions.device)  # (b, s) unclamped
        slots = self.slots(window)
        sought = {name: keys[:, slots[name]][None].expand(B, b) for name in ("previous_token", "self")}
        sought["first_token"] = torch.zeros(B, b, dtype=torch.long, device=positions.device)
        if "next_token" in slots:
            sought["next_token"] = keys[:, slots["next_token"]][None].expand(B, b)
            sought["last_token"] = (lengths - 1)[:, None].expand(B, b)

        def at(wanted: torch.Tensor) -> torch.Tensor:  # keys (B, b) -> A[.., r, keys[B, r]] (B, H, b)
            index = wanted.clamp(0, n - 1).view(B, 1, b, 1).expand(B, H, b, 1)  # (B, H, b, 1)
            return attn.gather(-1, index).squeeze(-1)

        entropy = -torch.special.xlogy(attn, attn).sum(-1)  # (B, H, b); 0·ln 0 = 0
        seen = visible.sum(-1).to(attn.dtype)  # (B, b)
        local = self.window_mask(positions, lengths, n, window) & visible  # (B, b, n)
        return {
            **{name: at(wanted) for name, wanted in sought.items()},
            "local": (attn * local[:, None].to(attn.dtype)).sum(-1),  # (B, H, b)
            "entropy": entropy,
            "entropy_normalized": entropy / torch.log(seen[:, None]).clamp(min=1e-12),  # (B, H, b)
            "confidence": attn.amax(-1),  # (B, H, b)
            "local_uniform": local.sum(-1).to(torch.float64) / seen.to(torch.float64),  # (B, b)
        }

    def layer_row_scores(self, rows: Any, window: int = DEFAULT_WINDOW) -> dict[str, torch.Tensor]:
        """The statistics of `row_scores` for every row of a layer, without any (n × n) tensor, from the capture's
        per-row summaries `rows` (pipeline.blocks.LayerRows: normalizer Z, expected_logit, gathered, visible,
        gathered_visible, and peak and mass where the family has a sink). Exactly, with A_ij = exp(s_ij) / Z_i:

            A at a gathered key = exp(gathered) / Z_i
            confidence = max_j A_ij = exp(peak_i) / Z_i            (peak = 0: the row maximum is exp(0))
            entropy    = -Σ_j A_ij ln A_ij = mass_i ln Z_i - expected_logit_i   (mass = Σ_j A_ij = 1 without a sink)
            local_uniform = |local window ∩ visible keys| / |visible keys|
        """
        normalizer = rows.normalizer  # (B, H, n)
        n = normalizer.shape[-1]
        positions = torch.arange(n, device=normalizer.device)  # (n,)
        probs = torch.exp(rows.gathered).div_(normalizer[..., None])  # (B, H, n, m)
        offsets = self.window_offsets(window, normalizer.device)  # (s,)
        s = offsets.shape[0]
        local = self.in_window(positions[:, None] + offsets, rows.lengths) & rows.gathered_visible[..., :s]  # (B, n, s)
        log_normalizer = torch.log(normalizer)  # (B, H, n)
        entropy = (log_normalizer if rows.mass is None else rows.mass * log_normalizer) - rows.expected_logit
        confidence = normalizer.reciprocal() if rows.peak is None else torch.exp(rows.peak) / normalizer
        return {
            **{name: probs[..., slot] for name, slot in self.slots(window).items()},
            "local": (probs[..., :s] * local[:, None]).sum(-1),  # (B, H, n)
            "entropy": entropy,
            "entropy_normalized": entropy / torch.log(rows.visible[:, None]).clamp_(min=1e-12),
            "confidence": confidence,
            "local_uniform": local.sum(-1, dtype=torch.float64) / rows.visible,  # (B, n) float64
        }


class CausalKind(Kind):
    """A decoder's causal map. Gathered layout: i, i-1, ..., i-w (clamped at 0), then 0."""

    def scored_rows(self, lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (positions[None, :] >= 1) & (positions[None, :] < lengths[:, None])  # (B, b)

    def visible_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int) -> torch.Tensor:
        keys = torch.arange(n_keys, device=positions.device)  # (n,)
        mask = (keys[None, None, :] <= positions[None, :, None]) & (keys[None, None, :] < lengths[:, None, None])
        return mask  # (B, b, n)

    def window_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
        keys = torch.arange(n_keys, device=positions.device)  # (n,)
        low = (positions - window).clamp(min=1)  # (b,)
        return ((keys[None, :] >= low[:, None]) & (keys[None, :] <= positions[:, None]))[None]  # (1, b, n)

    def window_offsets(self, window: int, device: torch.device | None = None) -> torch.Tensor:
        return -torch.arange(window + 1, device=device)  # (w+1,) 0, -1, ..., -w

    def in_window(self, keys: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return (keys >= 1)[None]  # (1, b, w+1): token 0 is never local

    def gathered_keys(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        window_keys = (positions[:, None] + self.window_offsets(window, positions.device)).clamp(min=0)  # (b, w+1)
        return torch.cat([window_keys, torch.zeros_like(positions)[:, None]], dim=1)  # (b, w+2)

    def slots(self, window: int) -> dict[str, int]:
        return {"previous_token": 1, "first_token": window + 1, "self": 0}


class BidirectionalKind(Kind):
    """An encoder's map. Gathered layout: i, i-1, ..., i-w, i+1, ..., i+w, then 0 and length-1 (the last real
    token, which differs per window), each clamped into 0..length-1 (a clamped key is never inside a scored row's
    window)."""

    def scored_rows(self, lengths: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (positions[None, :] >= 1) & (positions[None, :] <= lengths[:, None] - 2)  # (B, b)

    def visible_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int) -> torch.Tensor:
        keys = torch.arange(n_keys, device=positions.device)  # (n,)
        return (keys[None, :] < lengths[:, None])[:, None, :].expand(-1, positions.shape[0], -1)  # (B, b, n)

    def window_mask(self, positions: torch.Tensor, lengths: torch.Tensor, n_keys: int, window: int) -> torch.Tensor:
        keys = torch.arange(n_keys, device=positions.device)  # (n,)
        low = (positions - window).clamp(min=1)  # (b,)
        high = torch.minimum(positions[None, :] + window, lengths[:, None] - 2)  # (B, b)
        return (keys[None, None, :] >= low[None, :, None]) & (keys[None, None, :] <= high[:, :, None])  # (B, b, n)

    def window_offsets(self, window: int, device: torch.device | None = None) -> torch.Tensor:
        back = -torch.arange(window + 1, device=device)  # (w+1,) 0, -1, ..., -w
        return torch.cat([back, torch.arange(1, window + 1, device=device)])  # (2w+1,)

    def in_window(self, keys: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return (keys[None] >= 1) & (keys[None] <= (lengths - 2)[:, None, None])  # (B, b, 2w+1)

    def gathered_keys(self, positions: torch.Tensor, lengths: torch.Tensor, window: int) -> torch.Tensor:
        window_keys = positions[:, None] + self.window_offsets(window, positions.device)[None, :]  # (b, 2w+1)
        last = (lengths - 1)[:, None, None]  # (B, 1, 1)
        B, b = lengths.shape[0], positions.shape[0]
        keys = torch.cat(
            [window_keys[None].expand(B, -1, -1), torch.zeros_like(last).expand(B, b, 1), last.expand(B, b, 1)], dim=-1
        )  # (B, b, 2w+3)
        return torch.minimum(keys.clamp(min=0), last)

    def slots(self, window: int) -> dict[str, int]:
        m = 2 * window + 3
        return {"previous_token": 1, "first_token": m - 2, "self": 0, "next_token": window + 1, "last_token": m - 1}


DECODER = CausalKind(catalog.DECODER, causal=True, special_tokens="bos", probe=True)
ENCODER = BidirectionalKind(catalog.ENCODER, causal=False, special_tokens="cls_sep", probe=False, sinks=2)
KINDS = {kind.name: kind for kind in (DECODER, ENCODER)}
