"""XLA's host-offload annotations, as the installed JAX writes them.

StableHLO has no offload op. JAX lowers ``jax.device_put(x, memory_kind=...)``
inside ``jit`` to a side-effecting custom call that XLA's host-offload passes
read: the value after it lives in that memory kind. Rather than hard-code that
form, it is found by lowering such a ``device_put`` with the installed jaxlib,
for a GPU target (JAX registers the annotating lowering for TPU and GPU
only; its CPU lowering drops the transfer), and its attributes are copied
onto the exported ops.
"""

from __future__ import annotations

from functools import cache

from ..errors import PlanError
from ..importers.mlir import PLACEMENT_KEY

HOST = "pinned_host"
DEVICE = "device"


@cache
def _lowered_round_trip() -> str:
    """StableHLO of ``x -> device_put(device_put(x, pinned_host), device)``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    dev = jax.devices()[0]

    def there_and_back(x):
        host = jax.device_put(x, SingleDeviceSharding(dev, memory_kind=HOST))
        return jax.device_put(host, SingleDeviceSharding(dev, memory_kind=DEVICE))

    try:
        lowered = jax.jit(there_and_back).trace(jnp.zeros((2,), jnp.float32)).lower(lowering_platforms=("cuda",))
    except Exception as e:  # a jaxlib without the GPU lowering rules, say
        raise PlanError(f"cannot find XLA's host-offload annotation with this jaxlib ({e}); "
                        "--no-xla writes offload as tessera attributes only") from None
    return lowered.as_text()


def placement_attributes(ir) -> dict[str, dict]:
    """``{memory kind: attributes of its annotation op}`` (in the current
    context), read from the lowered round trip: one custom call per direction."""
    module = ir.Module.parse(_lowered_round_trip())
    found: dict[str, dict] = {}
    for func in module.body.operations:
        if func.operation.name != "func.func":
            continue
        for op in func.regions[0].blocks[0].operations:
            attrs = {name: op.attributes[name] for name in op.attributes}
            front = attrs.get("mhlo.frontend_attributes")
            if op.operation.name == "stablehlo.custom_call" and front is not None and PLACEMENT_KEY in front:
                found[ir.StringAttr(front[PLACEMENT_KEY]).value] = attrs
    if set(found) != {HOST, DEVICE}:
        raise PlanError(f"cannot find XLA's host-offload annotation with this jaxlib (lowering device_put gave "
                        f"placements {sorted(found)}); --no-xla writes offload as tessera attributes only")
    return found
