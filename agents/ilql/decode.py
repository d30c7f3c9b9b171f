"""ILQL decoding: perturb the policy by the advantage, then sample.

    score(a | s) = log π(a | s) + β · (min_i Qt_i(s, a) − V(s))

β = 0 is the behaviour-cloned policy itself; larger β trusts the learned Q more. Then
top-k filtering and temperature as usual (temperature 0 or top_k = 1 is greedy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from agents.ilql.model import ILQLModel

__all__ = ["ilql_scores", "next_token_distribution", "generate"]

AllowedFn = Callable[[torch.Tensor], torch.Tensor]  # (B, t) tokens -> (B, V) bool allowed next tokens


def ilql_scores(logits: torch.Tensor, target_q: torch.Tensor, v: torch.Tensor, beta: float) -> torch.Tensor:
    """log_softmax(logits) + β (Qt − V), shapes (B, V), (B, V), (B,)."""
    scores = F.log_softmax(logits, dim=-1)
    if beta:
        scores = scores + beta * (target_q - v.unsqueeze(-1))
    return scores


def next_token_distribution(model: ILQLModel, tokens: torch.Tensor, beta: float, temperature: float = 1.0,
                            top_k: int = 0, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilities (B, V) of the next token under ILQL decoding."""
    out = model.step_outputs(tokens)
    scores = ilql_scores(out["logits"], out["target_q"], out["v"], beta)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if top_k and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if temperature <= 0:
        greedy = torch.zeros_like(scores).scatter_(1, scores.argmax(-1, keepdim=True), 1.0)
        return greedy
    return F.softmax(scores / temperature, dim=-1)


@torch.no_grad()
def generate(model: ILQLModel, prompts: torch.Tensor, max_new_tokens: int, beta: float = 0.0,
             temperature: float = 1.0, top_k: int = 0, generator: torch.Generator | None = None,
             allowed_fn: AllowedFn | None = None) -> torch.Tensor:
    """Append `max_new_tokens` tokens to every row of `prompts` (B, P) (no padding inside prompts)."""
    was_training = model.training
    model.eval()
    tokens = prompts
    for _ in range(max_new_tokens):
        allowed = allowed_fn(tokens) if allowed_fn is not None else None
        probs = next_token_distribution(model, tokens, beta, temperature, top_k, allowed)
        nxt = torch.multinomial(probs, 1, generator=generator)
        tokens = torch.cat([tokens, nxt], dim=1)
    model.train(was_training)
    return tokens
