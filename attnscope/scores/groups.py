"""Grouping heads by a distance matrix (scipy): near-duplicate groups and average-linkage clusters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _sorted_groups(labels: np.ndarray) -> list[list[int]]:
    """Members of each label with two or more, each sorted, ordered by their first member."""
    members: dict[int, list[int]] = {}
    for index, label in enumerate(labels.tolist()):
        members.setdefault(label, []).append(index)
    return sorted((group for group in members.values() if len(group) > 1), key=lambda group: group[0])


def near_duplicate_groups(distance: np.ndarray, threshold: float) -> list[list[int]]:
    """Connected components of the graph joining every pair closer than `threshold` (so heads join through a
    chain of close pairs); only groups of 2 or more, each sorted, ordered by their first member."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    close = np.triu(np.asarray(distance) < threshold, k=1)
    _, labels = connected_components(csr_matrix(close), directed=False)
    return _sorted_groups(labels)


@dataclass(frozen=True)
class Linkage:
    """Average-linkage (UPGMA) clustering: `order`, the leaves with similar items side by side (scipy's optimal
    leaf ordering), and `merges`, scipy's linkage matrix (K-1, 4): the two clusters joined, their average distance,
    the size of the result."""

    order: list[int]
    merges: np.ndarray


def average_linkage(distance: np.ndarray) -> Linkage:
    """Agglomerative clustering of a symmetric distance matrix with average linkage and optimal leaf order."""
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import squareform

    K = distance.shape[0]
    if K < 2:
        return Linkage(list(range(K)), np.zeros((0, 4)))
    condensed = squareform(np.asarray(distance, dtype=np.float64), checks=False)  # the diagonal is left out
    merges = linkage(condensed, method="average", optimal_ordering=True)
    return Linkage([int(k) for k in leaves_list(merges)], merges)


def clusters(linkage: Linkage, threshold: float) -> list[list[int]]:
    """The clusters formed by merges below `threshold` (groups of 2 or more, each sorted, by first member)."""
    from scipy.cluster.hierarchy import fcluster

    if len(linkage.merges) == 0:
        return []
    # fcluster joins merges at or below t; "below" is the largest number under the threshold
    labels = fcluster(linkage.merges, np.nextafter(threshold, -np.inf), criterion="distance")
    return _sorted_groups(labels)
