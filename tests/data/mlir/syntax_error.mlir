// Line 4 misses the type of the operation.
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = arith.addf %x, %x : tensor<4xf32>
  %b = arith.mulf %a, %a
  return %b : tensor<4xf32>
}
