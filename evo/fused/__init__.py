"""Fused population training: same-architecture members trained as one vectorised program.

See docs/fused.md. `FusedGroup` is the engine (stacked weights, per-member Adam, per-member
clipping, fixed slots); `FusedPopulation` places members into groups by architecture key.
"""

from evo.fused.adam import ADAM_DEFAULTS, StackedAdam, clip_per_member
from evo.fused.group import FusedGroup, FusedPopulation, LossFn, can_fuse, stack_batches
from evo.fused.stack import MethodCall, StackedModules, architecture_key, batchnorm_modules, call_method

__all__ = ["ADAM_DEFAULTS", "FusedGroup", "FusedPopulation", "LossFn", "MethodCall", "StackedAdam", "StackedModules",
           "architecture_key", "batchnorm_modules", "call_method", "can_fuse", "clip_per_member", "stack_batches"]
