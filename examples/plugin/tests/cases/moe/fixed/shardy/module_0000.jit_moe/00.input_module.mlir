module @jit_moe attributes {mhlo.cross_program_prefetches = [], mhlo.frontend_attributes = {xla.sdy.meshes = "{mesh = #sdy.mesh<[\22data\22=2, \22expert\22=4]>}"}, mhlo.input_output_alias = [], mhlo.is_dynamic = false, mhlo.num_partitions = 8 : i32, mhlo.use_auto_spmd_partitioning = false} {
  func.func private @region_0.1(%arg0: tensor<f32>, %arg1: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.maximum %arg0, %arg1 : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func private @region_1.2(%arg0: tensor<f32>, %arg1: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.add %arg0, %arg1 : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func private @region_2.3(%arg0: tensor<f32>, %arg1: tensor<i32>, %arg2: tensor<f32>, %arg3: tensor<i32>) -> (tensor<f32>, tensor<i32>) {
    %0 = stablehlo.compare GT, %arg0, %arg2 : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %1 = stablehlo.compare NE, %arg0, %arg0 : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %2 = stablehlo.or %0, %1 : tensor<i1>
    %3 = stablehlo.select %2, %arg0, %arg2 : tensor<i1>, tensor<f32>
    %4 = stablehlo.compare EQ, %arg0, %arg2 : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %5 = stablehlo.compare LT, %arg1, %arg3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.and %4, %5 : tensor<i1>
    %7 = stablehlo.or %2, %6 : tensor<i1>
    %8 = stablehlo.select %7, %arg1, %arg3 : tensor<i1>, tensor<i32>
    return %3, %8 : tensor<f32>, tensor<i32>
  }
  func.func private @region_3.6(%arg0: tensor<f32>, %arg1: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.maximum %arg0, %arg1 : tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @main(%arg0: tensor<256x256xf32> {mhlo.frontend_attributes = {xla.sdy.sharding = "#sdy.sharding<@mesh, [{\22data\22, \22expert\22}, {}]>"}, mhlo.sharding = "{devices=[8,1]<=[8]}"}, %arg1: tensor<256x8xf32> {mhlo.frontend_attributes = {xla.sdy.sharding = "#sdy.sharding<@mesh, [{}, {}]>"}, mhlo.sharding = "{replicated}"}, %arg2: tensor<8x256x512xf32> {mhlo.frontend_attributes = {xla.sdy.sharding = "#sdy.sharding<@mesh, [{\22expert\22}, {}, {}]>"}, mhlo.sharding = "{devices=[4,1,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"}, %arg3: tensor<8x512x256xf32> {mhlo.frontend_attributes = {xla.sdy.sharding = "#sdy.sharding<@mesh, [{\22expert\22}, {}, {}]>"}, mhlo.sharding = "{devices=[4,1,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"}) -> (tensor<256x256xf32> {mhlo.sharding = "{devices=[8,1]<=[8]}"}) {
    %0 = stablehlo.dot %arg0, %arg1, precision = [DEFAULT, DEFAULT] : (tensor<256x256xf32>, tensor<256x8xf32>) -> tensor<256x8xf32>
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %3 = stablehlo.maximum %1, %2 : tensor<256xf32>
    %4 = stablehlo.reshape %3 : (tensor<256xf32>) -> tensor<256x1xf32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x1xf32>
    %6 = stablehlo.reshape %5 : (tensor<256x1xf32>) -> tensor<256xf32>
    %7 = stablehlo.broadcast_in_dim %6, dims = [0] : (tensor<256xf32>) -> tensor<256x8xf32>
    %8 = stablehlo.subtract %0, %7 : tensor<256x8xf32>
    %9 = stablehlo.exponential %8 : tensor<256x8xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %10 = stablehlo.reduce(%9 init: %cst_1) applies stablehlo.add across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %11 = stablehlo.reshape %10 : (tensor<256xf32>) -> tensor<256x1xf32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x1xf32>
    %13 = stablehlo.reshape %12 : (tensor<256x1xf32>) -> tensor<256xf32>
    %14 = stablehlo.broadcast_in_dim %13, dims = [0] : (tensor<256xf32>) -> tensor<256x8xf32>
    %15 = stablehlo.divide %9, %14 : tensor<256x8xf32>
    %16 = stablehlo.iota dim = 0 : tensor<8xi32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [1] : (tensor<8xi32>) -> tensor<256x8xi32>
    %cst_2 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %18:2 = stablehlo.reduce(%15 init: %cst_2), (%17 init: %c) across dimensions = [1] : (tensor<256x8xf32>, tensor<256x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<256xf32>, tensor<256xi32>)
     reducer(%arg4: tensor<f32>, %arg6: tensor<f32>) (%arg5: tensor<i32>, %arg7: tensor<i32>)  {
      %57 = stablehlo.compare GT, %arg4, %arg6 : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %58 = stablehlo.compare NE, %arg4, %arg4 : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %59 = stablehlo.or %57, %58 : tensor<i1>
      %60 = stablehlo.select %59, %arg4, %arg6 : tensor<i1>, tensor<f32>
      %61 = stablehlo.compare EQ, %arg4, %arg6 : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %62 = stablehlo.compare LT, %arg5, %arg7 : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %63 = stablehlo.and %61, %62 : tensor<i1>
      %64 = stablehlo.or %59, %63 : tensor<i1>
      %65 = stablehlo.select %64, %arg5, %arg7 : tensor<i1>, tensor<i32>
      stablehlo.return %60, %65 : tensor<f32>, tensor<i32>
    }
    %19 = stablehlo.reshape %18#1 : (tensor<256xi32>) -> tensor<256x1xi32>
    %20 = stablehlo.broadcast_in_dim %19, dims = [0, 1] : (tensor<256x1xi32>) -> tensor<256x1xi32>
    %21 = stablehlo.reshape %20 : (tensor<256x1xi32>) -> tensor<256xi32>
    %22 = stablehlo.broadcast_in_dim %21, dims = [0] : (tensor<256xi32>) -> tensor<256x8xi32>
    %23 = stablehlo.iota dim = 0 : tensor<8xi32>
    %24 = stablehlo.reshape %23 : (tensor<8xi32>) -> tensor<1x8xi32>
    %25 = stablehlo.broadcast_in_dim %24, dims = [0, 1] : (tensor<1x8xi32>) -> tensor<1x8xi32>
    %26 = stablehlo.reshape %25 : (tensor<1x8xi32>) -> tensor<8xi32>
    %27 = stablehlo.broadcast_in_dim %26, dims = [1] : (tensor<8xi32>) -> tensor<256x8xi32>
    %28 = stablehlo.compare EQ, %22, %27 : (tensor<256x8xi32>, tensor<256x8xi32>) -> tensor<256x8xi1>
    %29 = stablehlo.convert %28 : (tensor<256x8xi1>) -> tensor<256x8xf32>
    %30 = stablehlo.dot_general %arg0, %29, batching_dims = [0] x [0], contracting_dims = [] x [], precision = [DEFAULT, DEFAULT] : (tensor<256x256xf32>, tensor<256x8xf32>) -> tensor<256x256x8xf32>
    %31 = stablehlo.transpose %30, dims = [2, 0, 1] {result_layout = dense<[0, 2, 1]> : tensor<3xindex>, xla_shape = "f32[8,256,256]{0,2,1}"} : (tensor<256x256x8xf32>) -> tensor<8x256x256xf32>
    %32 = stablehlo.custom_call @Sharding(%31) {backend_config = "", mhlo.frontend_attributes = {xla.sdy.sharding = "#sdy.sharding_per_value<[<@mesh, [{\22expert\22}, {}, {}]>]>"}, mhlo.sharding = "{devices=[4,1,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"} : (tensor<8x256x256xf32>) -> tensor<8x256x256xf32>
    %33 = stablehlo.dot_general %32, %arg2, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<8x256x256xf32>, tensor<8x256x512xf32>) -> tensor<8x256x512xf32>
    %34 = stablehlo.multiply %33, %33 : tensor<8x256x512xf32>
    %35 = stablehlo.multiply %34, %33 : tensor<8x256x512xf32>
    %cst_3 = stablehlo.constant dense<4.471500e-02> : tensor<f32>
    %36 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %37 = stablehlo.multiply %35, %36 : tensor<8x256x512xf32>
    %38 = stablehlo.add %33, %37 : tensor<8x256x512xf32>
    %cst_4 = stablehlo.constant dense<0.797884583> : tensor<f32>
    %39 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %40 = stablehlo.multiply %38, %39 : tensor<8x256x512xf32>
    %41 = stablehlo.tanh %40 : tensor<8x256x512xf32>
    %cst_5 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %42 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %43 = stablehlo.add %41, %42 : tensor<8x256x512xf32>
    %cst_6 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %44 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<8x256x512xf32>
    %45 = stablehlo.multiply %43, %44 : tensor<8x256x512xf32>
    %46 = stablehlo.multiply %33, %45 : tensor<8x256x512xf32>
    %47 = stablehlo.dot_general %46, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<8x256x512xf32>, tensor<8x512x256xf32>) -> tensor<8x256x256xf32>
    %48 = stablehlo.custom_call @Sharding(%47) {backend_config = "", mhlo.frontend_attributes = {xla.sdy.sharding = "#sdy.sharding_per_value<[<@mesh, [{\22expert\22}, {}, {}]>]>"}, mhlo.sharding = "{devices=[4,1,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"} : (tensor<8x256x256xf32>) -> tensor<8x256x256xf32>
    %49 = stablehlo.reduce(%15 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %50 = stablehlo.reshape %49 : (tensor<256xf32>) -> tensor<256x1xf32>
    %51 = stablehlo.broadcast_in_dim %50, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x1xf32>
    %52 = stablehlo.reshape %51 : (tensor<256x1xf32>) -> tensor<256xf32>
    %53 = stablehlo.broadcast_in_dim %52, dims = [0] : (tensor<256xf32>) -> tensor<256x8xf32>
    %54 = stablehlo.multiply %29, %53 : tensor<256x8xf32>
    %55 = stablehlo.dot_general %48, %54, batching_dims = [1] x [0], contracting_dims = [0] x [1], precision = [DEFAULT, DEFAULT] : (tensor<8x256x256xf32>, tensor<256x8xf32>) -> tensor<256x256xf32>
    %56 = stablehlo.custom_call @xla.sdy.FuncResultSharding(%55) {backend_config = "", has_side_effect = true, mhlo.frontend_attributes = {xla.sdy.sharding = "#sdy.sharding_per_value<[<@mesh, [{\22data\22, \22expert\22}, {}]>]>"}} : (tensor<256x256xf32>) -> tensor<256x256xf32>
    return %56 : tensor<256x256xf32>
  }
}
