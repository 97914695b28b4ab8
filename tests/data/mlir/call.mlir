// func.call to functions of the same module is inlined, nested calls too;
// a call to an external declaration stays one opaque node.
module {
  func.func @main(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %first = func.call @block(%x) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %second = func.call @block(%first) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %ext = func.call @external(%second) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %out = stablehlo.add %ext, %x : tensor<8x8xf32>
    return %out : tensor<8x8xf32>
  }
  func.func private @block(%a: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %t = stablehlo.tanh %a : tensor<8x8xf32>
    %s = func.call @scale(%t) : (tensor<8x8xf32>) -> tensor<8x8xf32>
    %u = stablehlo.add %s, %t : tensor<8x8xf32>
    return %u : tensor<8x8xf32>
  }
  func.func private @scale(%a: tensor<8x8xf32>) -> tensor<8x8xf32> {
    %m = stablehlo.multiply %a, %a : tensor<8x8xf32>
    return %m : tensor<8x8xf32>
  }
  func.func private @external(tensor<8x8xf32>) -> tensor<8x8xf32>
}
