"""ILQL (Implicit Language Q-Learning) as an evolvable evo agent; see docs/ilql.md.

`ILQL` is the learner with AgileRL's documented constructor; `ILQLAgent` is the population member.
"""

from agents.ilql.agent import ILQLAgent
from agents.ilql.ilql import ILQL

__all__ = ["ILQL", "ILQLAgent"]
