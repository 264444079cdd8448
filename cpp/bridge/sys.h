// moe-gemm: every header that declares a launch argument struct (and the enums and Status it holds), the input of
// scripts/bindgen.sh, which generates their Rust types (src/ffi/sys.rs); the cxx bridge takes those types as they
// are (bridge.h includes this). List here every header of those the structs come from, and every header they
// include (scripts/bindgen.sh and a unit test check that none is missing).
#pragma once

#include "common/launch.h"
#include "common/moe_ops.h"
#include "dense/launch_sm100.h"
#include "fp8/launch_fp8.h"
#include "fp8/launch_fp8_rowwise.h"
#include "fused/launch_fused_fp8.h"
#include "moe_ops/decode_fp8.h"
#include "moe_ops/ep.h"
#include "moe_ops/quant.h"
#include "mx/launch_mx_portable.h"
#include "mx/launch_sm100_mx.h"
#include "mx/mx_quant.h"
