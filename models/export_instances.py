"""Regenerate ``instances/``: graphs traced from the models at a few sizes.

Run from the repository root: ``python -m models.export_instances``. Each
graph's ``meta`` records the model, its full config, the argument shapes, the
jax version and the device profile, so every file says how to make it again.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from rematopt.jax import trace_grad

OUT = Path(__file__).resolve().parents[1] / "instances"
DEVICE = "a100"
# (file stem, model module, config overrides, fuse)
INSTANCES = [
    ("mlp_l4_w256", "mlp", {}, False),
    ("gpt_l2_w64", "gpt", {}, False),
    ("gpt_l2_w64_fused", "gpt", {}, True),
    ("gpt_l10_w128_s64", "gpt", {"layers": 10, "width": 128, "seq": 64}, False),
    ("gpt_l10_w128_s64_fused", "gpt", {"layers": 10, "width": 128, "seq": 64}, True),
    # 2,000+ nodes unfused (views merged, 10 layers give 1,834).
    ("gpt_l12_w128_s64", "gpt", {"layers": 12, "width": 128, "seq": 64}, False),
    ("resnet_s2_c16", "resnet", {}, False),
    ("unet_d2_c8", "unet", {}, False),
    # Built from the JAX libraries' own layers (the ``libraries`` extra).
    ("flax_linen_l2_w32", "flax_linen", {}, False),
    ("flax_nnx_l2_w32", "flax_nnx", {}, False),
    ("equinox_l2_w32", "equinox_lm", {}, False),
    ("keras_llama_l2_w32", "keras_lm", {"backbone": "llama"}, False),
    ("keras_gemma_l2_w32", "keras_lm", {"backbone": "gemma"}, False),
    ("keras_gpt2_l2_w32", "keras_lm", {"backbone": "gpt2", "dropout": 0.1}, False),
]


def export(stem: str, model: str, overrides: dict, fuse: bool) -> Path:
    module = importlib.import_module(f"models.{model}")
    fn, args = module.factory(**overrides)
    config = {**module.CONFIG, **overrides}
    g = trace_grad(fn, *args, name=stem, fuse=fuse, device=DEVICE,
                   meta={"model": f"models.{model}:factory", "config": config})
    path = OUT / f"{stem}.json"
    g.save(path)
    return path


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for stem, model, overrides, fuse in INSTANCES:
        path = export(stem, model, overrides, fuse)
        print(f"{path.name}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
