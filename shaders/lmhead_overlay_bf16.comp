#version 460
#extension GL_GOOGLE_include_directive : require
// lmhead_overlay_bf16: the lm_head overlay writing bf16 logits (RNE).
#include "lmhead_overlay.glsl"
