// A compiler-dialect step with a remat budget (1.5 MiB) and measured costs:
// backward_work_ns wins over remat_cost_ns; %n has no measurement.
module {
  func.func @step(%x: tensor<256x256xf32>, %w: tensor<256x256xf32>) -> tensor<256x256xf32>
      attributes {tessera.remat_budget_mb = 1.5 : f64} {
    %h = "tessera.matmul"(%x, %w) {tessera.remat_cost_ns = 800.0 : f64} : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
    %g = "tessera.gelu"(%h) {tessera.backward_work_ns = 50 : i64, tessera.remat_cost_ns = 70.0 : f64} : (tensor<256x256xf32>) -> tensor<256x256xf32>
    %n = "tessera.layer_norm"(%g) : (tensor<256x256xf32>) -> tensor<256x256xf32>
    %y = "tessera.matmul"(%n, %h) {tessera.remat_cost_ns = 800.0 : f64} : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
    return %y : tensor<256x256xf32>
  }
  func.func private @unused_helper(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}
