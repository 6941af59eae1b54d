module @jit_moe attributes {mhlo.cross_program_prefetches = [], mhlo.input_output_alias = [], mhlo.is_dynamic = false, mhlo.num_partitions = 8 : i32, mhlo.use_auto_spmd_partitioning = false} {
  sdy.mesh @mesh = <["data"=2, "expert"=4]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}, {name = "expert", size = 4 : i64}]}}
  func.func @main(%arg0: tensor<256x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data", "expert"}, {}]>}, %arg1: tensor<256x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, %arg2: tensor<8x256x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"expert"}, {}, {}]>}, %arg3: tensor<8x512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"expert"}, {}, {}]>}) -> (tensor<256x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data", "expert"}, {}]>}) {
    %0 = stablehlo.dot %arg0, %arg1, precision = [DEFAULT, DEFAULT] : (tensor<256x256xf32>, tensor<256x8xf32>) -> tensor<256x8xf32>
    %1 = sdy.constant dense<0xFF800000> : tensor<f32>
    %2 = stablehlo.reduce(%0 init: %1) applies stablehlo.maximum across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %3 = sdy.constant dense<0xFF800000> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %5 = stablehlo.maximum %2, %4 : tensor<256xf32>
    %6 = stablehlo.reshape %5 : (tensor<256xf32>) -> tensor<256x1xf32>
    %7 = stablehlo.broadcast_in_dim %6, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x1xf32>
    %8 = stablehlo.reshape %7 : (tensor<256x1xf32>) -> tensor<256xf32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0] : (tensor<256xf32>) -> tensor<256x8xf32>
    %10 = stablehlo.subtract %0, %9 : tensor<256x8xf32>
    %11 = stablehlo.exponential %10 : tensor<256x8xf32>
    %12 = sdy.constant dense<0.000000e+00> : tensor<f32>
    %13 = stablehlo.reduce(%11 init: %12) applies stablehlo.add across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %14 = stablehlo.reshape %13 : (tensor<256xf32>) -> tensor<256x1xf32>
    %15 = stablehlo.broadcast_in_dim %14, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x1xf32>
    %16 = stablehlo.reshape %15 : (tensor<256x1xf32>) -> tensor<256xf32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [0] : (tensor<256xf32>) -> tensor<256x8xf32>
    %18 = stablehlo.divide %11, %17 : tensor<256x8xf32>
    %19 = stablehlo.iota dim = 0 : tensor<8xi32>
    %20 = stablehlo.broadcast_in_dim %19, dims = [1] : (tensor<8xi32>) -> tensor<256x8xi32>
    %21 = sdy.constant dense<0xFF800000> : tensor<f32>
    %22 = sdy.constant dense<0> : tensor<i32>
    %23:2 = stablehlo.reduce(%18 init: %21), (%20 init: %22) across dimensions = [1] : (tensor<256x8xf32>, tensor<256x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<256xf32>, tensor<256xi32>)
     reducer(%arg4: tensor<f32>, %arg6: tensor<f32>) (%arg5: tensor<i32>, %arg7: tensor<i32>)  {
      %65 = stablehlo.compare GT, %arg4, %arg6 : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %66 = stablehlo.compare NE, %arg4, %arg4 : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %67 = stablehlo.or %65, %66 : tensor<i1>
      %68 = stablehlo.select %67, %arg4, %arg6 : tensor<i1>, tensor<f32>
      %69 = stablehlo.compare EQ, %arg4, %arg6 : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %70 = stablehlo.compare LT, %arg5, %arg7 : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %71 = stablehlo.and %69, %70 : tensor<i1>
      %72 = stablehlo.or %67, %71 : tensor<i1>
      %73 = stablehlo.select %72, %arg5, %arg7 : tensor<i1>, tensor<i32>
      stablehlo.return %68, %73 : tensor<f32>, tensor<i32>
    }
    %24 = stablehlo.reshape %23#1 : (tensor<256xi32>) -> tensor<256x1xi32>
    %25 = stablehlo.broadcast_in_dim %24, dims = [0, 1] : (tensor<256x1xi32>) -> tensor<256x1xi32>
    %26 = stablehlo.reshape %25 : (tensor<256x1xi32>) -> tensor<256xi32>
    %27 = stablehlo.broadcast_in_dim %26, dims = [0] : (tensor<256xi32>) -> tensor<256x8xi32>
    %28 = stablehlo.iota dim = 0 : tensor<8xi32>
    %29 = stablehlo.reshape %28 : (tensor<8xi32>) -> tensor<1x8xi32>
    %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1] : (tensor<1x8xi32>) -> tensor<1x8xi32>
    %31 = stablehlo.reshape %30 : (tensor<1x8xi32>) -> tensor<8xi32>
    %32 = stablehlo.broadcast_in_dim %31, dims = [1] : (tensor<8xi32>) -> tensor<256x8xi32>
    %33 = stablehlo.compare EQ, %27, %32 : (tensor<256x8xi32>, tensor<256x8xi32>) -> tensor<256x8xi1>
    %34 = stablehlo.convert %33 : (tensor<256x8xi1>) -> tensor<256x8xf32>
    %35 = stablehlo.dot_general %arg0, %34, batching_dims = [0] x [0], contracting_dims = [] x [], precision = [DEFAULT, DEFAULT] : (tensor<256x256xf32>, tensor<256x8xf32>) -> tensor<256x256x8xf32>
    %36 = stablehlo.transpose %35, dims = [2, 0, 1] {result_layout = dense<[0, 2, 1]> : tensor<3xindex>, xla_shape = "f32[8,256,256]{0,2,1}"} : (tensor<256x256x8xf32>) -> tensor<8x256x256xf32>
    %37 = sdy.sharding_constraint %36 <@mesh, [{"expert"}, {}, {}]> : tensor<8x256x256xf32>
    %38 = stablehlo.dot_general %37, %arg2, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<8x256x256xf32>, tensor<8x256x512xf32>) -> tensor<8x256x512xf32>
    %39 = stablehlo.multiply %38, %38 : tensor<8x256x512xf32>
    %40 = stablehlo.multiply %39, %38 : tensor<8x256x512xf32>
    %41 = sdy.constant dense<4.471500e-02> : tensor<f32>
    %42 = stablehlo.broadcast_in_dim %41, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %43 = stablehlo.multiply %40, %42 : tensor<8x256x512xf32>
    %44 = stablehlo.add %38, %43 : tensor<8x256x512xf32>
    %45 = sdy.constant dense<0.797884583> : tensor<f32>
    %46 = stablehlo.broadcast_in_dim %45, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %47 = stablehlo.multiply %44, %46 : tensor<8x256x512xf32>
    %48 = stablehlo.tanh %47 : tensor<8x256x512xf32>
    %49 = sdy.constant dense<1.000000e+00> : tensor<f32>
    %50 = stablehlo.broadcast_in_dim %49, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %51 = stablehlo.add %48, %50 : tensor<8x256x512xf32>
    %52 = sdy.constant dense<5.000000e-01> : tensor<f32>
    %53 = stablehlo.broadcast_in_dim %52, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %54 = stablehlo.multiply %51, %53 : tensor<8x256x512xf32>
    %55 = stablehlo.multiply %38, %54 : tensor<8x256x512xf32>
    %56 = stablehlo.dot_general %55, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<8x256x512xf32>, tensor<8x512x256xf32>) -> tensor<8x256x256xf32>
    %57 = sdy.sharding_constraint %56 <@mesh, [{"expert"}, {}, {}]> : tensor<8x256x256xf32>
    %58 = stablehlo.reduce(%18 init: %1) applies stablehlo.maximum across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %59 = stablehlo.reshape %58 : (tensor<256xf32>) -> tensor<256x1xf32>
    %60 = stablehlo.broadcast_in_dim %59, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x1xf32>
    %61 = stablehlo.reshape %60 : (tensor<256x1xf32>) -> tensor<256xf32>
    %62 = stablehlo.broadcast_in_dim %61, dims = [0] : (tensor<256xf32>) -> tensor<256x8xf32>
    %63 = stablehlo.multiply %34, %62 : tensor<256x8xf32>
    %64 = stablehlo.dot_general %57, %63, batching_dims = [1] x [0], contracting_dims = [0] x [1], precision = [DEFAULT, DEFAULT] : (tensor<8x256x256xf32>, tensor<256x8xf32>) -> tensor<256x256xf32>
    return %64 : tensor<256x256xf32>
  }
}
