//! Adapters and base models: safetensors files, Hugging Face model folders,
//! PEFT / vLLM adapter folders, and their overlay rows (docs/ADAPTERS.md).
//!
//! These objects belong to no backend: they are `Send` and `Sync` (their
//! reading functions may run on several threads at once, docs/API.md).
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::NonNull;

use tovl_sys as sys;

use crate::backend::{GpuBackend, OverlayKernels};
use crate::error::{c_string, check, cstr_lossy, cstr_ref, Error, Result, Status};
use crate::overlay::{EmbedOverlay, OverlayDesc, OverlayRows};

fn path_c(what: &str, p: &Path) -> Result<std::ffi::CString> {
    let s = p
        .to_str()
        .ok_or_else(|| Error::new(Status::InvalidArgument, format!("{what} {}: not UTF-8", p.display())))?;
    c_string(what, s)
}

fn non_null<T>(code: sys::tovl_status, raw: *mut T, what: &str) -> Result<NonNull<T>> {
    check(code)?;
    NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, format!("{what} returned success and NULL")))
}

/// # Safety
/// `p` is NULL (then `n` is ignored) or points to `n` valid values living for `'a`.
unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(p, n)
    }
}

/// A safetensors file, memory-mapped read-only with its whole header
/// validated; closed on drop.
#[derive(Debug)]
pub struct SafeTensors {
    raw: NonNull<sys::tovl_safetensors>,
}

// SAFETY: read-only after open; no thread affinity (docs/API.md).
unsafe impl Send for SafeTensors {}
// SAFETY: as Send: its functions only read.
unsafe impl Sync for SafeTensors {}

impl Drop for SafeTensors {
    fn drop(&mut self) {
        // SAFETY: closed once; tensors borrow self.
        unsafe { sys::tovl_safetensors_close(self.raw.as_ptr()) }
    }
}

/// One tensor of a [`SafeTensors`] file: a view into the mapped file.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'f> {
    /// The tensor's name.
    pub name: &'f str,
    /// As in the file: "BF16", "F16", "F32", "I32", ...
    pub dtype: &'f str,
    /// Bytes per element.
    pub elem_size: u32,
    /// The shape.
    pub shape: &'f [u64],
    /// The bytes (`count * elem_size`), not necessarily aligned.
    pub data: &'f [u8],
}

impl<'f> Tensor<'f> {
    /// # Safety
    /// `t` is a tensor of a file living for `'f`.
    unsafe fn from_raw(t: &'f sys::tovl_tensor) -> Tensor<'f> {
        Tensor {
            name: cstr_ref(t.name),
            dtype: cstr_ref(t.dtype),
            elem_size: t.elem_size,
            shape: slice(t.shape, t.ndim as usize),
            data: slice(t.data.cast::<u8>(), (t.count * t.elem_size as u64) as usize),
        }
    }

    /// The elements (product of the shape; 1 for a scalar).
    pub fn count(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The data as little-endian 16-bit values (bf16 / f16 bit patterns).
    pub fn to_u16(&self) -> Vec<u16> {
        self.data
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }

    /// The data as little-endian 32-bit signed values (I32).
    pub fn to_i32(&self) -> Vec<i32> {
        self.data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// The data as little-endian f32 values (F32).
    pub fn to_f32(&self) -> Vec<f32> {
        self.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

impl SafeTensors {
    /// Map `path` and validate its header (ranges, dtypes, no overlaps).
    pub fn open(path: impl AsRef<Path>) -> Result<SafeTensors> {
        let p = path_c("safetensors path", path.as_ref())?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a C string; raw receives the file.
        let code = unsafe { sys::tovl_safetensors_open(p.as_ptr(), &mut raw) };
        Ok(SafeTensors {
            raw: non_null(code, raw, "tovl_safetensors_open")?,
        })
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        // SAFETY: a live file.
        unsafe { sys::tovl_safetensors_count(self.raw.as_ptr()) }
    }

    /// Whether the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tensor at `index`, in order of data offsets.
    pub fn get(&self, index: usize) -> Option<Tensor<'_>> {
        // SAFETY: a live file; the result is NULL or lives as long as it.
        unsafe {
            sys::tovl_safetensors_at(self.raw.as_ptr(), index)
                .as_ref()
                .map(|t| Tensor::from_raw(t))
        }
    }

    /// The tensor called `name`.
    pub fn find(&self, name: &str) -> Option<Tensor<'_>> {
        let name = c_string("tensor name", name).ok()?;
        // SAFETY: as get.
        unsafe {
            sys::tovl_safetensors_find(self.raw.as_ptr(), name.as_ptr())
                .as_ref()
                .map(|t| Tensor::from_raw(t))
        }
    }

    /// Every tensor, in order of data offsets.
    pub fn tensors(&self) -> impl Iterator<Item = Tensor<'_>> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

/// A base model folder (config.json, model.safetensors or its index);
/// closed on drop.
#[derive(Debug)]
pub struct Model {
    raw: NonNull<sys::tovl_model>,
}

// SAFETY: read-only after open, no thread affinity (docs/API.md).
unsafe impl Send for Model {}
// SAFETY: its functions only read (the lm_head product runs the CPU kernels on
// caller-owned outputs).
unsafe impl Sync for Model {}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: closed once; rows borrow self.
        unsafe { sys::tovl_model_close(self.raw.as_ptr()) }
    }
}

/// What [`Model::info`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// The folder.
    pub dir: String,
    /// The served vocab: config vocab_size, or the padded vocab asked for.
    pub vocab: u32,
    /// config.json vocab_size.
    pub config_vocab: u32,
    /// config.json hidden_size.
    pub hidden: u32,
    /// The lm_head is the embedding.
    pub tied: bool,
    /// Tying inferred from lm_head.weight's absence (no tie_word_embeddings).
    pub tied_inferred: bool,
    /// The file holding model.embed_tokens.weight.
    pub embed_file: String,
    /// Its dtype in the file.
    pub embed_dtype: String,
    /// The file holding lm_head.weight (`None` when tied).
    pub lmhead_file: Option<String>,
    /// Its dtype (`None` when tied).
    pub lmhead_dtype: Option<String>,
}

impl Model {
    /// Open a model folder; `padded_vocab` 0 serves config vocab_size rows, a
    /// larger value is the engine's padded vocab (zero rows past vocab_size).
    pub fn open(dir: impl AsRef<Path>, padded_vocab: u32) -> Result<Model> {
        let d = path_c("model dir", dir.as_ref())?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a C string; raw receives the model.
        let code = unsafe { sys::tovl_model_open(d.as_ptr(), padded_vocab, &mut raw) };
        Ok(Model {
            raw: non_null(code, raw, "tovl_model_open")?,
        })
    }

    fn raw_info(&self) -> &sys::tovl_model_info {
        // SAFETY: a live model; the info lives as long as it.
        unsafe { &*sys::tovl_model_get_info(self.raw.as_ptr()) }
    }

    /// The model's sizes, tying and files.
    pub fn info(&self) -> ModelInfo {
        let i = self.raw_info();
        let opt = |p: *const std::os::raw::c_char| {
            // SAFETY: NULL or a string of the live model.
            (!p.is_null()).then(|| unsafe { cstr_lossy(p) })
        };
        // SAFETY: the strings belong to the live model.
        unsafe {
            ModelInfo {
                dir: cstr_lossy(i.dir),
                vocab: i.vocab,
                config_vocab: i.config_vocab,
                hidden: i.hidden,
                tied: i.tied,
                tied_inferred: i.tied_inferred,
                embed_file: cstr_lossy(i.embed_file),
                embed_dtype: cstr_lossy(i.embed_dtype),
                lmhead_file: opt(i.lmhead_file),
                lmhead_dtype: opt(i.lmhead_dtype),
            }
        }
    }

    /// The served vocab.
    pub fn vocab(&self) -> u32 {
        self.raw_info().vocab
    }

    /// The hidden size.
    pub fn hidden(&self) -> u32 {
        self.raw_info().hidden
    }

    /// Whether the lm_head is the embedding.
    pub fn tied(&self) -> bool {
        self.raw_info().tied
    }

    /// The base embedding row of `id` (bf16 `[hidden]`); `None` past the vocab.
    pub fn embed_row(&self, id: u32) -> Option<&[u16]> {
        // SAFETY: NULL or hidden values of the live model.
        let p = unsafe { sys::tovl_model_embed_row(self.raw.as_ptr(), id) };
        (!p.is_null()).then(|| unsafe { slice(p, self.hidden() as usize) })
    }

    /// The base lm_head row of `id` (the embedding row when tied).
    pub fn lmhead_row(&self, id: u32) -> Option<&[u16]> {
        // SAFETY: as embed_row.
        let p = unsafe { sys::tovl_model_lmhead_row(self.raw.as_ptr(), id) };
        (!p.is_null()).then(|| unsafe { slice(p, self.hidden() as usize) })
    }

    /// The base lm_head product on the host: `[tokens, vocab]` f32 logits of
    /// bf16 `hidden` `[tokens, hidden]`, in the spec's fixed dot order.
    pub fn lmhead_product(&self, hidden: &[u16], tokens: u32) -> Result<Vec<f32>> {
        let h = self.hidden() as usize;
        if hidden.len() != tokens as usize * h {
            return Err(Error::new(
                Status::ShapeMismatch,
                format!(
                    "lmhead_product: {} hidden values for {tokens} rows of {h}",
                    hidden.len()
                ),
            ));
        }
        let mut logits = vec![0f32; tokens as usize * self.vocab() as usize];
        // SAFETY: hidden holds tokens*h values, logits tokens*vocab.
        check(unsafe {
            sys::tovl_model_lmhead_product(self.raw.as_ptr(), hidden.as_ptr(), tokens, logits.as_mut_ptr())
        })?;
        Ok(logits)
    }
}

/// Where an adapter's overlay rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    /// PEFT trainable_tokens_delta: replacement rows for listed ids.
    TrainableTokens,
    /// PEFT modules_to_save: the module's full matrix.
    ModulesToSave,
    /// A saved (resized) base layer.
    SavedBase,
    /// vLLM new_embeddings.safetensors: rows for ids base_vocab + k.
    VllmExtraVocab,
}

/// The module a source patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    /// The input embedding (embed_tokens).
    Embed,
    /// The output projection (lm_head).
    LmHead,
}

/// One overlay tensor of an adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSource {
    /// What kind of tensor it is.
    pub kind: SourceKind,
    /// The module it patches.
    pub module: Module,
    /// The safetensors file.
    pub file: String,
    /// The tensor name.
    pub tensor: String,
    /// Its dtype.
    pub dtype: String,
    /// Its rows.
    pub rows: u32,
    /// Its row width.
    pub width: u32,
    /// Trainable tokens: the config's ids; else empty.
    pub ids: Vec<u32>,
    /// The adapter_config.json field that declared it, if any.
    pub config_field: Option<String>,
}

/// What [`Adapter::info`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterInfo {
    /// The folder.
    pub dir: String,
    /// The formats found ("peft trainable_token_indices", ..., joined with
    /// " + "; "none" when the adapter has no token overlay).
    pub format: String,
    /// adapter_config.json ensure_weight_tying.
    pub ensure_weight_tying: bool,
    /// The overlay tensors.
    pub sources: Vec<AdapterSource>,
    /// Tensors that are not token overlays (LoRA matrices, ...).
    pub other_tensors: usize,
}

/// A PEFT / vLLM adapter folder, parsed and validated; closed on drop.
#[derive(Debug)]
pub struct Adapter {
    raw: NonNull<sys::tovl_adapter>,
}

// SAFETY: read-only after open, no thread affinity (docs/API.md).
unsafe impl Send for Adapter {}
// SAFETY: its functions only read.
unsafe impl Sync for Adapter {}

impl Drop for Adapter {
    fn drop(&mut self) {
        // SAFETY: closed once; rows borrow self.
        unsafe { sys::tovl_adapter_close(self.raw.as_ptr()) }
    }
}

impl Adapter {
    /// Open an adapter folder (adapter_config.json with
    /// adapter_model.safetensors, and/or new_embeddings.safetensors).
    pub fn open(dir: impl AsRef<Path>) -> Result<Adapter> {
        let d = path_c("adapter dir", dir.as_ref())?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a C string; raw receives the adapter.
        let code = unsafe { sys::tovl_adapter_open(d.as_ptr(), &mut raw) };
        Ok(Adapter {
            raw: non_null(code, raw, "tovl_adapter_open")?,
        })
    }

    /// The formats and overlay tensors found.
    pub fn info(&self) -> AdapterInfo {
        // SAFETY: a live adapter; everything read belongs to it.
        unsafe {
            let i = &*sys::tovl_adapter_get_info(self.raw.as_ptr());
            let sources = slice(i.sources, i.source_count)
                .iter()
                .map(|s| AdapterSource {
                    kind: match s.kind {
                        sys::TOVL_SOURCE_TRAINABLE_TOKENS => SourceKind::TrainableTokens,
                        sys::TOVL_SOURCE_MODULES_TO_SAVE => SourceKind::ModulesToSave,
                        sys::TOVL_SOURCE_SAVED_BASE => SourceKind::SavedBase,
                        _ => SourceKind::VllmExtraVocab,
                    },
                    module: if s.module == sys::TOVL_MODULE_LMHEAD {
                        Module::LmHead
                    } else {
                        Module::Embed
                    },
                    file: cstr_lossy(s.file),
                    tensor: cstr_lossy(s.tensor),
                    dtype: cstr_lossy(s.dtype),
                    rows: s.rows,
                    width: s.width,
                    ids: slice(s.ids, s.rows as usize).to_vec(),
                    config_field: (!s.config_field.is_null()).then(|| cstr_lossy(s.config_field)),
                })
                .collect();
            AdapterInfo {
                dir: cstr_lossy(i.dir),
                format: cstr_lossy(i.format),
                ensure_weight_tying: i.ensure_weight_tying,
                sources,
                other_tensors: i.other_tensors,
            }
        }
    }

    /// This adapter's overlay rows for `model`: exactly what PEFT computes
    /// (tied rules included). Full matrices are compared with the base on
    /// `gpu` with rowdiff, keeping only the changed rows.
    pub fn resolve<'a>(
        &'a self,
        gpu: &dyn GpuBackend,
        kernels: &OverlayKernels,
        model: &'a Model,
    ) -> Result<AdapterRows<'a>> {
        let backend = gpu.backend();
        let k = kernels.checked(backend)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live objects; raw receives the rows.
        let code =
            unsafe { sys::tovl_adapter_resolve(backend.as_raw(), &k, self.raw.as_ptr(), model.raw.as_ptr(), &mut raw) };
        Ok(AdapterRows {
            raw: non_null(code, raw, "tovl_adapter_resolve")?,
            _from: PhantomData,
        })
    }

    /// [`resolve`](Self::resolve) then [`build_overlay`](crate::build_overlay).
    pub fn build_overlay<'b>(
        &self,
        gpu: &'b dyn GpuBackend,
        kernels: &OverlayKernels,
        model: &Model,
    ) -> Result<EmbedOverlay<'b>> {
        let backend = gpu.backend();
        let k = kernels.checked(backend)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live objects; raw receives the overlay.
        let code = unsafe {
            sys::tovl_adapter_build_overlay(backend.as_raw(), &k, self.raw.as_ptr(), model.raw.as_ptr(), &mut raw)
        };
        EmbedOverlay::from_out(code, raw, backend)
    }
}

/// An adapter resolved against a model: the host rows of its overlay
/// (borrowing the adapter and model it came from); freed on drop.
#[derive(Debug)]
pub struct AdapterRows<'a> {
    raw: NonNull<sys::tovl_adapter_rows>,
    _from: PhantomData<(&'a Adapter, &'a Model)>,
}

// SAFETY: host data, read-only after resolve.
unsafe impl Send for AdapterRows<'_> {}
// SAFETY: as Send.
unsafe impl Sync for AdapterRows<'_> {}

impl Drop for AdapterRows<'_> {
    fn drop(&mut self) {
        // SAFETY: freed once; descs borrow self.
        unsafe { sys::tovl_adapter_rows_free(self.raw.as_ptr()) }
    }
}

impl AdapterRows<'_> {
    fn info(&self) -> &sys::tovl_adapter_rows_info {
        // SAFETY: a live object; the info lives as long as it.
        unsafe { &*sys::tovl_adapter_rows_get_info(self.raw.as_ptr()) }
    }

    /// The overlay's description, ready for [`build_overlay`](crate::build_overlay):
    /// the model's vocab and hidden, increasing ids, the model's tying.
    pub fn desc(&self) -> OverlayDesc<'_> {
        let d = &self.info().desc;
        // SAFETY: every pointer of the desc points into self.
        unsafe {
            let rows = |r: &sys::tovl_overlay_rows| OverlayRows {
                tensor: cstr_ref(r.tensor),
                ids: slice(r.ids, r.count as usize),
                rows: slice(r.rows, r.count as usize * r.width as usize),
                width: r.width,
            };
            OverlayDesc {
                adapter: (!d.adapter.is_null()).then(|| cstr_ref(d.adapter)),
                vocab: d.vocab,
                hidden: d.hidden,
                embed: rows(&d.embed),
                lmhead: d.has_lmhead.then(|| rows(&d.lmhead)),
                tied: d.tied,
            }
        }
    }

    /// The ids whose lm_head cells this overlay patches: its own lm_head
    /// part, or under tying without one its embed ids.
    pub fn lmhead_ids(&self) -> &[u32] {
        let d = self.desc();
        match d.lmhead {
            Some(l) => l.ids,
            None if d.tied => d.embed.ids,
            None => &[],
        }
    }

    /// The tensors the embed rows came from ("" when none).
    pub fn embed_sources(&self) -> &str {
        // SAFETY: a string of self.
        unsafe { cstr_ref(self.info().embed_sources) }
    }

    /// The tensors the lm_head rows came from ("" when none).
    pub fn lmhead_sources(&self) -> &str {
        // SAFETY: a string of self.
        unsafe { cstr_ref(self.info().lmhead_sources) }
    }

    /// One line: how the lm_head part was decided.
    pub fn lmhead_rule(&self) -> &str {
        // SAFETY: a string of self.
        unsafe { cstr_ref(self.info().lmhead_rule) }
    }

    /// Warnings (e.g. rows beyond the served vocab, dropped).
    pub fn warnings(&self) -> Vec<&str> {
        let i = self.info();
        // SAFETY: warning_count strings of self.
        unsafe {
            slice(i.warnings, i.warning_count)
                .iter()
                .map(|&w| cstr_ref(w))
                .collect()
        }
    }

    /// Build the overlay on `gpu` (see [`build_overlay`](crate::build_overlay)).
    pub fn build_overlay<'b>(&self, gpu: &'b dyn GpuBackend, kernels: &OverlayKernels) -> Result<EmbedOverlay<'b>> {
        let backend = gpu.backend();
        let k = kernels.checked(backend)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the desc points into self, live during the call.
        let code = unsafe { sys::tovl_build_overlay(backend.as_raw(), &k, &self.info().desc, &mut raw) };
        EmbedOverlay::from_out(code, raw, backend)
    }
}
