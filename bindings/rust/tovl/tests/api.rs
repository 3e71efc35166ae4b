//! The safe API itself: the seeds' names and shapes, the error type, the
//! error paths (a missing kernel gives handles of 0, build_overlay refuses an
//! adapter with overlay tensors then), RAII, and the thread markers.
mod common;

use common::conform::Rng;
use common::{desc, random_rows, Rows};
use tovl::{
    build_overlay, rowdiff, Backend, DevicePtr, EmbedHookArgs, EmbedOverlay, ErrorGroup, GpuBackend, KernelHandle,
    LmHeadHookArgs, LogitsDtype, Model, OverlayKernels, Slots, Status, Stream, TokenOverlaySet,
};

/// An engine's GPU object whose device lacks some kernels: try_kernel answers
/// 0 for the names in `missing`, as a backend without them would.
struct PartialGpu {
    inner: Backend,
    missing: &'static [&'static str],
}

impl GpuBackend for PartialGpu {
    fn backend(&self) -> &Backend {
        &self.inner
    }
    fn try_kernel(&self, name: &str) -> KernelHandle {
        if self.missing.contains(&name) {
            KernelHandle(0)
        } else {
            self.inner.try_kernel(name)
        }
    }
}

fn cpu() -> Backend {
    Backend::open("cpu").expect("the CPU backend always opens")
}

#[test]
fn overlay_kernels_default_is_all_zero_and_copy() {
    let k = OverlayKernels::default();
    for h in [k.rowdiff, k.embed_overlay, k.lmhead_overlay_bf16, k.lmhead_overlay_f32] {
        assert_eq!(h, KernelHandle(0));
        assert!(!h.is_present());
    }
    let be = cpu();
    let resolved = OverlayKernels::new(&be);
    let copy = resolved; // Copy
    let cloned = Clone::clone(&resolved);
    assert_eq!(copy, cloned);
    for h in [
        copy.rowdiff,
        copy.embed_overlay,
        copy.lmhead_overlay_bf16,
        copy.lmhead_overlay_f32,
    ] {
        assert!(h.is_present(), "the CPU backend has every kernel: {copy:?}");
    }
    assert_eq!(be.try_kernel("no_such_kernel"), KernelHandle(0));
}

#[test]
fn backends_list_and_open() {
    let list = Backend::list();
    let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["cuda", "hip", "vulkan", "cpu"]);
    let cpu_info = list.iter().find(|i| i.name == "cpu").unwrap();
    assert!(cpu_info.compiled && cpu_info.available && cpu_info.reason.is_empty());
    for i in list.iter().filter(|i| !i.available) {
        assert!(!i.reason.is_empty(), "{} unavailable without a reason", i.name);
    }
    let be = cpu();
    assert_eq!(be.name(), "cpu");
    assert!(!be.device().is_empty());
    assert!(be.property("f32_denormals").is_some());
    assert_eq!(be.property("no such key"), None);
    assert!(tovl::version().starts_with("0.1"));
}

#[test]
fn errors_carry_status_group_and_detail() {
    let e = Backend::open("warp-drive").expect_err("no such backend");
    assert_eq!(e.status(), Status::UnknownBackend);
    assert_eq!(e.code(), 203);
    assert_eq!(e.group(), ErrorGroup::Environment);
    assert!(
        e.detail().contains("warp-drive"),
        "detail names the input: {:?}",
        e.detail()
    );
    let shown = e.to_string();
    assert!(shown.starts_with("TOVL_ERR_UNKNOWN_BACKEND"), "{shown}");
    let e = Backend::open("c\0pu").expect_err("a NUL in a name");
    assert_eq!((e.status(), e.group()), (Status::InvalidArgument, ErrorGroup::Caller));
    let e = Model::open("/nonexistent/model", 0).expect_err("no folder");
    assert_eq!(e.group(), ErrorGroup::File);
    assert!(e.detail().contains("/nonexistent/model"), "{:?}", e.detail());
    for code in [
        100, 101, 102, 103, 104, 105, 200, 201, 202, 203, 300, 301, 302, 400, 401, 900,
    ] {
        assert_eq!(Status::from_code(code).code(), code);
    }
    assert_eq!(Status::from_code(12345), Status::Internal);
}

#[test]
fn from_slots_keeps_overlays_and_answers_the_tables() {
    let seed = common::seed("from_slots");
    let mut r = Rng::new(seed);
    let be = cpu();
    let k = OverlayKernels::new(&be);
    let (vocab, h) = (500, 64);
    let e0 = random_rows(&mut r, vocab, 7, h);
    let l0 = random_rows(&mut r, vocab, 11, h);
    let e2 = random_rows(&mut r, vocab, 3, h);
    let ov0 = build_overlay(&be, &k, &desc(vocab, h, &e0, Some(&l0), false)).unwrap();
    let ov2 = desc(vocab, h, &e2, None, true).build(&be, &k).unwrap();
    let v = ov0.view();
    assert_eq!(
        (v.vocab, v.hidden, v.embed_count, v.lmhead_count, v.has_lmhead),
        (vocab, h, 7, 11, true)
    );
    assert!(!v.slot_map.is_null() && !v.embed_rows.is_null());
    // The set holds its own references: the caller's may go first.
    let set = TokenOverlaySet::from_slots(&be, vec![Some(ov0), None, Some(ov2)], 4, true).unwrap();
    assert!(set.any_active());
    assert_eq!(set.overlays().len(), 3);
    assert_eq!((set.vocab(), set.hidden(), set.max_loras()), (vocab, h, 4));
    assert_eq!(set.max_n_override(), 11, "slot 0's own 11 rows beat slot 2's tied 3");
    assert_eq!(set.shard_range(), 0..vocab);
    for t in [
        set.embed_slot_map_table(),
        set.embed_rows_table(),
        set.embed_n_table(),
        set.lmhead_rows_table(),
        set.lmhead_ids_table(),
        set.n_override_table(),
    ] {
        assert!(!t.is_null());
    }
    // The tables point into the overlays: slot 0's slot_map pointer is its view's.
    let mut host = [0u64; 4];
    // SAFETY: a CPU-backend device pointer is a host address, and the table holds max_loras u64s.
    unsafe { std::ptr::copy_nonoverlapping(set.embed_slot_map_table().0 as *const u64, host.as_mut_ptr(), 4) };
    assert_eq!(host[0], set.overlays()[0].as_ref().unwrap().view().slot_map.0);
    assert_eq!((host[1], host[3]), (0, 0));

    let empty = TokenOverlaySet::from_slots(&be, vec![], 2, false).unwrap();
    assert!(!empty.any_active());
    assert_eq!(empty.vocab(), 0);
}

#[test]
fn from_slots_errors() {
    let mut r = Rng::new(common::seed("from_slots errors"));
    let be = cpu();
    let k = OverlayKernels::new(&be);
    let a = random_rows(&mut r, 300, 4, 32);
    let b = random_rows(&mut r, 301, 4, 32);
    let ova = build_overlay(&be, &k, &desc(300, 32, &a, None, false)).unwrap();
    let ovb = build_overlay(&be, &k, &desc(301, 32, &b, None, false)).unwrap();
    let e = TokenOverlaySet::from_slots(&be, vec![Some(ova.clone()), Some(ovb)], 2, false).expect_err("vocabs differ");
    assert_eq!(e.status(), Status::VocabMismatch);
    assert!(e.detail().contains("slot"), "names the slots: {:?}", e.detail());
    let e = TokenOverlaySet::from_slots(&be, vec![Some(ova.clone()), None, None], 2, false).expect_err("3 for 2");
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = TokenOverlaySet::from_slots(&be, vec![], 0, false).expect_err("no slots");
    assert_eq!(e.status(), Status::InvalidArgument);
    // An overlay of another backend is refused, not read through foreign pointers.
    let other = cpu();
    let e = TokenOverlaySet::from_slots(&other, vec![Some(ova)], 1, false).expect_err("foreign overlay");
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.detail().contains("slot 0"), "{:?}", e.detail());
}

#[test]
fn build_overlay_validates_rows() {
    let be = cpu();
    let k = OverlayKernels::new(&be);
    let dup = Rows {
        ids: vec![5, 9, 5],
        rows: vec![0x3F80; 3 * 8],
    };
    let e = build_overlay(&be, &k, &desc(100, 8, &dup, None, false)).expect_err("duplicate id");
    assert_eq!(e.status(), Status::DuplicateId);
    assert!(
        e.detail().contains("embed") && e.detail().contains('5'),
        "{:?}",
        e.detail()
    );
    let far = Rows {
        ids: vec![100],
        rows: vec![0x3F80; 8],
    };
    let e = build_overlay(&be, &k, &desc(100, 8, &far, None, false)).expect_err("id >= vocab");
    assert_eq!(e.status(), Status::IdOutOfRange);
    let short = Rows {
        ids: vec![1, 2],
        rows: vec![0x3F80; 15],
    };
    let e = build_overlay(&be, &k, &desc(100, 8, &short, None, false)).expect_err("rows too short");
    assert_eq!(e.status(), Status::ShapeMismatch);
    assert!(e.detail().contains("'embed'"), "{:?}", e.detail());
}

/// The seeds: a missing kernel gives KernelHandle(0); the hooks then return
/// without a launch, and build_overlay refuses an adapter that ships overlay
/// tensors (and still builds one that has none).
#[test]
fn a_missing_kernel_gives_zero_handles_and_refuses_overlay_tensors() {
    let gpu = PartialGpu {
        inner: cpu(),
        missing: &[
            tovl::KERNEL_EMBED_OVERLAY,
            tovl::KERNEL_LMHEAD_OVERLAY_BF16,
            tovl::KERNEL_LMHEAD_OVERLAY_F32,
        ],
    };
    let k = OverlayKernels::new(&gpu);
    assert_eq!(k.embed_overlay, KernelHandle(0));
    assert_eq!(k.lmhead_overlay_bf16, KernelHandle(0));
    assert_eq!(k.lmhead_overlay_f32, KernelHandle(0));
    assert!(k.rowdiff.is_present());

    let mut r = Rng::new(common::seed("missing kernels"));
    let rows = random_rows(&mut r, 200, 4, 16);
    let e = build_overlay(&gpu, &k, &desc(200, 16, &rows, None, false)).expect_err("embed rows need embed_overlay");
    assert_eq!(
        (e.status(), e.group()),
        (Status::KernelMissing, ErrorGroup::Environment)
    );
    assert!(e.detail().contains("embed_overlay"), "{:?}", e.detail());
    let none = Rows {
        ids: vec![],
        rows: vec![],
    };
    let e = build_overlay(&gpu, &k, &desc(200, 16, &none, Some(&rows), false)).expect_err("lm_head rows");
    assert_eq!(e.status(), Status::KernelMissing);
    assert!(e.detail().contains("lmhead_overlay"), "{:?}", e.detail());

    // A PEFT adapter with overlay tensors, through the import: refused the same way.
    let fx = common::repo_root().join("tests/fixtures/peft_extra");
    let model = Model::open(fx.join("bases/untied"), 0).unwrap();
    let adapter = tovl::Adapter::open(fx.join("tt_dict_both_untied/adapter")).unwrap();
    let e = adapter
        .build_overlay(&gpu, &k, &model)
        .expect_err("overlay tensors, no kernels");
    assert_eq!(e.status(), Status::KernelMissing);

    // No overlay tensors: builds; the hooks with zero handles launch nothing.
    let ov = build_overlay(&gpu, &k, &desc(200, 16, &none, None, false)).unwrap();
    let full = OverlayKernels::new(gpu.backend());
    let rows_ov = build_overlay(gpu.backend(), &full, &desc(200, 16, &rows, Some(&rows), false)).unwrap();
    let set = TokenOverlaySet::from_slots(&gpu, vec![Some(rows_ov), Some(ov)], 2, false).unwrap();
    let be = gpu.backend();
    let hidden: Vec<u16> = (0..16 * 4).map(|_| r.bf16()).collect();
    let ids: Vec<u32> = rows.ids.iter().copied().take(4).collect();
    let d_hidden = be.alloc(hidden.len() * 2).unwrap();
    d_hidden.upload(0, &hidden).unwrap();
    let d_ids = be.alloc(16).unwrap();
    d_ids.upload(0, &ids).unwrap();
    let d_logits = be.alloc(4 * 200 * 4).unwrap();
    d_logits.fill_u32(0, 0x7FA1_7FA1, 4 * 200 * 4).unwrap();
    let ea = EmbedHookArgs {
        hidden: d_hidden.ptr(),
        token_ids: d_ids.ptr(),
        slots: Slots::All(0),
        tokens: 4,
        hidden_size: 16,
    };
    let la = LmHeadHookArgs {
        logits: d_logits.ptr(),
        dtype: LogitsDtype::F32,
        ld: 200,
        hidden: d_hidden.ptr(),
        slots: Slots::All(0),
        tokens: 4,
        hidden_size: 16,
    };
    // SAFETY: the buffers are the backend's, of the sizes the args say.
    unsafe {
        set.embed_hook(&k, &ea, Stream::BACKEND).unwrap();
        set.lmhead_hook(&k, &la, Stream::BACKEND).unwrap();
    }
    be.synchronize(Stream::BACKEND).unwrap();
    let mut after = vec![0u16; hidden.len()];
    d_hidden.download(0, &mut after).unwrap();
    assert_eq!(after, hidden, "a zero embed handle launches nothing");
    let mut logits = vec![0u32; 800];
    d_logits.download(0, &mut logits).unwrap();
    assert!(
        logits.iter().all(|&w| w == 0x7FA1_7FA1),
        "a zero lm_head handle launches nothing"
    );
    // With the kernels the same call patches (the test above is not vacuous).
    // SAFETY: as above.
    unsafe { set.embed_hook(&full, &ea, Stream::BACKEND).unwrap() };
    d_hidden.download(0, &mut after).unwrap();
    assert_ne!(after, hidden);
}

#[test]
fn foreign_or_forged_kernel_handles_are_refused() {
    let be = cpu();
    let mut k = OverlayKernels::new(&be);
    k.embed_overlay = k.lmhead_overlay_f32; // the wrong kernel for the embed hook
    let rows = Rows {
        ids: vec![3],
        rows: vec![0x3F80; 8],
    };
    let e = build_overlay(&be, &k, &desc(10, 8, &rows, None, false)).expect_err("forged handle");
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.detail().contains("embed_overlay"), "{:?}", e.detail());
}

#[test]
fn device_buffers_check_their_bounds_and_rowdiff_runs() {
    let mut r = Rng::new(common::seed("buffers"));
    let be = cpu();
    let k = OverlayKernels::new(&be);
    let buf = be.alloc(64).unwrap();
    assert_eq!(buf.len(), 64);
    assert_eq!(
        buf.upload(60, &[1u32, 2]).unwrap_err().status(),
        Status::InvalidArgument
    );
    assert_eq!(
        buf.download(usize::MAX, &mut [0u8; 2]).unwrap_err().status(),
        Status::InvalidArgument
    );
    assert_eq!(buf.fill_u32(2, 0, 8).unwrap_err().status(), Status::InvalidArgument);
    let (rows, h) = (40u32, 24u32);
    let a: Vec<u16> = (0..rows * h).map(|_| r.bf16()).collect();
    let mut b = a.clone();
    let changed = [3u32, 17, 39];
    for &row in &changed {
        b[(row * h + r.below(h)) as usize] ^= 1;
    }
    let (da, db) = (be.alloc(a.len() * 2).unwrap(), be.alloc(b.len() * 2).unwrap());
    da.upload(0, &a).unwrap();
    db.upload(0, &b).unwrap();
    assert_eq!(rowdiff(&be, &k, &da, &db, rows, h, 0.0).unwrap(), changed);
    assert_eq!(
        rowdiff(&be, &k, &da, &db, rows + 1, h, 0.0).unwrap_err().status(),
        Status::ShapeMismatch
    );
    let no_rowdiff = OverlayKernels {
        rowdiff: KernelHandle(0),
        ..k
    };
    assert_eq!(
        rowdiff(&be, &no_rowdiff, &da, &db, rows, h, 0.0).unwrap_err().status(),
        Status::KernelMissing
    );
    assert_eq!(DevicePtr(8).offset(8), DevicePtr(16));
}

#[test]
fn shards_and_bf16() {
    assert_eq!(tovl::vocab_shard_range(1000, 4, 1, 0).unwrap(), 256..512);
    assert_eq!(
        tovl::vocab_shard_range(1000, 4, 4, 0).unwrap_err().status(),
        Status::InvalidArgument
    );
    assert_eq!(tovl::f32_to_bf16(1.0), 0x3F80);
    assert_eq!(tovl::f32_to_bf16(f32::NAN), 0x7FC0);
    assert_eq!(tovl::bf16_to_f32(0xC000), -2.0);
}

#[test]
fn thread_markers_follow_the_c_rules() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Backend>(); // a backend may move to another thread ...
    send_sync::<tovl::Model>(); // import objects belong to no backend
    send_sync::<tovl::Adapter>();
    send_sync::<tovl::SafeTensors>();
    send_sync::<tovl::Error>();
    // ... and Backend is not Sync, so `&Backend` -- and every overlay, set
    // and buffer borrowing it -- stays on its thread (checked by the compiler;
    // a doc test below would not build otherwise).
    let be = cpu();
    let moved = std::thread::spawn(move || be.name()).join().unwrap();
    assert_eq!(moved, "cpu");
    let _ = std::marker::PhantomData::<EmbedOverlay<'static>>;
}

#[test]
fn engine_device_wrappers_refuse_missing_handles() {
    let null = std::ptr::null_mut();
    // SAFETY: NULL handles are refused before any is used.
    let e = unsafe { Backend::cuda_wrap(null) }.expect_err("no context");
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.detail().contains("cu_context"), "{:?}", e.detail());
    let desc = tovl::VulkanDevice {
        instance: null,
        physical_device: null,
        device: null,
        queue_family: 0,
        queue_index: 0,
        get_instance_proc_addr: None,
    };
    // SAFETY: as above.
    let e = unsafe { Backend::vulkan_wrap(&desc) }.expect_err("no device");
    assert_eq!(e.status(), Status::InvalidArgument);
    // Built with HIP: a negative index is refused; built without: unavailable, said at run time.
    let e = Backend::hip_open_device(-1).expect_err("no device -1");
    assert!(
        matches!(e.status(), Status::InvalidArgument | Status::BackendUnavailable),
        "{e}"
    );
    assert!(Backend::cuda_open_image(&[], Some("empty")).is_err());
}
