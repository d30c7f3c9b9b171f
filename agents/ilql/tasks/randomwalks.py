"""Random walks: find short paths to a goal node in a random directed graph (after trlx's task).

A graph of `n_nodes` nodes (node 0 is the goal, absorbing) with edge probability `p_edge`;
the offline data are `n_walks` uniform random walks of at most `max_length` nodes from random
start nodes. A walk's reward is its optimality,

    (max_length − len) / (max_length − shortest_len),

where len is the number of nodes up to and including the goal, and a walk that never reaches
the goal or takes a missing edge counts as len = max_length (optimality 0). Uniform walks score
about 0.35, so behaviour cloning sits there; ILQL should find the shortest paths from the same data.
Nodes are the characters 'a', 'b', … (node 0 = 'a').
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from agents.ilql.data import Episode
from agents.ilql.tokenizer import build_char_tokenizer

__all__ = ["RandomWalks"]


@dataclass
class RandomWalks:
    n_nodes: int = 21
    p_edge: float = 0.1
    max_length: int = 10
    n_walks: int = 1000
    seed: int = 1000  # trlx's ILQL randomwalks seed; its uniform walks score 0.35

    fitness_metric = "optimality"

    def __post_init__(self) -> None:
        rng = np.random.RandomState(self.seed)  # trlx's generator, so seed 1002 gives trlx's graph
        while True:
            adj = rng.rand(self.n_nodes, self.n_nodes) > (1 - self.p_edge)
            np.fill_diagonal(adj, False)
            if np.all(adj.sum(1)):
                break
        adj[0, :] = False
        adj[0, 0] = True  # the goal is absorbing
        self.adj, self.goal = adj, 0
        self.chars = "".join(chr(ord("a") + i) for i in range(self.n_nodes))
        self.tokenizer = build_char_tokenizer(self.chars)
        self.vocab_size = self.n_nodes + 1
        self.best_lengths = np.array([self._shortest(s) for s in range(self.n_nodes)])
        self.walks = [self._random_walk(rng) for _ in range(self.n_walks)]

    # ---- graph ------------------------------------------------------------------------------
    def token(self, node: int) -> int:
        return node + 1  # 0 is <pad>

    def node(self, token: int) -> int:
        return token - 1

    def _shortest(self, start: int) -> int:
        """Nodes on the shortest path start → goal inclusive, capped at max_length."""
        dist = {start: 1}
        queue = deque([start])
        while queue:
            u = queue.popleft()
            if u == self.goal:
                return min(dist[u], self.max_length)
            for w in np.nonzero(self.adj[u])[0]:
                if w not in dist:
                    dist[int(w)] = dist[u] + 1
                    queue.append(int(w))
        return self.max_length

    def _random_walk(self, rng: np.random.RandomState) -> list[int]:
        node = 0
        while node == self.goal:
            node = int(rng.randint(self.n_nodes))
        walk = [node]
        for _ in range(self.max_length - 1):
            node = int(rng.choice(np.nonzero(self.adj[node])[0]))
            walk.append(node)
            if node == self.goal:
                break
        return walk

    def optimality(self, walk: list[int]) -> float:
        length = self.max_length
        for i, node in enumerate(walk):
            if not 0 <= node < self.n_nodes or (i > 0 and not self.adj[walk[i - 1], node]):
                break
            if node == self.goal:
                length = i + 1
                break
        best = self.best_lengths[walk[0]]
        if best >= self.max_length:  # the goal is out of reach from this start: nothing to optimise
            return 0.0
        return float((self.max_length - min(length, self.max_length)) / (self.max_length - best))

    # ---- data -------------------------------------------------------------------------------
    @property
    def max_tokens(self) -> int:
        return self.max_length

    @property
    def max_actions(self) -> int:
        return self.max_length - 1

    def episodes(self) -> list[Episode]:
        """Each walk: the start node is the prompt, every later node an action; reward at the end."""
        out = []
        for walk in self.walks:
            tokens = [self.token(n) for n in walk]
            n_actions = len(walk) - 1
            rewards = [0.0] * n_actions
            rewards[-1] = self.optimality(walk)
            out.append(Episode(tokens=tokens, action_idxs=list(range(n_actions)), rewards=rewards))
        return out

    def data_optimality(self) -> float:
        return float(np.mean([self.optimality(w) for w in self.walks]))

    # ---- evaluation -------------------------------------------------------------------------
    def start_nodes(self) -> list[int]:
        """Every start node from which the goal can be reached within max_length."""
        return [s for s in range(1, self.n_nodes) if self.best_lengths[s] < self.max_length]

    def action_mask(self, prefix: list[int]) -> np.ndarray:
        """Tokens allowed after `prefix` (token ids): the current node's out-edges (trlx's logit mask)."""
        allowed = np.zeros(self.vocab_size, bool)
        allowed[1:] = self.adj[self.node(prefix[-1])]
        return allowed

    @torch.no_grad()
    def evaluate(self, model, beta: float, samples: int = 8, temperature: float = 1.0, top_k: int = 0,
                 generator: torch.Generator | None = None, mask_invalid: bool = True) -> dict[str, float]:
        """Mean optimality over start nodes of walks decoded with ILQL scores at this β."""
        from agents.ilql.decode import generate

        starts = [s for s in self.start_nodes() for _ in range(samples)]
        prompts = torch.tensor([[self.token(s)] for s in starts], dtype=torch.long)
        adj = torch.zeros(self.vocab_size, self.vocab_size, dtype=torch.bool)
        adj[1:, 1:] = torch.as_tensor(self.adj)
        allowed = (lambda toks: adj[toks[:, -1]]) if mask_invalid else None
        out = generate(model, prompts, self.max_length - 1, beta=beta, temperature=temperature, top_k=top_k,
                       generator=generator, allowed_fn=allowed)
        walks = [[self.node(t) for t in row] for row in out.tolist()]
        scores = np.array([self.optimality(w) for w in walks]).reshape(len(self.start_nodes()), samples)
        return {"optimality": float(scores.mean()), "solved": float((scores >= 1.0).mean())}
