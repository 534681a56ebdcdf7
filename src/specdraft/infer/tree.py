"""Draft trees: what a proposer hands the verifier, the tree attention mask, and the walk that
finds the longest verified path.

Node 0 is the root, the last accepted token (not yet in the target's cache); drafted nodes are
1..N, each with a parent index smaller than its own. A chain of K drafts is the tree with
parents [-1, 0, 1, ..., K-1].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.errors import SpecdraftError


@dataclass
class Draft:
    tokens: list[int]                      # target ids of the drafted nodes 1..N
    parents: list[int]                     # parent of node i+1 (0 = the root)
    q: list[torch.Tensor] | None = None    # per node, the drafter's target-vocab distribution [V] (sampling)

    @classmethod
    def chain(cls, tokens: list[int], q: list[torch.Tensor] | None = None) -> "Draft":
        return cls(list(tokens), list(range(len(tokens))), q)

    @property
    def is_chain(self) -> bool:
        return all(p == i for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of nodes 0..N (root 0)."""
        depth = [0]
        for p in self.parents:
            depth.append(depth[p] + 1)
        return depth

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            kids[p].append(i + 1)
        return kids


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """bool [N+1, N+1] over root + nodes: entry (i, j) is True when j is i or an ancestor of i."""
    n = len(parents) + 1
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents, start=1):
        mask[i] |= mask[p]
    return mask


def greedy_path(draft: Draft, target_choice: list[int]) -> list[int]:
    """Longest path from the root whose every step is the target's own choice at its parent.

    target_choice[i] is the target's token after node i. Returns the node indices, root first.
    """
    kids = draft.children()
    path = [0]
    while True:
        node = path[-1]
        nxt = next((c for c in kids[node] if draft.tokens[c - 1] == target_choice[node]), None)
        if nxt is None:
            return path
        path.append(nxt)


TREE_MAX = (64, 64, 1024)      # depth, topk, total: past these a tree is a typo, not a setting


@dataclass
class TreeShape:
    """EAGLE-2: expand the top-`topk` children of the `topk` best nodes per depth, for `depth`
    depths, then keep the `total` best nodes by cumulative draft log-prob."""

    depth: int
    topk: int
    total: int

    @classmethod
    def parse(cls, text: str) -> "TreeShape":
        try:
            depth, topk, total = (int(x) for x in text.split(","))
        except ValueError:
            raise SpecdraftError(f"--tree {text!r}: expected depth,topk,total such as 5,4,16") from None
        if depth < 1 or topk < 1 or total < 1:
            raise SpecdraftError(f"--tree {text!r}: depth, topk and total must all be >= 1")
        if depth > TREE_MAX[0] or topk > TREE_MAX[1] or total > TREE_MAX[2]:
            raise SpecdraftError(f"--tree {text!r}: at most depth {TREE_MAX[0]}, topk {TREE_MAX[1]} and total "
                                 f"{TREE_MAX[2]} (the rows of one verify forward); EAGLE's trees are such as 5,8,60")
        made = topk + (depth - 1) * topk * topk       # the nodes depth levels of top-topk expansion propose
        if total > made:
            raise SpecdraftError(f"--tree {text!r}: total {total} is more than the {made} nodes {depth} depths of "
                                 f"top-{topk} expansion make; use total <= {made}, or a deeper or wider tree")
        return cls(depth, topk, total)
