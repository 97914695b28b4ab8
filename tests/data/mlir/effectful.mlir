// Unregistered ops outside the pure table may have effects: "tessera.send"
// returns nothing and "tessera.dropout_rng" is stateful. Neither is recomputable.
func.func @main(%x: tensor<32xf32>) -> tensor<32xf32> {
  %a = "tessera.exp"(%x) : (tensor<32xf32>) -> tensor<32xf32>
  %r = "tessera.dropout_rng"(%a) : (tensor<32xf32>) -> tensor<32xf32>
  "tessera.send"(%a) : (tensor<32xf32>) -> ()
  %b = "tessera.silu"(%r) : (tensor<32xf32>) -> tensor<32xf32>
  %c = arith.addf %b, %a : tensor<32xf32>
  return %c : tensor<32xf32>
}
