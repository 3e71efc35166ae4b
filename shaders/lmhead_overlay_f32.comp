#version 460
#extension GL_GOOGLE_include_directive : require
// lmhead_overlay_f32, tile variant: the lm_head overlay writing f32 logits.
#define TOVL_LOGITS_F32
#include "lmhead_overlay_tile.glsl"
