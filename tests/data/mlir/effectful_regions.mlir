// What stays not recomputable: a while whose body communicates, an if whose
// branch calls an unknown custom call, the unknown call itself, and an RNG.
// The sharding carrier (custom_call @Sharding) is a pass-through: recomputable.
func.func @main(%x: tensor<4xf32>, %p: tensor<i1>, %key: tensor<2xui64>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xui32>, tensor<4xf32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c3 = stablehlo.constant dense<3> : tensor<i32>
  %w:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, tensor<4xf32>
    cond {
      %lt = stablehlo.compare LT, %i, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %r = "stablehlo.all_reduce"(%v) ({
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          %s = stablehlo.add %a, %b : tensor<f32>
          stablehlo.return %s : tensor<f32>
      }) {replica_groups = dense<[[0]]> : tensor<1x1xi64>} : (tensor<4xf32>) -> tensor<4xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %next = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %next, %r : tensor<i32>, tensor<4xf32>
    }
  %sel = "stablehlo.if"(%p) ({
    %f = stablehlo.custom_call @foo(%x) : (tensor<4xf32>) -> tensor<4xf32>
    stablehlo.return %f : tensor<4xf32>
  }, {
    stablehlo.return %x : tensor<4xf32>
  }) : (tensor<i1>) -> tensor<4xf32>
  %ext = stablehlo.custom_call @foo(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %k2, %bits = stablehlo.rng_bit_generator %key, algorithm = DEFAULT : (tensor<2xui64>) -> (tensor<2xui64>, tensor<4xui32>)
  %shard = stablehlo.custom_call @Sharding(%x) {mhlo.sharding = "{replicated}"} : (tensor<4xf32>) -> tensor<4xf32>
  return %w#1, %sel, %ext, %bits, %shard : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xui32>, tensor<4xf32>
}
