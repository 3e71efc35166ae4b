//! Backends (the seeds' `GpuBackend`), kernel handles, device memory.
use std::ffi::c_void;
use std::marker::PhantomData;
use std::os::raw::c_char;
use std::ptr::NonNull;

use tovl_sys as sys;

use crate::error::{c_string, check, cstr_lossy, Error, Result, Status};

/// A 64-bit device address: a CUDA/HIP device pointer, a `VkDeviceAddress`,
/// or a host address on the CPU backend. `DevicePtr(0)` is none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// No device memory.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// Whether this is `DevicePtr::NULL`.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` past this one.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

/// A kernel handle from [`GpuBackend::try_kernel`]; `KernelHandle(0)` means
/// the backend does not have that kernel. (No `Default`: a handle is always
/// looked up, see [`OverlayKernels::default`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct KernelHandle(pub u64);

impl KernelHandle {
    /// Whether the kernel exists (the handle is not 0).
    pub fn is_present(self) -> bool {
        self.0 != 0
    }
}

/// The four token-overlay kernels, resolved once with `try_kernel`. A missing
/// kernel is `KernelHandle(0)`: the hooks then return without a launch, and
/// [`build_overlay`](crate::build_overlay) refuses an adapter that ships
/// overlay tensors needing it.
///
/// Every call that takes an `OverlayKernels` checks each non-zero handle is
/// the backend's own, so a hand-made or foreign handle is an error, never a
/// launch of the wrong kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverlayKernels {
    /// `rowdiff`: which rows of two matrices differ.
    pub rowdiff: KernelHandle,
    /// `embed_overlay`: the embed hook's kernel.
    pub embed_overlay: KernelHandle,
    /// `lmhead_overlay_bf16`: the lm_head hook's kernel for bf16 logits.
    pub lmhead_overlay_bf16: KernelHandle,
    /// `lmhead_overlay_f32`: the lm_head hook's kernel for f32 logits.
    pub lmhead_overlay_f32: KernelHandle,
}

impl Default for OverlayKernels {
    /// All handles zero, as if no overlay kernel were loaded.
    fn default() -> Self {
        OverlayKernels {
            rowdiff: KernelHandle(0),
            embed_overlay: KernelHandle(0),
            lmhead_overlay_bf16: KernelHandle(0),
            lmhead_overlay_f32: KernelHandle(0),
        }
    }
}

impl OverlayKernels {
    /// Resolve the four kernels on `gpu` by their spec names.
    pub fn new(gpu: &dyn GpuBackend) -> Self {
        OverlayKernels {
            rowdiff: gpu.try_kernel(KERNEL_ROWDIFF),
            embed_overlay: gpu.try_kernel(KERNEL_EMBED_OVERLAY),
            lmhead_overlay_bf16: gpu.try_kernel(KERNEL_LMHEAD_OVERLAY_BF16),
            lmhead_overlay_f32: gpu.try_kernel(KERNEL_LMHEAD_OVERLAY_F32),
        }
    }

    fn from_raw(k: sys::tovl_overlay_kernels) -> Self {
        OverlayKernels {
            rowdiff: KernelHandle(k.rowdiff),
            embed_overlay: KernelHandle(k.embed_overlay),
            lmhead_overlay_bf16: KernelHandle(k.lmhead_overlay_bf16),
            lmhead_overlay_f32: KernelHandle(k.lmhead_overlay_f32),
        }
    }

    /// The C struct, after checking every non-zero handle is `backend`'s own.
    pub(crate) fn checked(&self, backend: &Backend) -> Result<sys::tovl_overlay_kernels> {
        let own = backend.kernels;
        let pairs = [
            (KERNEL_ROWDIFF, self.rowdiff, own.rowdiff),
            (KERNEL_EMBED_OVERLAY, self.embed_overlay, own.embed_overlay),
            (
                KERNEL_LMHEAD_OVERLAY_BF16,
                self.lmhead_overlay_bf16,
                own.lmhead_overlay_bf16,
            ),
            (
                KERNEL_LMHEAD_OVERLAY_F32,
                self.lmhead_overlay_f32,
                own.lmhead_overlay_f32,
            ),
        ];
        for (name, given, theirs) in pairs {
            if given.0 != 0 && given != theirs {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!(
                        "OverlayKernels.{name} = {} is not a handle of backend {} (its {name} is {})",
                        given.0,
                        backend.name(),
                        theirs.0
                    ),
                ));
            }
        }
        Ok(sys::tovl_overlay_kernels {
            rowdiff: self.rowdiff.0,
            embed_overlay: self.embed_overlay.0,
            lmhead_overlay_bf16: self.lmhead_overlay_bf16.0,
            lmhead_overlay_f32: self.lmhead_overlay_f32.0,
        })
    }
}

/// The spec name of the rowdiff kernel.
pub const KERNEL_ROWDIFF: &str = "rowdiff";
/// The spec name of the embed hook's kernel.
pub const KERNEL_EMBED_OVERLAY: &str = "embed_overlay";
/// The spec name of the lm_head hook's kernel for bf16 logits.
pub const KERNEL_LMHEAD_OVERLAY_BF16: &str = "lmhead_overlay_bf16";
/// The spec name of the lm_head hook's kernel for f32 logits.
pub const KERNEL_LMHEAD_OVERLAY_F32: &str = "lmhead_overlay_f32";

/// What an engine's GPU object offers tovl: the tovl [`Backend`] it runs on,
/// and kernel lookup by name (by default the backend's own). [`Backend`]
/// implements it; an engine's own GPU type can too, by holding a `Backend`.
pub trait GpuBackend {
    /// The tovl backend under this GPU object.
    fn backend(&self) -> &Backend;

    /// Look a kernel up by name; `KernelHandle(0)` when the backend lacks it.
    fn try_kernel(&self, name: &str) -> KernelHandle {
        self.backend().try_kernel(name)
    }
}

/// A stream to enqueue hooks on: a `CUstream` (CUDA), a `hipStream_t` (HIP),
/// a `VkCommandBuffer` being recorded (Vulkan), or the backend's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(*mut c_void);

impl Stream {
    /// The backend's own stream (NULL in C).
    pub const BACKEND: Stream = Stream(std::ptr::null_mut());

    /// An engine's stream or command buffer.
    ///
    /// # Safety
    /// `raw` is a live stream of the backend it is used with (for a wrapped
    /// CUDA backend a `CUstream` of its context; for a wrapped Vulkan device a
    /// `VkCommandBuffer` of that device in the recording state), and stays
    /// live while work enqueued on it runs.
    pub unsafe fn from_raw(raw: *mut c_void) -> Stream {
        Stream(raw)
    }

    /// The raw pointer (NULL for `Stream::BACKEND`).
    pub fn as_raw(self) -> *mut c_void {
        self.0
    }
}

/// One entry of [`Backend::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendInfo {
    /// "cpu", "cuda", "hip" or "vulkan".
    pub name: String,
    /// Built into this library.
    pub compiled: bool,
    /// Opens on this machine.
    pub available: bool,
    /// Why not available, else "".
    pub reason: String,
    /// The device description when available, else "".
    pub device: String,
}

/// A Vulkan device of the engine's, for [`Backend::vulkan_wrap`]: the
/// handles as raw pointers (`VkInstance`, `VkPhysicalDevice`, `VkDevice`).
#[derive(Clone, Copy, Debug)]
pub struct VulkanDevice {
    /// `VkInstance`.
    pub instance: *mut c_void,
    /// `VkPhysicalDevice`.
    pub physical_device: *mut c_void,
    /// `VkDevice`.
    pub device: *mut c_void,
    /// A queue family with `VK_QUEUE_COMPUTE_BIT`.
    pub queue_family: u32,
    /// The queue of that family tovl submits its own work to.
    pub queue_index: u32,
    /// The engine's `vkGetInstanceProcAddr`, or `None`: tovl loads libvulkan.so.1.
    pub get_instance_proc_addr: sys::tovl_vk_get_instance_proc_addr,
}

/// A tovl backend (the seeds' `GpuBackend` implementation): closed on drop.
///
/// Threads (docs/API.md): a backend and the objects built on it are used from
/// one thread at a time. `Backend` is `Send` (it may move to another thread)
/// but not `Sync`; overlays, sets and buffers borrow it, so they stay on the
/// thread that holds the backend and end before it closes.
#[derive(Debug)]
pub struct Backend {
    raw: NonNull<sys::tovl_backend>,
    kernels: OverlayKernels,
}

// SAFETY: the C library ties a backend to no thread, only to one thread at a
// time; `&Backend` is not `Send` (Backend is not `Sync`), so every use goes
// through the thread that owns it.
unsafe impl Send for Backend {}

impl GpuBackend for Backend {
    fn backend(&self) -> &Backend {
        self
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: every object built on the backend borrows it, so none is left.
        unsafe { sys::tovl_backend_close(self.raw.as_ptr()) }
    }
}

impl Backend {
    fn from_out(code: sys::tovl_status, raw: *mut sys::tovl_backend) -> Result<Backend> {
        check(code)?;
        let raw =
            NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, "backend open returned success and NULL"))?;
        // SAFETY: raw is a live backend.
        let kernels = OverlayKernels::from_raw(unsafe { sys::tovl_overlay_kernels_resolve(raw.as_ptr()) });
        Ok(Backend { raw, kernels })
    }

    /// Open a backend by name: "cpu", "cuda", "hip", "vulkan", or "auto" (the
    /// first available of cuda, hip, vulkan, cpu). The device comes from
    /// `TOVL_CUDA_DEVICE`, `TOVL_HIP_DEVICE`, `TOVL_VULKAN_DEVICE`.
    pub fn open(name: &str) -> Result<Backend> {
        let name = c_string("backend name", name)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: name is a C string; raw receives the backend.
        let code = unsafe { sys::tovl_backend_open(name.as_ptr(), &mut raw) };
        Backend::from_out(code, raw)
    }

    /// Every backend tovl knows, in "auto" order, each probed by opening it.
    pub fn list() -> Vec<BackendInfo> {
        // SAFETY: capacity 0 only counts.
        let n = unsafe { sys::tovl_backend_list(std::ptr::null_mut(), 0) };
        // SAFETY: tovl_backend_info is plain data; all-zero is a valid value.
        let mut infos: Vec<sys::tovl_backend_info> = vec![unsafe { std::mem::zeroed() }; n];
        // SAFETY: infos holds n entries.
        let n = unsafe { sys::tovl_backend_list(infos.as_mut_ptr(), n) }.min(infos.len());
        infos[..n]
            .iter()
            .map(|i| BackendInfo {
                // SAFETY: the strings are NUL-terminated (name static, the arrays filled by C).
                name: unsafe { cstr_lossy(i.name) },
                compiled: i.compiled,
                available: i.available,
                reason: unsafe { cstr_lossy(i.reason.as_ptr()) },
                device: unsafe { cstr_lossy(i.device.as_ptr()) },
            })
            .collect()
    }

    /// A CUDA backend on the engine's own `CUcontext`, so the hooks run on the
    /// engine's streams (`tovl_cuda_backend_wrap`).
    ///
    /// # Safety
    /// `cu_context` is a live `CUcontext` that outlives the backend.
    pub unsafe fn cuda_wrap(cu_context: *mut c_void) -> Result<Backend> {
        let mut raw = std::ptr::null_mut();
        let code = sys::tovl_cuda_backend_wrap(cu_context, &mut raw);
        Backend::from_out(code, raw)
    }

    /// A CUDA backend that loads `image` (a cubin, fatbin or NUL-terminated
    /// PTX) instead of the embedded kernels: a verification entry
    /// (`tovl_cuda_backend_open_image`; `label` names it in messages).
    pub fn cuda_open_image(image: &[u8], label: Option<&str>) -> Result<Backend> {
        let label = label.map(|l| c_string("image label", l)).transpose()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: image is valid for its length during the call.
        let code = unsafe {
            sys::tovl_cuda_backend_open_image(
                image.as_ptr().cast(),
                image.len(),
                label.as_ref().map_or(std::ptr::null(), |l| l.as_ptr()),
                &mut raw,
            )
        };
        Backend::from_out(code, raw)
    }

    /// The HIP backend on HIP device `device` (`tovl_hip_backend_open_device`).
    /// A libtovl built without the HIP backend lacks that function: then this
    /// is `BackendUnavailable`, found at run time rather than a link error.
    pub fn hip_open_device(device: i32) -> Result<Backend> {
        type OpenDevice = unsafe extern "C" fn(i32, *mut *mut sys::tovl_backend) -> sys::tovl_status;
        extern "C" {
            fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
        }
        // RTLD_DEFAULT is NULL on glibc: search the loaded libtovl.
        // SAFETY: a NUL-terminated name; dlsym only looks it up.
        let sym = unsafe { dlsym(std::ptr::null_mut(), c"tovl_hip_backend_open_device".as_ptr()) };
        if sym.is_null() {
            return Err(Error::new(
                Status::BackendUnavailable,
                "hip: this libtovl was built without the HIP backend (no tovl_hip_backend_open_device)",
            ));
        }
        // SAFETY: the symbol is tovl_hip.h's function of this signature.
        let open: OpenDevice = unsafe { std::mem::transmute::<*mut c_void, OpenDevice>(sym) };
        let mut raw = std::ptr::null_mut();
        // SAFETY: raw receives the backend.
        let code = unsafe { open(device, &mut raw) };
        Backend::from_out(code, raw)
    }

    /// A "vulkan" backend on the engine's own Vulkan device, so the hooks
    /// record into the engine's command buffers (`tovl_vulkan_backend_wrap`;
    /// tovl_vulkan.h lists the features the device needs).
    ///
    /// # Safety
    /// The handles are live objects of one instance, `device` was created from
    /// `physical_device` with the features tovl_vulkan.h names, and all of
    /// them outlive the backend. tovl submits to (queue_family, queue_index):
    /// no other thread uses that queue during a tovl call.
    pub unsafe fn vulkan_wrap(device: &VulkanDevice) -> Result<Backend> {
        let desc = sys::tovl_vulkan_device_desc {
            instance: device.instance,
            physical_device: device.physical_device,
            device: device.device,
            queue_family: device.queue_family,
            queue_index: device.queue_index,
            get_instance_proc_addr: device.get_instance_proc_addr,
        };
        let mut raw = std::ptr::null_mut();
        let code = sys::tovl_vulkan_backend_wrap(&desc, &mut raw);
        Backend::from_out(code, raw)
    }

    /// The raw backend, for calls into tovl-sys. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::tovl_backend {
        self.raw.as_ptr()
    }

    /// "cpu", "cuda", "hip", "vulkan" (or a wrapper's name).
    pub fn name(&self) -> String {
        // SAFETY: a live backend; the name is NUL-terminated.
        unsafe { cstr_lossy(sys::tovl_backend_name(self.raw.as_ptr())) }
    }

    /// The device description ("NVIDIA H200 (sm_90, driver ...)").
    pub fn device(&self) -> String {
        // SAFETY: as name.
        unsafe { cstr_lossy(sys::tovl_backend_device(self.raw.as_ptr())) }
    }

    /// A backend fact by key ("subgroup_size", "f32_denormals", "driver", ...);
    /// `None` when unknown.
    pub fn property(&self, key: &str) -> Option<String> {
        let key = c_string("property key", key).ok()?;
        // SAFETY: a live backend and a C string.
        let p = unsafe { sys::tovl_backend_property(self.raw.as_ptr(), key.as_ptr()) };
        if p.is_null() {
            None
        } else {
            // SAFETY: non-NULL, NUL-terminated.
            Some(unsafe { cstr_lossy(p) })
        }
    }

    /// Look a kernel up by name; `KernelHandle(0)` when this backend lacks it.
    pub fn try_kernel(&self, name: &str) -> KernelHandle {
        match c_string("kernel name", name) {
            // SAFETY: a live backend and a C string.
            Ok(name) => KernelHandle(unsafe { sys::tovl_try_kernel(self.raw.as_ptr(), name.as_ptr()) }),
            Err(_) => KernelHandle(0),
        }
    }

    /// Allocate `bytes` (> 0) of device memory, freed when the buffer drops.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>> {
        let mut ptr = 0;
        // SAFETY: a live backend; ptr receives the address.
        check(unsafe { sys::tovl_alloc(self.raw.as_ptr(), bytes, &mut ptr) })?;
        Ok(DeviceBuffer {
            backend: self,
            ptr: DevicePtr(ptr),
            bytes,
        })
    }

    /// Wait for all work on `stream` (`Stream::BACKEND`: the backend's own).
    pub fn synchronize(&self, stream: Stream) -> Result<()> {
        // SAFETY: a live backend; a stream is only made from a live one (Stream::from_raw).
        check(unsafe { sys::tovl_synchronize(self.raw.as_ptr(), stream.0) })
    }
}

/// Plain element types that device buffers copy to and from the host.
pub trait Element: Copy + private::Sealed {}
impl Element for u8 {}
impl Element for u16 {}
impl Element for i32 {}
impl Element for u32 {}
impl Element for f32 {}
impl Element for u64 {}
mod private {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for f32 {}
    impl Sealed for u64 {}
}

/// Device memory from [`Backend::alloc`], freed on drop. The copies are
/// synchronous and for set-up and checks, not the forward path.
#[derive(Debug)]
pub struct DeviceBuffer<'b> {
    backend: &'b Backend,
    ptr: DevicePtr,
    bytes: usize,
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated on this backend and is freed once.
        unsafe { sys::tovl_free(self.backend.raw.as_ptr(), self.ptr.0) }
    }
}

impl<'b> DeviceBuffer<'b> {
    /// The device address of the first byte.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer has no bytes (never: alloc refuses 0).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The backend the memory belongs to.
    pub fn backend(&self) -> &'b Backend {
        self.backend
    }

    fn range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(Error::new(
                Status::InvalidArgument,
                format!(
                    "bytes {offset}..{offset}+{len} lie outside the {}-byte device buffer",
                    self.bytes
                ),
            )),
        }
    }

    /// Copy `data` to the buffer at byte `offset`.
    pub fn upload<T: Element>(&self, offset: usize, data: &[T]) -> Result<()> {
        let len = std::mem::size_of_val(data);
        self.range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range lies inside the allocation; data is len bytes.
        check(unsafe {
            sys::tovl_upload(
                self.backend.raw.as_ptr(),
                self.ptr.0 + offset as u64,
                data.as_ptr().cast(),
                len,
            )
        })
    }

    /// Copy from the buffer at byte `offset` into `out`.
    pub fn download<T: Element>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let len = std::mem::size_of_val(out);
        self.range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: as upload; every bit pattern is a valid T (Element types).
        check(unsafe {
            sys::tovl_download(
                self.backend.raw.as_ptr(),
                out.as_mut_ptr().cast(),
                self.ptr.0 + offset as u64,
                len,
            )
        })
    }

    /// Fill `bytes` (a multiple of 4) at `offset` (4-byte aligned) with a 32-bit pattern.
    pub fn fill_u32(&self, offset: usize, pattern: u32, bytes: usize) -> Result<()> {
        self.range(offset, bytes)?;
        if offset % 4 != 0 || bytes % 4 != 0 {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("fill_u32 at byte {offset} over {bytes} bytes: both must be multiples of 4"),
            ));
        }
        // SAFETY: the range lies inside the allocation.
        check(unsafe { sys::tovl_fill_u32(self.backend.raw.as_ptr(), self.ptr.0 + offset as u64, pattern, bytes) })
    }
}

/// Marks types that borrow a backend: not `Send`, not `Sync`.
pub(crate) type BackendBound<'b> = PhantomData<&'b Backend>;
