"""The colour scales of the quantities attnscope shades, declared once: the pictures (`output.figures` builds its
matplotlib colour maps from them), the report page (its script reads them from the page's data, `scales`) and the
notebook's grids (`output.notebook.shade`) all colour a value from these stops, so a colour means the same
everywhere: a loss that rises without a head is red in importance.png, on the report page and in a notebook.

A scale is evenly spaced colour stops from its low end to its high end, interpolated linearly in RGB (as
matplotlib's LinearSegmentedColormap and the page's `ramp` do). Two families:

- diverging, for signed values, centred at 0 (white), its ends at ± the largest magnitude shown: ColorBrewer's RdBu
  (9 classes, Brewer 2002; colour-blind safe), blue below 0 and red above, so that red reads as "more" (a head the
  model needs; attention packed into the local window); `composition` uses the same colours centred on a reference
  instead of 0 (random heads' mean score: white is "as random heads", output/circuit.py);
- sequential, for values from 0: viridis (van der Walt & Smith 2015; perceptually uniform, readable in grey),
  sampled at 9 stops. The two similarity measures between heads share one reading, dark = similar: JS divergence
  from dark (0 bits, the same rows) to yellow (1 bit, disjoint), cosine similarity reversed, from yellow (0) to dark
  (1, the same maps).
"""

from __future__ import annotations

from dataclasses import dataclass

DIVERGING = ("#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b")
VIRIDIS = ("#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725")


@dataclass(frozen=True)
class ColourScale:
    """How one quantity is coloured: `stops` ("#RRGGBB", from the low end to the high end, evenly spaced); `signed`:
    centred at 0, its ends ± the largest magnitude shown (at least `high` when given); else from `low` (None: 0) to
    `high` (None: the largest value shown). `key`: what the colours say, in words."""

    name: str
    stops: tuple[str, ...]
    signed: bool = False
    low: float | None = None
    high: float | None = None
    key: str = ""

    def limits(self, largest: float) -> tuple[float, float]:
        """The values at the two ends, for values whose largest magnitude (signed) or largest value is `largest`."""
        if self.signed:
            limit = max(abs(largest), self.high or 0.0) or 1.0
            return -limit, limit
        low = self.low or 0.0
        high = largest if self.high is None else self.high
        return low, high if high > low else low + 1.0

    def rgb(self, value: float, largest: float) -> tuple[int, int, int]:
        """The colour of `value` (0-255 per channel), among values whose largest is `largest` (see `limits`)."""
        low, high = self.limits(largest)
        share = min(1.0, max(0.0, (value - low) / (high - low)))
        where = share * (len(self.stops) - 1)
        k = min(int(where), len(self.stops) - 2)
        a, b = _channels(self.stops[k]), _channels(self.stops[k + 1])
        return tuple(round(x + (y - x) * (where - k)) for x, y in zip(a, b, strict=True))  # type: ignore[return-value]

    def as_data(self) -> dict:
        """The scale as the report page's data carries it."""
        return {"stops": list(self.stops), "signed": self.signed, "low": self.low, "high": self.high, "key": self.key}


def _channels(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


SCALES = {
    scale.name: scale
    for scale in (
        ColourScale(
            "loss_change",
            DIVERGING,
            signed=True,
            key="red: the loss rises without the head (the model needs it); blue: it falls; white: no change",
        ),
        ColourScale("signed_score", DIVERGING, signed=True, high=1.0, key="red above 0, blue below, white at 0"),
        ColourScale(
            "score_change",
            DIVERGING,
            signed=True,
            key="blue: the head's score falls without the removed head (it depends on it); red: it rises; white: no "
            "change",
        ),
        ColourScale(  # patch's shares: 1 (all of the difference) is full red unless a head overshoots it
            "logit_diff_share",
            DIVERGING,
            signed=True,
            high=1.0,
            key="red: a share of the clean − corrupted logit difference (1: all of it); blue: a share the other way; "
            "white: none",
        ),
        ColourScale(  # circuit's composition pictures: diverging, centred on random heads' mean, not on 0
            "composition",
            DIVERGING,
            key="white: what random heads of the same shapes give (their mean); red: more composition than random; "
            "blue: less",
        ),
        ColourScale("score", VIRIDIS, key="dark: 0; yellow: the largest"),
        ColourScale("js", VIRIDIS, low=0.0, high=1.0, key="dark: the same rows (0 bits); yellow: disjoint (1 bit)"),
        ColourScale(  # compare's divergence of a head between two models: small values, so from 0 to the largest
            "divergence", VIRIDIS, low=0.0, key="dark: unchanged (0 bits); yellow: the head that moved most"
        ),
        ColourScale(
            "cosine", VIRIDIS[::-1], low=0.0, high=1.0, key="dark: the same maps (1); yellow: nothing shared (0)"
        ),
    )
}


def scale(name: str) -> ColourScale:
    return SCALES[name]
