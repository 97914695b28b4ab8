// A step as the compiler's remat pass sees it: a function budget in bytes
// (256 KiB), autodiff phases, measured costs (backward_work_ns wins over
// remat_cost_ns) and an explicit mark on a pure op. Every value is 256 KiB.
func.func @step(%x: tensor<256x256xf32>, %w: tensor<256x256xf32>) -> tensor<256x256xf32>
    attributes {tessera.remat_budget_bytes = 262144 : i64} {
  %h = "tessera.matmul"(%x, %w) {tessera.autodiff.phase = "forward", tessera.remat_cost_ns = 900 : i64} : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
  %g = "tessera.gelu"(%h) {tessera.autodiff.phase = "forward", tessera.backward_work_ns = 40 : i64, tessera.remat_cost_ns = 400 : i64} : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %e = "tessera.exp"(%g) {tessera.recompute, tessera.autodiff.phase = "forward", tessera.remat_cost_ns = 30 : i64} : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %y = "tessera.matmul"(%e, %w) {tessera.autodiff.phase = "forward", tessera.remat_cost_ns = 100 : i64} : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
  %dy = "tessera.gelu"(%y) {tessera.autodiff.phase = "backward", tessera.remat_cost_ns = 40 : i64} : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %d1 = arith.mulf %dy, %g {tessera.autodiff.phase = "backward"} : tensor<256x256xf32>
  %d2 = arith.mulf %d1, %h {tessera.autodiff.phase = "backward"} : tensor<256x256xf32>
  %d3 = arith.addf %d2, %e {tessera.autodiff.phase = "backward"} : tensor<256x256xf32>
  return %d3 : tensor<256x256xf32>
}
