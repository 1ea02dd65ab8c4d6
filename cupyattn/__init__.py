"""cupyattn: exact FlashAttention-style attention for CuPy arrays.

Every supported shape gets a tile configuration that fits the shared memory of
the GPU it runs on; ``cupyattn.plan_forward`` and the ``python -m cupyattn``
commands show the choice buffer by buffer.
"""

from .api import attention, attention_backward
from .device import NAMED_DEVICES, DeviceSpec, current_device, named_device
from .explain import CapabilityMatrix, Explanation, capabilities, explain
from .layout import Buffer, Layout
from .plan import AttentionProblem, BackwardPlan, FwdSimtConfig, Plan, PlanError, Policy, plan_backward, plan_forward

__version__ = "0.1.0"

__all__ = [
    "attention",
    "attention_backward",
    "AttentionProblem",
    "BackwardPlan",
    "plan_backward",
    "Buffer",
    "CapabilityMatrix",
    "DeviceSpec",
    "Explanation",
    "capabilities",
    "explain",
    "FwdSimtConfig",
    "Layout",
    "NAMED_DEVICES",
    "Plan",
    "PlanError",
    "Policy",
    "current_device",
    "named_device",
    "plan_forward",
]
