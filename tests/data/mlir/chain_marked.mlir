// The chain of chain.mlir as a compiler's remat pass sees it: explicit marks,
// autodiff phases and a retained-bytes override.
func.func @main(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %a = math.exp %x {tessera.recompute} : tensor<16x16xf32>
  %b = arith.mulf %a, %a {tessera.residual.retained_bytes = 512 : i64} : tensor<16x16xf32>
  %c = math.tanh %b {tessera.recompute, tessera.autodiff.phase = "forward"} : tensor<16x16xf32>
  %d = arith.addf %c, %c {tessera.autodiff.phase = "backward"} : tensor<16x16xf32>
  %e = arith.addf %d, %a {tessera.autodiff.phase = "backward"} : tensor<16x16xf32>
  return %e : tensor<16x16xf32>
}
