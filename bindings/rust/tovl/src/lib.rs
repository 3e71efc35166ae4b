//! tovl: per-adapter token overlays for multi-LoRA serving, with the Rust
//! engine's names.
//!
//! An engine keeps one base model and up to `max_loras` adapters in slots.
//! Some adapters replace a few token rows of the input embedding and of the
//! lm_head. tovl turns those rows into per-slot overlays ([`EmbedOverlay`],
//! made by [`build_overlay`]), gathers the slots into one pool of device
//! tables ([`TokenOverlaySet::from_slots`]) and patches a mixed batch with
//! two hooks ([`TokenOverlaySet::embed_hook`] after the embedding gather,
//! [`TokenOverlaySet::lmhead_hook`] after the lm_head projection) that never
//! allocate or synchronize, bit-exact across CPU, CUDA, HIP and Vulkan.
//!
//! ```no_run
//! use tovl::{Adapter, Backend, Model, OverlayKernels, TokenOverlaySet};
//! # fn main() -> tovl::Result<()> {
//! let gpu = Backend::open("auto")?;
//! let kernels = OverlayKernels::new(&gpu);
//! let model = Model::open("base-model/", 0)?;
//! let overlay = Adapter::open("adapter/")?.build_overlay(&gpu, &kernels, &model)?;
//! let set = TokenOverlaySet::from_slots(&gpu, vec![Some(overlay), None], 2, model.tied())?;
//! assert!(set.any_active());
//! # Ok(()) }
//! ```
//!
//! An engine that captures its forward pass once (CUDA/HIP graphs, a Vulkan
//! command buffer recorded once) serves through a fixed-shape set instead:
//! [`TokenOverlaySet::with_shape`] makes one from a [`SetShape`] (slots,
//! vocab, hidden, tied, and how many rows a slot may hold), and
//! [`TokenOverlaySet::load`] / [`TokenOverlaySet::unload`] change a slot in
//! place, ordered on a stream, with no capture again.
//!
//! Everything is the C library underneath (include/tovl/tovl.h; the raw FFI
//! is the `tovl-sys` crate, re-exported as [`sys`]). Names: `GpuBackend` =
//! `tovl_backend`, `KernelHandle` = `tovl_kernel`, `OverlayKernels` =
//! `tovl_overlay_kernels`, `EmbedOverlay` = `tovl_embed_overlay`,
//! `TokenOverlaySet` = `tovl_token_overlay_set`, `from_slots` =
//! `tovl_token_overlay_set_from_slots`, `try_kernel` = `tovl_try_kernel`;
//! `SetShape` = `tovl_set_shape`, `with_shape` =
//! `tovl_token_overlay_set_create`, `with_shape_shard` =
//! `tovl_token_overlay_set_create_shard`, `load` / `unload` / `collect` /
//! `is_fixed` / `slot` = `tovl_token_overlay_set_load` / `_unload` /
//! `_collect` / `_is_fixed` / `_slot`.
//!
//! Threads follow the C library's rule: a backend and the objects built on it
//! are used from one thread at a time. [`Backend`] is `Send`, not `Sync`;
//! overlays, sets and device buffers borrow it (a lifetime), so the compiler
//! keeps them on its thread and ends them before it closes. Models, adapters
//! and safetensors files belong to no backend and are `Send + Sync`.
//!
//! Two threads cannot share a backend (this does not build):
//!
//! ```compile_fail,E0277
//! let be = tovl::Backend::open("cpu").unwrap();
//! std::thread::scope(|s| {
//!     s.spawn(|| be.name()); // `Backend` is not `Sync`
//!     be.name()
//! });
//! ```
#![deny(missing_docs)]

mod backend;
mod error;
mod import;
mod overlay;
mod set;

pub use backend::{
    Backend, BackendInfo, DeviceBuffer, DevicePtr, Element, GpuBackend, KernelHandle, OverlayKernels, Stream,
    VulkanDevice, KERNEL_EMBED_OVERLAY, KERNEL_LMHEAD_OVERLAY_BF16, KERNEL_LMHEAD_OVERLAY_F32, KERNEL_ROWDIFF,
};
pub use error::{Error, ErrorGroup, Result, Status};
pub use import::{
    Adapter, AdapterInfo, AdapterRows, AdapterSource, Model, ModelInfo, Module, SafeTensors, SourceKind, Tensor,
};
pub use overlay::{build_overlay, rowdiff, EmbedOverlay, OverlayDesc, OverlayRows, OverlayView};
pub use set::{vocab_shard_range, EmbedHookArgs, LmHeadHookArgs, LogitsDtype, SetShape, Slots, TokenOverlaySet};

/// The raw FFI (the `tovl-sys` crate).
pub use tovl_sys as sys;

/// The library's version ("0.1.0").
pub fn version() -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { error::cstr_lossy(sys::tovl_version()) }
}

/// f32 to bf16, nearest-even; every NaN becomes 0x7FC0 (the spec's rule).
pub fn f32_to_bf16(value: f32) -> u16 {
    // SAFETY: a pure function.
    unsafe { sys::tovl_f32_to_bf16(value) }
}

/// bf16 to f32, exact.
pub fn bf16_to_f32(bits: u16) -> f32 {
    // SAFETY: a pure function.
    unsafe { sys::tovl_bf16_to_f32(bits) }
}
