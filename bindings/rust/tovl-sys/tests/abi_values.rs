//! The enum values and constants of the C ABI, as the headers document them.
//! The generated layout tests (in src/bindings.rs) cover struct sizes,
//! alignments and field offsets; these cover the numbers an engine may have
//! stored or logged (status codes, dtype and source enums, kernel names).
use tovl_sys::*;

#[test]
fn status_codes() {
    let expected: &[(tovl_status, u32)] = &[
        (TOVL_OK, 0),
        (TOVL_ERR_INVALID_ARGUMENT, 100),
        (TOVL_ERR_DUPLICATE_ID, 101),
        (TOVL_ERR_ID_OUT_OF_RANGE, 102),
        (TOVL_ERR_SHAPE_MISMATCH, 103),
        (TOVL_ERR_VOCAB_MISMATCH, 104),
        (TOVL_ERR_CAPACITY, 105),
        (TOVL_ERR_BACKEND_UNAVAILABLE, 200),
        (TOVL_ERR_KERNEL_MISSING, 201),
        (TOVL_ERR_UNSUPPORTED, 202),
        (TOVL_ERR_UNKNOWN_BACKEND, 203),
        (TOVL_ERR_OUT_OF_MEMORY, 300),
        (TOVL_ERR_DEVICE, 301),
        (TOVL_ERR_LAUNCH, 302),
        (TOVL_ERR_IO, 400),
        (TOVL_ERR_FORMAT, 401),
        (TOVL_ERR_INTERNAL, 900),
    ];
    for &(got, want) in expected {
        assert_eq!(got, want);
    }
    assert_eq!(std::mem::size_of::<tovl_status>(), 4);
}

#[test]
fn other_enums() {
    assert_eq!(TOVL_LOGITS_BF16, 0);
    assert_eq!(TOVL_LOGITS_F32, 1);
    assert_eq!(TOVL_SOURCE_TRAINABLE_TOKENS, 0);
    assert_eq!(TOVL_SOURCE_MODULES_TO_SAVE, 1);
    assert_eq!(TOVL_SOURCE_SAVED_BASE, 2);
    assert_eq!(TOVL_SOURCE_VLLM_EXTRA_VOCAB, 3);
    assert_eq!(TOVL_MODULE_EMBED, 0);
    assert_eq!(TOVL_MODULE_LMHEAD, 1);
    assert_eq!(std::mem::size_of::<tovl_logits_dtype>(), 4);
}

#[test]
fn constants() {
    assert_eq!(TOVL_KERNEL_ROWDIFF, b"rowdiff\0");
    assert_eq!(TOVL_KERNEL_EMBED_OVERLAY, b"embed_overlay\0");
    assert_eq!(TOVL_KERNEL_LMHEAD_OVERLAY_BF16, b"lmhead_overlay_bf16\0");
    assert_eq!(TOVL_KERNEL_LMHEAD_OVERLAY_F32, b"lmhead_overlay_f32\0");
    assert_eq!(TOVL_DOT_LANES, 256);
    assert_eq!(TOVL_VOCAB_PAD_DEFAULT, 64);
    assert_eq!(TOVL_BACKEND_IFACE_VERSION, 2);
    assert_eq!(std::mem::size_of::<tovl_devptr>(), 8);
    assert_eq!(std::mem::size_of::<tovl_kernel>(), 8);
    assert_eq!(std::mem::size_of::<tovl_fence>(), 8);
}

/// The structs of the fixed-shape sets and of interface version 2 at the
/// offsets the headers document, stated here by hand: the generated layout
/// tests follow whatever clang saw, these fail when a header moves a field.
#[test]
fn fixed_shape_layouts() {
    use std::mem::{align_of, offset_of, size_of};
    assert_eq!((size_of::<tovl_set_shape>(), align_of::<tovl_set_shape>()), (24, 4));
    assert_eq!(
        [
            offset_of!(tovl_set_shape, max_loras),
            offset_of!(tovl_set_shape, vocab),
            offset_of!(tovl_set_shape, hidden),
            offset_of!(tovl_set_shape, tied),
            offset_of!(tovl_set_shape, embed_capacity),
            offset_of!(tovl_set_shape, lmhead_capacity),
        ],
        [0, 4, 8, 12, 16, 20]
    );
    assert_eq!(
        (size_of::<tovl_device_write>(), align_of::<tovl_device_write>()),
        (24, 8)
    );
    assert_eq!(
        [
            offset_of!(tovl_device_write, dst),
            offset_of!(tovl_device_write, src),
            offset_of!(tovl_device_write, bytes),
        ],
        [0, 8, 16]
    );
    // Version 2 appends four members to the version 1 table (120 bytes).
    assert_eq!(size_of::<tovl_backend_iface>(), 152);
    assert_eq!(
        [
            offset_of!(tovl_backend_iface, write_async),
            offset_of!(tovl_backend_iface, fence_record),
            offset_of!(tovl_backend_iface, fence_query),
            offset_of!(tovl_backend_iface, fence_destroy),
        ],
        [120, 128, 136, 144]
    );
}

#[test]
fn the_linked_library_is_this_version() {
    // The header's version and the loaded library's must agree.
    let v = unsafe { std::ffi::CStr::from_ptr(tovl_version()) };
    let want = format!("{TOVL_VERSION_MAJOR}.{TOVL_VERSION_MINOR}.{TOVL_VERSION_PATCH}");
    assert!(
        v.to_str().unwrap().starts_with(&want),
        "libtovl says {v:?}, the header {want}"
    );
}
