"""How much the workload's model-constrained tasks need each GPU model: the price of using one for anything else.

A task that may run only on a T4 has nowhere else to go; a task that runs anywhere does. When the pool's
model-constrained demand for a model approaches its supply, every unconstrained task placed on that model
turns a later constrained task away. FGD's fragment sees this only faintly (its 100-step gradient often rounds
it away), and :mod:`.feeding` can even pull unconstrained tasks toward such models: the Alibaba trace's T4
nodes have 52 cores per GPU, so nothing on them starves for CPU.

A model's pressure is the share of the workload's GPU demand that must run on it, over its share of the pool's
GPUs: a constrained shape's demand is spread over the models it allows, by their supply. 1 means constrained
tasks alone could fill that model; 0 means none insist on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .fragmentation import TaskShape

PRESSURE_WEIGHT = 0.1
"""Milli of fragment charged per milli of GPU used, per unit of pressure.

Measured on the trace's gpuspec workloads (seeds 42–46): 0.1 keeps gpupool ahead of FGD at every arrival
point from 100% to 130% on all five; 0.15 and 0.2 do too and place more by 100% arrived, but less by 130%.
"""


def model_pressure(shapes: Sequence[TaskShape], gpus_by_model: Mapping[str, int]) -> dict[str, float]:
    """Each model's pressure (see the module's docstring); models no constrained shape names are left out."""
    supply = sum(gpus_by_model.values())
    demand = sum(s.weight * s.gpu_milli * s.gpu_count for s in shapes)
    pressure: dict[str, float] = {}
    if not supply or not demand:
        return pressure
    for shape in shapes:
        allowed = sum(gpus_by_model.get(model, 0) for model in shape.products)
        if not shape.gpu_count or not allowed:
            continue  # unconstrained (or CPU-only) tasks go anywhere; a model the pool lacks serves no one
        share_of_demand = shape.weight * shape.gpu_milli * shape.gpu_count / demand
        for model in shape.products:
            if gpus_by_model.get(model):
                pressure[model] = pressure.get(model, 0.0) + share_of_demand * supply / allowed
    return pressure
