"""Figures (output.figures) whose size and labels are known in advance."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import png_size

LABELS = [f"{layer}.{head}" for layer in range(12) for head in range(12)]  # GPT-2 small's 144 heads
# 0.1 in per head, 16 in (up from 0.45 in per head up to 16 heads) + 2.4 in and 1.6 in of margins, at 100 dpi
PIXELS = (1840, 1760)


def test_matrix_of_many_heads_gives_each_head_its_label(tmp_path, monkeypatch):
    """The figure as drawn, before it is rendered (rendering 144 × 144 cells takes seconds: see the slow test)."""
    from attnscope.output import figures

    drawn = {}

    def keep(figure, path):
        axes = figure.axes[0]
        drawn["x"] = [label.get_text() for label in axes.get_xticklabels()]
        drawn["y"] = [label.get_text() for label in axes.get_yticklabels()]
        drawn["pixels"] = tuple(round(inches * figures.DPI) for inches in figure.get_size_inches())
        figures.plt.close(figure)
        return path

    monkeypatch.setattr(figures, "_save", keep)
    matrix = np.random.default_rng(0).random((144, 144))
    figures.head_matrix(matrix, LABELS, "JS", tmp_path / "m.png", 0.0, 1.0, "viridis_r")
    assert drawn["x"] == LABELS and drawn["y"] == LABELS  # every head labelled, none skipped
    assert drawn["pixels"] == PIXELS


@pytest.mark.slow
def test_matrix_of_many_heads_renders_at_its_known_size(tmp_path):
    from attnscope.output import figures

    matrix = np.random.default_rng(0).random((144, 144))
    figures.head_matrix(matrix, LABELS, "JS", tmp_path / "m.png", 0.0, 1.0, "viridis_r")
    assert png_size(tmp_path / "m.png") == PIXELS
