#version 460
#extension GL_GOOGLE_include_directive : require
// lmhead_overlay_bf16, tile variant: the lm_head overlay writing bf16 logits (RNE).
#include "lmhead_overlay_tile.glsl"
