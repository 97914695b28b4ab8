"""The HLO reader and the kernel list, on a module compiled here and on the H200 fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from rematopt.xla import HloError, parse_hlo, read_hlo  # noqa: E402
from rematopt.xla.hlo import parse_shape  # noqa: E402
from rematopt.xla.kernels import kernels, step_flops  # noqa: E402

GPU_DIR = Path(__file__).resolve().parents[2] / "shared" / "gpu" / "h200_gpt8"


def _step(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.sin(h) * h)


@pytest.fixture(scope="module")
def compiled():
    args = (jnp.ones((64, 48)), jnp.ones((32, 64)))
    return jax.jit(jax.value_and_grad(_step)).lower(*args).compile()


@pytest.fixture(scope="module")
def gpu_plain():
    path = GPU_DIR / "hlo_plain.txt"
    if not path.is_file():
        pytest.skip(f"H200 fixture not found at {path} (../shared is absent)")
    return read_hlo(path)


def test_shapes_tuple_aware():
    s = parse_shape("(f32[8,16]{1,0}, (s8[100]{0}, pred[]), /*index=2*/bf16[3])")
    assert [leaf.dtype for leaf in s.leaves] == ["f32", "s8", "pred", "bf16"]
    assert s.index == ((0,), (1, 0), (1, 1), (2,))
    assert s.bytes == 8 * 16 * 4 + 100 + 1 + 6
    assert parse_shape("f32[]").bytes == 4 and not parse_shape("f32[]").is_tuple


def test_cpu_module_matches_what_jax_compiled(compiled):
    text = compiled.as_text()
    m = parse_hlo(text)
    assert m.is_scheduled
    # The schedule is the entry's printed order: every instruction line of the ENTRY block, in order.
    entry_block = text[text.index("\nENTRY"):]
    entry_block = entry_block[: entry_block.index("\n}\n")]
    printed = [ln.split("=")[0].replace("ROOT", "").strip().lstrip("%") for ln in entry_block.splitlines()[2:]]
    assert [i.name for i in m.schedule] == printed
    params = m.entry.parameters
    assert [p.shape.leaves[0].dims for p in params] == [(64, 48), (32, 64)]
    stats = compiled.memory_analysis()
    assert sum(p.bytes for p in params) == stats.argument_size_in_bytes
    # outputs: the root tuple's arrays plus its pointer table
    root = m.entry.root
    assert root.shape.bytes + 8 * len(root.shape.leaves) == stats.output_size_in_bytes
    # metadata maps kernels back to this file's lines
    fused = [i for i in m.schedule if i.opcode == "fusion"]
    assert fused and all(i.called and i.called[0] in m.computations for i in fused)
    lines = {i.metadata.source_line for i in m.schedule if i.metadata.source_file.endswith("test_xla_hlo.py")}
    assert lines & {_step.__code__.co_firstlineno + 1, _step.__code__.co_firstlineno + 2}


def test_cpu_kernels_flops_and_bytes(compiled):
    m = parse_hlo(compiled.as_text())
    ks = kernels(m)
    names = {k.name for k in ks}
    assert not names & {i.name for i in m.schedule if i.opcode in ("parameter", "tuple", "bitcast", "constant")}
    # the two matmuls (forward x@w, backward x^T @ g): 2*32*64*48 flops each
    dot_flops = sum(k.flops for k in ks if any("dot_general" in n or "transpose" in n for n in k.op_names)
                    and k.flops >= 2 * 32 * 64 * 48)
    assert dot_flops == 2 * (2 * 32 * 64 * 48)
    for k in ks:
        assert k.bytes_written == m.entry.by_name[k.name].shape.bytes
        assert k.op_names, k.name


def test_step_flops_count_a_loop_body_per_trip():
    """XLA's cost_analysis counts a while loop's body once; step_flops counts it per trip, so a scanned
    step and the same step unrolled come out alike (the first round's FLOPs column compares them)."""
    w, x = jnp.ones((4, 64, 64)), jnp.ones((8, 64))

    def scanned(w, x):
        return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0].sum()

    def unrolled(w, x):
        for i in range(4):
            x = jnp.tanh(x @ w[i])
        return x.sum()

    figures = {}
    for f in (scanned, unrolled):
        c = jax.jit(f).lower(w, x).compile()
        costs = c.cost_analysis()
        costs = costs[0] if isinstance(costs, (list, tuple)) else costs
        figures[f.__name__] = (costs["flops"], step_flops(parse_hlo(c.as_text())))
    matmuls = 4 * 2 * 8 * 64 * 64
    assert figures["scanned"][0] < 0.3 * figures["unrolled"][0]  # XLA: the body once
    for _, ours in figures.values():
        assert matmuls <= ours <= 1.05 * matmuls
    assert figures["scanned"][1] == pytest.approx(figures["unrolled"][1], rel=0.01)


def test_gpu_fixture_kernels(gpu_plain):
    ks = kernels(gpu_plain)
    # ../shared/gpu/README.md: 513 kernels, 350 fusions and 163 cuBLAS calls; 101.5 GB moved where a
    # sliced operand is read whole, 100.9 read as sliced (xla.kernels.SLICES)
    assert len(ks) == 513
    assert sum(k.kind.startswith("fusion") for k in ks) == 350
    assert sum(k.kind == "custom-call:__cublas$lt$matmul" for k in ks) == 163
    assert round(sum(k.bytes_read + k.bytes_written for k in ks) / 1e9, 1) == 100.9
    # forward + backward GEMMs of the 8-layer GPT: 3x the forward's 2*N*D*(12D + ...) per layer
    n, d, t, h, v, layers = 8 * 1024, 1024, 1024, 16, 8192, 8
    forward = layers * (2 * n * d * 12 * d + 2 * 2 * 8 * h * t * t * (d // h)) + 2 * n * d * v
    gemm = sum(k.flops for k in ks if k.kind.startswith("custom-call") or "gemm" in k.name)
    assert abs(gemm / (3 * forward) - 1) < 0.01
    # every kernel names the program's equations it came from, except XLA's own weight concatenations
    # (it merges GEMM operands), which carry no metadata
    for k in ks:
        if not k.op_names:
            inner = gpu_plain.fused_instructions(gpu_plain.entry.by_name[k.name])
            assert {i.opcode for i in inner} == {"parameter", "concatenate"}, k.name


def test_gpu_metadata_source_lines(gpu_plain):
    gemm = next(i for i in gpu_plain.schedule if i.custom_call_target.startswith("__cublas"))
    assert gemm.metadata.op_name.endswith("dot_general")
    files = [f for f, _, _ in gemm.metadata.stack]
    assert "models/gpt.py" in files and files[-1] == "<string>"


def test_bad_text_one_line(tmp_path):
    with pytest.raises(HloError, match="not an HLO module"):
        parse_hlo("hello")
    bad = tmp_path / "bad.txt"
    bad.write_text("HloModule m\n\nENTRY %main () -> f32[] {\n  %x = f32[ constant(1)\n")
    with pytest.raises(HloError, match=str(bad)):
        read_hlo(bad)
    with pytest.raises(HloError, match="cannot read"):
        read_hlo(tmp_path / "missing.txt")


@pytest.mark.parametrize("body, problem", [
    ("  this is not hlo\n", "line 4 is not an HLO instruction"),
    ("", "computation main has no instructions"),
    ("  %a = f32[2]{0} parameter(0)\n  ROOT %b = f32[2]{0} add(%a, %q)\n", "reads %q, which computation main"),
    ("  %a = f32[2]{0} parameter(0)\n  ROOT %f = f32[2]{0} fusion(%a), kind=kLoop, calls=%gone\n",
     "calls %gone, which the module does not define"),
])
def test_malformed_module_named(body, problem):
    """A module XLA could not have printed is refused with the line or the reference at fault."""
    with pytest.raises(HloError, match=problem):
        parse_hlo(f"HloModule m\n\nENTRY %main {{\n{body}}}\n")
