//! One adapter's overlay (`EmbedOverlay`), its description, `build_overlay`
//! and `rowdiff`.
use std::ffi::CString;
use std::ptr::NonNull;

use tovl_sys as sys;

use crate::backend::{Backend, BackendBound, DeviceBuffer, DevicePtr, GpuBackend, OverlayKernels};
use crate::error::{c_string, check, Error, Result, Status};

/// Host rows for one part of an overlay: `ids[j]`'s row is
/// `rows[j * width .. (j + 1) * width]` (bf16 bit patterns).
#[derive(Clone, Copy, Debug)]
pub struct OverlayRows<'a> {
    /// The source tensor's name, used in error messages.
    pub tensor: &'a str,
    /// Distinct token ids, each below the vocab.
    pub ids: &'a [u32],
    /// `[ids.len(), width]` bf16 bit patterns.
    pub rows: &'a [u16],
    /// The row width; must equal the hidden size.
    pub width: u32,
}

impl<'a> OverlayRows<'a> {
    /// No rows.
    pub fn empty(tensor: &'a str, width: u32) -> Self {
        OverlayRows {
            tensor,
            ids: &[],
            rows: &[],
            width,
        }
    }
}

/// What [`build_overlay`] builds: an adapter's embed rows and, optionally,
/// its own lm_head rows.
#[derive(Clone, Copy, Debug)]
pub struct OverlayDesc<'a> {
    /// The adapter's name for error messages.
    pub adapter: Option<&'a str>,
    /// The model's (padded) vocabulary, > 0.
    pub vocab: u32,
    /// The hidden size, > 0.
    pub hidden: u32,
    /// Embed rows (empty: none).
    pub embed: OverlayRows<'a>,
    /// The lm_head part: `None` when absent; `Some` with no rows means "leave
    /// the lm_head alone", even when tied.
    pub lmhead: Option<OverlayRows<'a>>,
    /// The model ties its lm_head to its embedding: embed rows without an own
    /// lm_head part then also patch the lm_head (and need its kernels).
    pub tied: bool,
}

struct RawRows {
    _tensor: CString,
    rows: sys::tovl_overlay_rows,
}

fn raw_rows(part: &str, r: &OverlayRows<'_>) -> Result<RawRows> {
    let expect = r.ids.len().checked_mul(r.width as usize);
    if expect != Some(r.rows.len()) {
        return Err(Error::new(
            Status::ShapeMismatch,
            format!(
                "{part} rows of tensor '{}': {} values for {} ids of width {}",
                r.tensor,
                r.rows.len(),
                r.ids.len(),
                r.width
            ),
        ));
    }
    let count = u32::try_from(r.ids.len()).map_err(|_| {
        Error::new(
            Status::InvalidArgument,
            format!("{part}: {} ids exceed u32", r.ids.len()),
        )
    })?;
    let tensor = c_string("tensor name", r.tensor)?;
    let rows = sys::tovl_overlay_rows {
        tensor: tensor.as_ptr(),
        ids: r.ids.as_ptr(),
        rows: r.rows.as_ptr(),
        count,
        width: r.width,
    };
    Ok(RawRows { _tensor: tensor, rows })
}

impl OverlayDesc<'_> {
    /// Build it (see [`build_overlay`]).
    pub fn build<'b>(&self, gpu: &'b dyn GpuBackend, kernels: &OverlayKernels) -> Result<EmbedOverlay<'b>> {
        build_overlay(gpu, kernels, self)
    }
}

/// One adapter's overlay on a backend: its rows, ids and slot map in device
/// memory. Reference-counted in C: `clone` adds a reference, drop releases
/// one; a [`TokenOverlaySet`](crate::TokenOverlaySet) holds its own.
#[derive(Debug)]
pub struct EmbedOverlay<'b> {
    raw: NonNull<sys::tovl_embed_overlay>,
    backend: *const Backend,
    _backend: BackendBound<'b>,
}

impl Clone for EmbedOverlay<'_> {
    fn clone(&self) -> Self {
        EmbedOverlay::retained(self.raw, self.backend)
    }
}

impl Drop for EmbedOverlay<'_> {
    fn drop(&mut self) {
        // SAFETY: this value owns one reference.
        unsafe { sys::tovl_embed_overlay_release(self.raw.as_ptr()) }
    }
}

/// The read-only facts of a built overlay (device pointers; NULL when absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverlayView {
    /// The vocab (the slot map's length).
    pub vocab: u32,
    /// The hidden size.
    pub hidden: u32,
    /// Number of embed rows `n`.
    pub embed_count: u32,
    /// `u32[n]` embed ids.
    pub embed_ids: DevicePtr,
    /// bf16 `[n, hidden]` embed rows.
    pub embed_rows: DevicePtr,
    /// `i32[vocab]`: `slot_map[ids[j]] = j`, else -1.
    pub slot_map: DevicePtr,
    /// Whether the overlay has its own lm_head part.
    pub has_lmhead: bool,
    /// Number of lm_head rows `m`.
    pub lmhead_count: u32,
    /// `u32[m]` lm_head ids.
    pub lmhead_ids: DevicePtr,
    /// bf16 `[m, hidden]` lm_head rows.
    pub lmhead_rows: DevicePtr,
}

impl<'b> EmbedOverlay<'b> {
    pub(crate) fn from_out(
        code: sys::tovl_status,
        raw: *mut sys::tovl_embed_overlay,
        backend: &'b Backend,
    ) -> Result<Self> {
        check(code)?;
        let raw =
            NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, "build_overlay returned success and NULL"))?;
        Ok(EmbedOverlay {
            raw,
            backend,
            _backend: BackendBound::default(),
        })
    }

    /// A new reference to a live overlay of `backend` (which outlives `'b`).
    pub(crate) fn retained(raw: NonNull<sys::tovl_embed_overlay>, backend: *const Backend) -> Self {
        // SAFETY: a live overlay; the new reference is released by the drop.
        unsafe { sys::tovl_embed_overlay_retain(raw.as_ptr()) };
        EmbedOverlay {
            raw,
            backend,
            _backend: BackendBound::default(),
        }
    }

    pub(crate) fn as_raw(&self) -> *mut sys::tovl_embed_overlay {
        self.raw.as_ptr()
    }

    pub(crate) fn is_on(&self, backend: &Backend) -> bool {
        std::ptr::eq(self.backend, backend)
    }

    /// The overlay's sizes and device pointers.
    pub fn view(&self) -> OverlayView {
        // SAFETY: a live overlay.
        let v = unsafe { sys::tovl_embed_overlay_get_view(self.raw.as_ptr()) };
        OverlayView {
            vocab: v.vocab,
            hidden: v.hidden,
            embed_count: v.embed_count,
            embed_ids: DevicePtr(v.embed_ids),
            embed_rows: DevicePtr(v.embed_rows),
            slot_map: DevicePtr(v.slot_map),
            has_lmhead: v.has_lmhead,
            lmhead_count: v.lmhead_count,
            lmhead_ids: DevicePtr(v.lmhead_ids),
            lmhead_rows: DevicePtr(v.lmhead_rows),
        }
    }
}

/// Validate `desc`, upload its rows and ids and fill the slot map on `gpu`.
///
/// Errors name the tensor and the id or width: `DuplicateId`, `IdOutOfRange`,
/// `ShapeMismatch`; and `KernelMissing` names the kernel rows need when its
/// handle is 0 (embed rows: embed_overlay; lm_head rows, own or tied: both
/// lm_head kernels): an adapter that ships overlay tensors is refused on a
/// backend without the kernels, and one without any still builds.
pub fn build_overlay<'b>(
    gpu: &'b dyn GpuBackend,
    kernels: &OverlayKernels,
    desc: &OverlayDesc<'_>,
) -> Result<EmbedOverlay<'b>> {
    let backend = gpu.backend();
    let k = kernels.checked(backend)?;
    let adapter = desc.adapter.map(|a| c_string("adapter name", a)).transpose()?;
    let embed = raw_rows("embed", &desc.embed)?;
    let lmhead = desc.lmhead.as_ref().map(|l| raw_rows("lm_head", l)).transpose()?;
    let raw_desc = sys::tovl_overlay_desc {
        adapter: adapter.as_ref().map_or(std::ptr::null(), |a| a.as_ptr()),
        vocab: desc.vocab,
        hidden: desc.hidden,
        embed: embed.rows,
        has_lmhead: lmhead.is_some(),
        lmhead: lmhead.as_ref().map_or(
            sys::tovl_overlay_rows {
                tensor: std::ptr::null(),
                ids: std::ptr::null(),
                rows: std::ptr::null(),
                count: 0,
                width: desc.hidden,
            },
            |l| l.rows,
        ),
        tied: desc.tied,
    };
    let mut raw = std::ptr::null_mut();
    // SAFETY: every pointer in raw_desc lives until the call returns.
    let code = unsafe { sys::tovl_build_overlay(backend.as_raw(), &k, &raw_desc, &mut raw) };
    EmbedOverlay::from_out(code, raw, backend)
}

/// The rows of two device bf16 matrices `[rows, hidden]` that differ (spec:
/// rowdiff; `tol` 0: any bit, `tol` > 0: |a-b| > tol or NaN on one side), in
/// increasing order. Synchronous. `KernelMissing` when `kernels.rowdiff` is 0.
pub fn rowdiff(
    gpu: &dyn GpuBackend,
    kernels: &OverlayKernels,
    a: &DeviceBuffer<'_>,
    b: &DeviceBuffer<'_>,
    rows: u32,
    hidden: u32,
    tol: f32,
) -> Result<Vec<u32>> {
    let backend = gpu.backend();
    let k = kernels.checked(backend)?;
    let need = rows as usize * hidden as usize * 2;
    for (name, buf) in [("a", a), ("b", b)] {
        if !std::ptr::eq(buf.backend(), backend) {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("rowdiff: buffer {name} is on another backend"),
            ));
        }
        if buf.len() < need {
            return Err(Error::new(
                Status::ShapeMismatch,
                format!(
                    "rowdiff: buffer {name} holds {} bytes, [{rows}, {hidden}] bf16 needs {need}",
                    buf.len()
                ),
            ));
        }
    }
    let mut changed = vec![0u32; rows as usize];
    let mut n = 0u32;
    // SAFETY: both buffers hold [rows, hidden] bf16 on this backend; changed has capacity rows.
    check(unsafe {
        sys::tovl_rowdiff(
            backend.as_raw(),
            &k,
            a.ptr().0,
            b.ptr().0,
            rows,
            hidden,
            tol,
            changed.as_mut_ptr(),
            &mut n,
        )
    })?;
    changed.truncate(n as usize);
    Ok(changed)
}
