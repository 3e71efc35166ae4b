//! The one error type: a status (grouped by cause, as the C library groups
//! its codes by hundreds) and the detail `tovl_last_error()` gave.
use std::ffi::CStr;
use std::fmt;

use tovl_sys as sys;

/// A failure's cause, one per `TOVL_ERR_*` code of `tovl.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// A NULL pointer, zero size or bad enum value (`TOVL_ERR_INVALID_ARGUMENT`).
    InvalidArgument,
    /// A token id appears twice in one overlay part (`TOVL_ERR_DUPLICATE_ID`).
    DuplicateId,
    /// A token id is not below the vocab (`TOVL_ERR_ID_OUT_OF_RANGE`).
    IdOutOfRange,
    /// A row width or tensor shape disagrees (`TOVL_ERR_SHAPE_MISMATCH`).
    ShapeMismatch,
    /// Overlays built for different vocab sizes (`TOVL_ERR_VOCAB_MISMATCH`).
    VocabMismatch,
    /// An overlay has more rows than a fixed-shape set's slot may hold (`TOVL_ERR_CAPACITY`).
    Capacity,
    /// A backend's runtime or device is missing (`TOVL_ERR_BACKEND_UNAVAILABLE`).
    BackendUnavailable,
    /// A kernel the operation needs resolved to handle 0 (`TOVL_ERR_KERNEL_MISSING`).
    KernelMissing,
    /// The backend cannot do this (`TOVL_ERR_UNSUPPORTED`).
    Unsupported,
    /// No backend of that name exists in tovl (`TOVL_ERR_UNKNOWN_BACKEND`).
    UnknownBackend,
    /// A host or device allocation failed (`TOVL_ERR_OUT_OF_MEMORY`).
    OutOfMemory,
    /// A driver call failed (`TOVL_ERR_DEVICE`).
    Device,
    /// A kernel launch failed (`TOVL_ERR_LAUNCH`).
    Launch,
    /// A file could not be opened, read or written (`TOVL_ERR_IO`).
    Io,
    /// A file is malformed (`TOVL_ERR_FORMAT`).
    Format,
    /// A bug in tovl (`TOVL_ERR_INTERNAL`), or a code this crate does not know.
    Internal,
}

/// The groups of `tovl.h`'s status codes (their hundreds digit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorGroup {
    /// 1xx: the caller passed something wrong.
    Caller,
    /// 2xx: the environment lacks something (a runtime, a device, a kernel).
    Environment,
    /// 3xx: the device or its driver failed.
    Device,
    /// 4xx: files and formats (adapter and model import).
    File,
    /// 9xx: a bug in tovl itself.
    Internal,
}

impl Status {
    /// The status of a C code; unknown codes map to `Internal`.
    pub fn from_code(code: u32) -> Status {
        match code {
            sys::TOVL_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::TOVL_ERR_DUPLICATE_ID => Status::DuplicateId,
            sys::TOVL_ERR_ID_OUT_OF_RANGE => Status::IdOutOfRange,
            sys::TOVL_ERR_SHAPE_MISMATCH => Status::ShapeMismatch,
            sys::TOVL_ERR_VOCAB_MISMATCH => Status::VocabMismatch,
            sys::TOVL_ERR_CAPACITY => Status::Capacity,
            sys::TOVL_ERR_BACKEND_UNAVAILABLE => Status::BackendUnavailable,
            sys::TOVL_ERR_KERNEL_MISSING => Status::KernelMissing,
            sys::TOVL_ERR_UNSUPPORTED => Status::Unsupported,
            sys::TOVL_ERR_UNKNOWN_BACKEND => Status::UnknownBackend,
            sys::TOVL_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::TOVL_ERR_DEVICE => Status::Device,
            sys::TOVL_ERR_LAUNCH => Status::Launch,
            sys::TOVL_ERR_IO => Status::Io,
            sys::TOVL_ERR_FORMAT => Status::Format,
            _ => Status::Internal,
        }
    }

    /// The C code (`TOVL_ERR_*`).
    pub fn code(self) -> u32 {
        match self {
            Status::InvalidArgument => sys::TOVL_ERR_INVALID_ARGUMENT,
            Status::DuplicateId => sys::TOVL_ERR_DUPLICATE_ID,
            Status::IdOutOfRange => sys::TOVL_ERR_ID_OUT_OF_RANGE,
            Status::ShapeMismatch => sys::TOVL_ERR_SHAPE_MISMATCH,
            Status::VocabMismatch => sys::TOVL_ERR_VOCAB_MISMATCH,
            Status::Capacity => sys::TOVL_ERR_CAPACITY,
            Status::BackendUnavailable => sys::TOVL_ERR_BACKEND_UNAVAILABLE,
            Status::KernelMissing => sys::TOVL_ERR_KERNEL_MISSING,
            Status::Unsupported => sys::TOVL_ERR_UNSUPPORTED,
            Status::UnknownBackend => sys::TOVL_ERR_UNKNOWN_BACKEND,
            Status::OutOfMemory => sys::TOVL_ERR_OUT_OF_MEMORY,
            Status::Device => sys::TOVL_ERR_DEVICE,
            Status::Launch => sys::TOVL_ERR_LAUNCH,
            Status::Io => sys::TOVL_ERR_IO,
            Status::Format => sys::TOVL_ERR_FORMAT,
            Status::Internal => sys::TOVL_ERR_INTERNAL,
        }
    }

    /// The group of this status.
    pub fn group(self) -> ErrorGroup {
        match self.code() / 100 {
            1 => ErrorGroup::Caller,
            2 => ErrorGroup::Environment,
            3 => ErrorGroup::Device,
            4 => ErrorGroup::File,
            _ => ErrorGroup::Internal,
        }
    }

    /// The C library's fixed name ("TOVL_ERR_DUPLICATE_ID: duplicate token id").
    pub fn name(self) -> String {
        // SAFETY: tovl_status_str returns a static NUL-terminated string.
        unsafe { cstr_lossy(sys::tovl_status_str(self.code())) }
    }
}

/// A tovl failure: the status and the detail naming the bad input (which
/// tensor, id, slot, kernel or driver call), captured from
/// `tovl_last_error()` on the failing thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    code: u32,
    detail: String,
}

impl Error {
    /// An error of `status` with `detail`, for failures found on the Rust side
    /// before any C call (a slice of the wrong length, a name with a NUL).
    pub(crate) fn new(status: Status, detail: impl Into<String>) -> Error {
        Error {
            status,
            code: status.code(),
            detail: detail.into(),
        }
    }

    /// The error of a failed C call, with this thread's `tovl_last_error()`.
    pub(crate) fn last(code: sys::tovl_status) -> Error {
        // SAFETY: tovl_last_error never returns NULL; the text is per thread
        // and copied before any other call.
        let detail = unsafe { cstr_lossy(sys::tovl_last_error()) };
        Error {
            status: Status::from_code(code),
            code,
            detail,
        }
    }

    /// The status (`Status::Internal` for a code this crate does not know; see `code`).
    pub fn status(&self) -> Status {
        self.status
    }

    /// The C status code as returned (`TOVL_ERR_*`).
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The status's group: the caller, the environment, the device, files, tovl.
    pub fn group(&self) -> ErrorGroup {
        self.status.group()
    }

    /// The one-line detail.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.detail)
    }
}

impl std::error::Error for Error {}

/// `Result` with tovl's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// `Ok` for `TOVL_OK`, else the error with this thread's detail.
pub(crate) fn check(code: sys::tovl_status) -> Result<()> {
    if code == sys::TOVL_OK {
        Ok(())
    } else {
        Err(Error::last(code))
    }
}

/// A C string as an owned Rust string ("" for NULL).
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
pub(crate) unsafe fn cstr_lossy(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// A C string borrowed as `&str` ("" for NULL or text that is not UTF-8).
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn cstr_ref<'a>(p: *const std::os::raw::c_char) -> &'a str {
    if p.is_null() {
        ""
    } else {
        CStr::from_ptr(p).to_str().unwrap_or("")
    }
}

/// `s` as a C string; a NUL inside is an `InvalidArgument` naming `what`.
pub(crate) fn c_string(what: &str, s: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s)
        .map_err(|_| Error::new(Status::InvalidArgument, format!("{what} {s:?} contains a NUL byte")))
}
