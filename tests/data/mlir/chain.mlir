// A chain of arith/math ops on 1 KiB tensors; %a is read again at the end.
func.func @main(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %a = math.exp %x : tensor<16x16xf32>
  %b = arith.mulf %a, %a : tensor<16x16xf32>
  %c = math.tanh %b : tensor<16x16xf32>
  %d = arith.addf %c, %c : tensor<16x16xf32>
  %e = arith.addf %d, %a : tensor<16x16xf32>
  return %e : tensor<16x16xf32>
}
