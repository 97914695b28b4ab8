// Ops with regions are single nodes: the reduce and the if (whose branches
// read %big from outside) are recomputable, as every op in their regions is pure.
func.func @main(%x: tensor<64x16xf32>, %p: tensor<i1>) -> (tensor<16xf32>, tensor<64x16xf32>) {
  %big = stablehlo.exponential %x : tensor<64x16xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%big init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<64x16xf32>, tensor<f32>) -> tensor<16xf32>
  %sel = "stablehlo.if"(%p) ({
    %n = stablehlo.negate %big : tensor<64x16xf32>
    stablehlo.return %n : tensor<64x16xf32>
  }, {
    stablehlo.return %big : tensor<64x16xf32>
  }) : (tensor<i1>) -> tensor<64x16xf32>
  return %sum, %sel : tensor<16xf32>, tensor<64x16xf32>
}
