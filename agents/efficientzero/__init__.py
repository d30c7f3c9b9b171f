"""EfficientZero (Ye et al. 2021) as an evolvable evo agent: see docs/efficientzero.md."""

from agents.efficientzero.agent import EfficientZeroAgent

__all__ = ["EfficientZeroAgent"]
