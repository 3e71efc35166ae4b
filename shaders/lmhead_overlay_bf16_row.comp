#version 460
#extension GL_GOOGLE_include_directive : require
// lmhead_overlay_bf16, row variant (small batches): bf16 logits (RNE).
#include "lmhead_overlay_row.glsl"
