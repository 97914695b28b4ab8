// A dynamic dimension without a bound counts 4096 bytes per result; a bounded
// one counts at its bound (8 x 16 x f32 = 512 bytes).
func.func @main(%x: tensor<?x16xf32>, %y: tensor<?x16xf32, #stablehlo.bounds<8, ?>>) -> (tensor<?x16xf32>, tensor<?x16xf32, #stablehlo.bounds<8, ?>>) {
  %a = stablehlo.exponential %x : tensor<?x16xf32>
  %b = stablehlo.exponential %y : tensor<?x16xf32, #stablehlo.bounds<8, ?>>
  return %a, %b : tensor<?x16xf32>, tensor<?x16xf32, #stablehlo.bounds<8, ?>>
}
