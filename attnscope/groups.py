"""Grouping heads by a distance matrix (pure numpy): near-duplicate groups and average-linkage clusters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def near_duplicate_groups(distance: np.ndarray, threshold: float) -> list[list[int]]:
    """Connected components of the graph joining every pair closer than `threshold`; only groups of 2 or more,
    each sorted, ordered by their first member."""
    K = distance.shape[0]
    parent = list(range(K))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for a, b in zip(*np.nonzero(np.triu(distance < threshold, k=1))):
        parent[root(int(a))] = root(int(b))
    members: dict[int, list[int]] = {}
    for k in range(K):
        members.setdefault(root(k), []).append(k)
    return sorted((group for group in members.values() if len(group) > 1), key=lambda group: group[0])


@dataclass(frozen=True)
class Linkage:
    order: list[int]  # leaf order: similar items sit together
    merges: list[tuple[list[int], list[int], float]]  # (members of a, members of b, average distance), in order


def average_linkage(distance: np.ndarray) -> Linkage:
    """Agglomerative clustering with average linkage (UPGMA): repeatedly merge the two clusters whose members are
    closest on average. Ties go to the lowest indices, so the result is deterministic."""
    K = distance.shape[0]
    work = np.array(distance, dtype=np.float64)
    np.fill_diagonal(work, np.inf)
    members = {k: [k] for k in range(K)}
    alive = np.ones(K, dtype=bool)
    merges = []
    for _ in range(K - 1):
        masked = np.where(alive[:, None] & alive[None, :], work, np.inf)
        a, b = divmod(int(np.argmin(masked)), K)
        a, b = min(a, b), max(a, b)
        size_a, size_b = len(members[a]), len(members[b])
        merges.append((list(members[a]), list(members[b]), float(work[a, b])))
        combined = (size_a * work[a] + size_b * work[b]) / (size_a + size_b)  # average distance to every cluster
        work[a], work[:, a] = combined, combined
        work[a, a] = np.inf
        alive[b] = False
        work[b], work[:, b] = np.inf, np.inf
        members[a] = members[a] + members.pop(b)
    order = next(iter(members.values())) if members else []
    return Linkage(order, merges)


def clusters(linkage: Linkage, threshold: float) -> list[list[int]]:
    """The clusters formed by merges below `threshold` (groups of 2 or more, each sorted, by first member)."""
    found: dict[int, list[int]] = {}
    for left, right, height in linkage.merges:
        if height >= threshold:
            continue
        combined = sorted(left + right)
        for member in combined:
            found.pop(member, None)
        found[combined[0]] = combined
    unique = {tuple(group) for group in found.values()}
    return sorted((list(group) for group in unique), key=lambda group: group[0])
