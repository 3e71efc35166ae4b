//! The adapter pool (`TokenOverlaySet`) and the forward hooks.
use std::ops::Range;
use std::ptr::NonNull;

use tovl_sys as sys;

use crate::backend::{Backend, DevicePtr, GpuBackend, OverlayKernels, Stream};
use crate::error::{check, Error, Result, Status};
use crate::overlay::EmbedOverlay;

/// The overlay tables for the whole adapter pool. Destroyed on drop.
///
/// Two kinds, one type:
/// - [`from_slots`](TokenOverlaySet::from_slots) builds the tables from the
///   per-slot overlays, once; the set is immutable, and an engine keeps it
///   only when some slot has an overlay
///   ([`any_active`](TokenOverlaySet::any_active)).
/// - [`with_shape`](TokenOverlaySet::with_shape) makes a fixed-shape set
///   whose slots [`load`](TokenOverlaySet::load) and
///   [`unload`](TokenOverlaySet::unload) in place, ordered on a stream; its
///   tables never move and its hooks make the same launch whatever is
///   loaded, so a CUDA/HIP graph or a Vulkan command buffer recorded once
///   with both hooks serves every adapter loaded later.
///
/// The seeds' fields are methods here: the tables belong to the C set that
/// the hooks read, so they are answered by it rather than copied into
/// fields that could be changed without the hooks seeing it.
///
/// Threads: a set borrows its [`Backend`], which is not `Sync`, so a set is
/// neither `Send` nor `Sync`: its loads, unloads, collects and hooks all run
/// on the thread that holds the backend. (The C library also lets one thread
/// load a fixed-shape set while another runs its hooks, docs/API.md; these
/// types do not express that. An engine that needs it goes to the raw FFI
/// through [`as_raw`](TokenOverlaySet::as_raw) under the C rules.)
///
/// ```compile_fail,E0277
/// # use tovl::{Backend, SetShape, TokenOverlaySet};
/// let be = Backend::open("cpu").unwrap();
/// let shape = SetShape { max_loras: 2, vocab: 64, hidden: 8, tied: false, embed_capacity: 4, lmhead_capacity: 4 };
/// let set = TokenOverlaySet::with_shape(&be, &shape).unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| set.unload(0, tovl::Stream::BACKEND)); // a set is not `Sync`
/// });
/// ```
#[derive(Debug)]
pub struct TokenOverlaySet<'b> {
    raw: NonNull<sys::tovl_token_overlay_set>,
    overlays: Vec<Option<EmbedOverlay<'b>>>,
    shape: Option<SetShape>,
    backend: &'b Backend,
}

/// The shape of a fixed-shape set ([`TokenOverlaySet::with_shape`],
/// `tovl_set_shape`), kept for the set's whole life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SetShape {
    /// Slots, > 0.
    pub max_loras: u32,
    /// The served (padded) vocab every loaded overlay must have, > 0.
    pub vocab: u32,
    /// The hidden size every loaded overlay must have, > 0.
    pub hidden: u32,
    /// The model ties its lm_head to its embedding; every loaded overlay must
    /// have been built for the same rule.
    pub tied: bool,
    /// The most embedding rows one slot may hold.
    pub embed_capacity: u32,
    /// The most lm_head cells one slot may hold: its own lm_head rows, or in
    /// a tied set its embedding rows when it has no lm_head part. The
    /// lm_head hook's grid.y, so its cost at every call; a capacity costs no
    /// memory (the tables point into the overlays).
    pub lmhead_capacity: u32,
}

impl Drop for TokenOverlaySet<'_> {
    fn drop(&mut self) {
        // SAFETY: the set is destroyed once; its overlays drop after it.
        unsafe { sys::tovl_token_overlay_set_destroy(self.raw.as_ptr()) }
    }
}

/// Which slot each row of a batch uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slots {
    /// A device `i32[T]` array, one slot per row (< 0 or >= max_loras: none).
    PerRow(DevicePtr),
    /// One slot for every row (< 0: no launch at all).
    All(i32),
}

impl Slots {
    fn raw(self) -> (u64, i32) {
        match self {
            Slots::PerRow(p) => (p.0, -1),
            Slots::All(s) => (0, s),
        }
    }
}

/// The embed hook's batch: after the embedding gather, before any scale.
#[derive(Clone, Copy, Debug)]
pub struct EmbedHookArgs {
    /// bf16 `[tokens, hidden_size]`, patched in place.
    pub hidden: DevicePtr,
    /// `u32[tokens]` token ids (i32 ids read as u32: negatives are past the vocab).
    pub token_ids: DevicePtr,
    /// The rows' slots.
    pub slots: Slots,
    /// Rows in the batch (T).
    pub tokens: u32,
    /// The row width; must equal the set's hidden size.
    pub hidden_size: u32,
}

/// The dtype of the logits the lm_head hook patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsDtype {
    /// bf16 logits.
    Bf16,
    /// f32 logits.
    F32,
}

/// The lm_head hook's batch: after the lm_head projection, before any softcap.
#[derive(Clone, Copy, Debug)]
pub struct LmHeadHookArgs {
    /// `[tokens, ld]` of `dtype`, patched in place.
    pub logits: DevicePtr,
    /// The logits' dtype.
    pub dtype: LogitsDtype,
    /// Row stride in elements, >= the set's vocab (a shard set: its shard's width).
    pub ld: u64,
    /// bf16 `[tokens, hidden_size]` final hidden states.
    pub hidden: DevicePtr,
    /// The rows' slots.
    pub slots: Slots,
    /// Rows in the batch (T).
    pub tokens: u32,
    /// The hidden size; must equal the set's.
    pub hidden_size: u32,
}

impl<'b> TokenOverlaySet<'b> {
    fn slots_of(
        backend: &Backend,
        overlays: &[Option<EmbedOverlay<'b>>],
        max_loras: usize,
    ) -> Result<(u32, Vec<*mut sys::tovl_embed_overlay>)> {
        let n = u32::try_from(max_loras).ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::new(
                Status::InvalidArgument,
                format!("max_loras {max_loras}: must be 1 .. 2^32-1"),
            )
        })?;
        if overlays.len() > max_loras {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("{} overlays for max_loras {max_loras} slots", overlays.len()),
            ));
        }
        let mut raw = vec![std::ptr::null_mut(); max_loras];
        for (s, ov) in overlays.iter().enumerate() {
            if let Some(ov) = ov {
                if !ov.is_on(backend) {
                    return Err(Error::new(
                        Status::InvalidArgument,
                        format!(
                            "slot {s}: the overlay was built on another backend than {}",
                            backend.name()
                        ),
                    ));
                }
                raw[s] = ov.as_raw();
            }
        }
        Ok((n, raw))
    }

    fn from_out(
        code: sys::tovl_status,
        raw: *mut sys::tovl_token_overlay_set,
        overlays: Vec<Option<EmbedOverlay<'b>>>,
        backend: &'b Backend,
    ) -> Result<Self> {
        check(code)?;
        let raw =
            NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, "set creation returned success and NULL"))?;
        Ok(TokenOverlaySet {
            raw,
            overlays,
            shape: None,
            backend,
        })
    }

    /// Build the tables for `max_loras` slots; `overlays[s]` `None` is an empty
    /// slot, and slots past `overlays.len()` are empty. A slot's lm_head cells
    /// are its own lm_head overlay when it has one; else, when `tied`, its
    /// embed rows and ids; else none. Errors: `VocabMismatch` or
    /// `ShapeMismatch` for two overlays of different vocab or hidden size
    /// (naming both slots); `InvalidArgument` for more overlays than slots or
    /// an overlay of another backend.
    pub fn from_slots(
        gpu: &'b dyn GpuBackend,
        overlays: Vec<Option<EmbedOverlay<'b>>>,
        max_loras: usize,
        tied: bool,
    ) -> Result<Self> {
        let backend = gpu.backend();
        let (n, raw_slots) = Self::slots_of(backend, &overlays, max_loras)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw_slots holds max_loras entries, each NULL or a live overlay of this backend.
        let code =
            unsafe { sys::tovl_token_overlay_set_from_slots(backend.as_raw(), raw_slots.as_ptr(), n, tied, &mut raw) };
        Self::from_out(code, raw, overlays, backend)
    }

    /// A set for one tensor-parallel vocab shard `vocab` (`[start, end)` of the
    /// served vocab): its lm_head cells are the overlay ids inside the shard,
    /// at column `id - start` of the rank's logits shard; the embedding side
    /// is the whole overlay (tovl.h, `tovl_token_overlay_set_from_slots_shard`).
    pub fn from_slots_shard(
        gpu: &'b dyn GpuBackend,
        overlays: Vec<Option<EmbedOverlay<'b>>>,
        max_loras: usize,
        tied: bool,
        vocab: Range<u32>,
    ) -> Result<Self> {
        let backend = gpu.backend();
        let (n, raw_slots) = Self::slots_of(backend, &overlays, max_loras)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: as from_slots.
        let code = unsafe {
            sys::tovl_token_overlay_set_from_slots_shard(
                backend.as_raw(),
                raw_slots.as_ptr(),
                n,
                tied,
                vocab.start,
                vocab.end,
                &mut raw,
            )
        };
        Self::from_out(code, raw, overlays, backend)
    }

    /// A fixed-shape set with every slot empty (`tovl_token_overlay_set_create`):
    /// its six tables (40 bytes a slot) are allocated here and never move;
    /// the rows stay in the overlays it holds. Errors: `InvalidArgument`
    /// naming a field of `shape` that is 0.
    pub fn with_shape(gpu: &'b dyn GpuBackend, shape: &SetShape) -> Result<Self> {
        Self::shaped(gpu, shape, None)
    }

    /// A fixed-shape set for one tensor-parallel vocab shard `vocab`
    /// (`[start, end)` of the served vocab, `tovl_token_overlay_set_create_shard`):
    /// [`with_shape`](Self::with_shape) as [`from_slots_shard`](Self::from_slots_shard)
    /// is to [`from_slots`](Self::from_slots). Every rank loads the same slot at
    /// the same step and keeps its captured graphs; the capacity counts an
    /// overlay's whole lm_head, so every rank accepts or refuses a load alike.
    /// Errors: those of `with_shape`, and of `from_slots_shard`'s range rule
    /// against `shape.vocab`.
    pub fn with_shape_shard(gpu: &'b dyn GpuBackend, shape: &SetShape, vocab: Range<u32>) -> Result<Self> {
        Self::shaped(gpu, shape, Some(vocab))
    }

    fn shaped(gpu: &'b dyn GpuBackend, shape: &SetShape, shard: Option<Range<u32>>) -> Result<Self> {
        let backend = gpu.backend();
        let c = sys::tovl_set_shape {
            max_loras: shape.max_loras,
            vocab: shape.vocab,
            hidden: shape.hidden,
            tied: shape.tied,
            embed_capacity: shape.embed_capacity,
            lmhead_capacity: shape.lmhead_capacity,
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live backend, a valid shape and output.
        let code = unsafe {
            match shard {
                None => sys::tovl_token_overlay_set_create(backend.as_raw(), &c, &mut raw),
                Some(v) => sys::tovl_token_overlay_set_create_shard(backend.as_raw(), &c, v.start, v.end, &mut raw),
            }
        };
        let mut set = Self::from_out(code, raw, Vec::new(), backend)?;
        set.shape = Some(*shape);
        Ok(set)
    }

    /// Load `overlay` into `slot` of a fixed-shape set, replacing what the
    /// slot held, ordered on `stream`: work enqueued on it before the call
    /// sees the old contents, work enqueued after the new, no launch a mix.
    /// The host call does not wait for the device. The set holds its own
    /// reference to `overlay` (the caller's may go at once) and releases the
    /// replaced one once the device has passed the swap (see
    /// [`collect`](Self::collect)). On CUDA and HIP, load between graph
    /// replays, never while `stream` is being captured (refused).
    ///
    /// Takes `&self`: the C set's host state has its own lock and the hooks
    /// read only what never changes, so a load may come between hooks that
    /// borrow the same set.
    ///
    /// A refused load changes nothing; the error names the adapter, the
    /// value and the limit: `InvalidArgument` (a `from_slots` set, `slot >=
    /// max_loras`, another backend's overlay, an overlay built for the other
    /// tied rule), `VocabMismatch` / `ShapeMismatch` (vocab or hidden other
    /// than the shape's), `Capacity` (more embedding rows or lm_head cells
    /// than the shape's capacity).
    pub fn load(&self, slot: u32, overlay: &EmbedOverlay<'b>, stream: Stream) -> Result<()> {
        // SAFETY: a live set and overlay; the set retains the overlay itself;
        // `stream` is the backend's own or a live one (Stream::from_raw).
        check(unsafe { sys::tovl_token_overlay_set_load(self.raw.as_ptr(), slot, overlay.as_raw(), stream.as_raw()) })
    }

    /// Empty `slot` of a fixed-shape set, ordered on `stream` as
    /// [`load`](Self::load) (the same refusals for the set and the slot).
    pub fn unload(&self, slot: u32, stream: Stream) -> Result<()> {
        // SAFETY: as load.
        check(unsafe { sys::tovl_token_overlay_set_unload(self.raw.as_ptr(), slot, stream.as_raw()) })
    }

    /// Release the replaced overlays the device has passed, and answer how
    /// many are still held. Never waits; every load and unload does the same
    /// first. 0 for a `from_slots` set.
    pub fn collect(&self) -> Result<u32> {
        let mut pending = 0;
        // SAFETY: a live set and a valid output.
        check(unsafe { sys::tovl_token_overlay_set_collect(self.raw.as_ptr(), &mut pending) })?;
        Ok(pending)
    }

    /// True for a fixed-shape set ([`with_shape`](Self::with_shape)).
    pub fn is_fixed(&self) -> bool {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_is_fixed(self.raw.as_ptr()) }
    }

    /// The shape a fixed-shape set was made with (`None` for a `from_slots` set).
    pub fn shape(&self) -> Option<SetShape> {
        self.shape
    }

    /// The overlay `slot` holds now: a reference of its own, valid past the
    /// slot's next load or unload. `None` for an empty slot or one past
    /// `max_loras`. For a `from_slots` set, the overlay it was built with.
    pub fn slot(&self, slot: u32) -> Option<EmbedOverlay<'b>> {
        if !self.is_fixed() {
            return self.overlays.get(slot as usize).cloned().flatten();
        }
        // SAFETY: a live set; the borrowed overlay is retained before any
        // other call on the set (a set stays on one thread).
        let raw = unsafe { sys::tovl_token_overlay_set_slot(self.raw.as_ptr(), slot) };
        NonNull::new(raw).map(|raw| EmbedOverlay::retained(raw, self.backend))
    }

    /// The C set, for the raw FFI ([`sys`](crate::sys)); it stays owned by
    /// this value.
    pub fn as_raw(&self) -> *mut sys::tovl_token_overlay_set {
        self.raw.as_ptr()
    }

    /// True when at least one slot has an overlay. A fixed-shape set's hooks
    /// launch whether or not it is (the launch never depends on what is loaded).
    pub fn any_active(&self) -> bool {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_any_active(self.raw.as_ptr()) }
    }

    /// The per-slot overlays of a `from_slots` set, kept so the buffers the
    /// tables point into stay allocated (the C set also holds a reference of
    /// its own). Empty for a fixed-shape set, whose slots change: see
    /// [`slot`](Self::slot).
    pub fn overlays(&self) -> &[Option<EmbedOverlay<'b>>] {
        &self.overlays
    }

    fn tables(&self) -> sys::tovl_overlay_tables {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_tables(self.raw.as_ptr()) }
    }

    /// `u64[max_loras]` of `i32[vocab]` slot_map pointers, 0 for a slot without an overlay.
    pub fn embed_slot_map_table(&self) -> DevicePtr {
        DevicePtr(self.tables().embed_slot_map_table)
    }

    /// `u64[max_loras]` of embed row pointers (`[n, h]` bf16).
    pub fn embed_rows_table(&self) -> DevicePtr {
        DevicePtr(self.tables().embed_rows_table)
    }

    /// `u32[max_loras]` embed row counts; the embed kernel skips a slot_map entry not below it.
    pub fn embed_n_table(&self) -> DevicePtr {
        DevicePtr(self.tables().embed_n_table)
    }

    /// `u64[max_loras]` of lm_head row pointers.
    pub fn lmhead_rows_table(&self) -> DevicePtr {
        DevicePtr(self.tables().lmhead_rows_table)
    }

    /// `u64[max_loras]` of lm_head id pointers (`u32[n]`).
    pub fn lmhead_ids_table(&self) -> DevicePtr {
        DevicePtr(self.tables().lmhead_ids_table)
    }

    /// `u32[max_loras]` lm_head row counts; 0 skips the slot.
    pub fn n_override_table(&self) -> DevicePtr {
        DevicePtr(self.tables().n_override_table)
    }

    /// The slot_map length of every overlay (0 when there is none; a
    /// fixed-shape set: its shape's); the kernels skip token ids >= vocab.
    pub fn vocab(&self) -> u32 {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_vocab(self.raw.as_ptr()) }
    }

    /// The hidden size of the present overlays (0 when none; a fixed-shape
    /// set: its shape's).
    pub fn hidden(&self) -> u32 {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_hidden(self.raw.as_ptr()) }
    }

    /// The lm_head kernels' `max_n`: the largest lm_head row count of a
    /// `from_slots` set, the lm_head capacity of a fixed-shape set.
    pub fn max_n_override(&self) -> u32 {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_max_n_override(self.raw.as_ptr()) }
    }

    /// The lm_head launch's logical grid.y: `max_n_override` for a
    /// `from_slots` set, at most 64 for a fixed-shape set (the kernels loop
    /// over the rows past it).
    pub fn lmhead_grid_y(&self) -> u32 {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_lmhead_grid_y(self.raw.as_ptr()) }
    }

    /// The number of slots.
    pub fn max_loras(&self) -> u32 {
        // SAFETY: a live set.
        unsafe { sys::tovl_token_overlay_set_max_loras(self.raw.as_ptr()) }
    }

    /// The vocab range the set covers: `0..vocab` unless built by `from_slots_shard`.
    pub fn shard_range(&self) -> Range<u32> {
        let (mut start, mut end) = (0, 0);
        // SAFETY: a live set; both outputs are valid.
        unsafe { sys::tovl_token_overlay_set_shard_range(self.raw.as_ptr(), &mut start, &mut end) };
        start..end
    }

    /// The backend the set was built on.
    pub fn backend(&self) -> &'b Backend {
        self.backend
    }

    /// Enqueue the embed hook on `stream`: each row whose slot's overlay has
    /// its token id gets that overlay's row, bit for bit. Never allocates,
    /// copies to the host or synchronizes (CUDA/HIP graphs can capture it). A
    /// zero kernel handle, an inactive set, no rows or `Slots::All(< 0)`:
    /// success without a launch.
    ///
    /// # Safety
    /// `args.hidden` is `[tokens, hidden_size]` bf16, `args.token_ids`
    /// `u32[tokens]` and a `Slots::PerRow` array `i32[tokens]`, all device
    /// memory of this set's backend that stays valid, and unused by anything
    /// else, until the work on `stream` is done.
    pub unsafe fn embed_hook(&self, kernels: &OverlayKernels, args: &EmbedHookArgs, stream: Stream) -> Result<()> {
        let k = kernels.checked(self.backend)?;
        let (slots, active_slot) = args.slots.raw();
        let a = sys::tovl_embed_hook_args {
            hidden: args.hidden.0,
            token_ids: args.token_ids.0,
            slots,
            active_slot,
            T: args.tokens,
            hidden_size: args.hidden_size,
        };
        check(sys::tovl_embed_hook(self.raw.as_ptr(), &k, &a, stream.as_raw()))
    }

    /// Enqueue the lm_head hook on `stream`: recomputes the logits cells of
    /// overridden ids in the spec's fixed dot order (bit-exact across
    /// backends). Launch rules as [`embed_hook`](Self::embed_hook).
    ///
    /// # Safety
    /// `args.logits` is `[tokens, ld]` of `args.dtype`, `args.hidden`
    /// `[tokens, hidden_size]` bf16 and a `Slots::PerRow` array `i32[tokens]`,
    /// all device memory of this set's backend that stays valid, and unused by
    /// anything else, until the work on `stream` is done.
    pub unsafe fn lmhead_hook(&self, kernels: &OverlayKernels, args: &LmHeadHookArgs, stream: Stream) -> Result<()> {
        let k = kernels.checked(self.backend)?;
        let (slots, active_slot) = args.slots.raw();
        let a = sys::tovl_lmhead_hook_args {
            logits: args.logits.0,
            logits_dtype: match args.dtype {
                LogitsDtype::Bf16 => sys::TOVL_LOGITS_BF16,
                LogitsDtype::F32 => sys::TOVL_LOGITS_F32,
            },
            ld: args.ld,
            hidden: args.hidden.0,
            slots,
            active_slot,
            T: args.tokens,
            hidden_size: args.hidden_size,
        };
        check(sys::tovl_lmhead_hook(self.raw.as_ptr(), &k, &a, stream.as_raw()))
    }
}

/// vLLM's split of the vocabulary over `world_size` ranks: rank `rank`'s
/// `[start, end)` of the vocab padded to a multiple of `pad_multiple` (0: 64).
pub fn vocab_shard_range(vocab: u32, world_size: u32, rank: u32, pad_multiple: u32) -> Result<Range<u32>> {
    let (mut start, mut end) = (0, 0);
    // SAFETY: both outputs are valid.
    check(unsafe { sys::tovl_vocab_shard_range(vocab, world_size, rank, pad_multiple, &mut start, &mut end) })?;
    Ok(start..end)
}
