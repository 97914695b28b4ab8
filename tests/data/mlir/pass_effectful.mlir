// A remat mark on an op that is not provably pure: re-running a stateful
// dropout on the backward path would draw a new mask. The pass says REMAT_EFFECTFUL.
func.func @main(%x: tensor<64xf32>) -> tensor<64xf32> attributes {tessera.remat_budget_mb = 1 : i32} {
  %a = math.exp %x {tessera.recompute} : tensor<64xf32>
  %d = "test.stateful_dropout"(%a) {tessera.recompute} : (tensor<64xf32>) -> tensor<64xf32>
  %y = arith.addf %d, %a : tensor<64xf32>
  return %y : tensor<64xf32>
}
