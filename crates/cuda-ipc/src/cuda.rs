//! The CUDA driver, loaded at run time, and the three things tensor sharing needs from it:
//! exporting a device allocation as an IPC handle, importing such a handle in another process,
//! and ordering the consumer's stream after the producer's work with an IPC event.
//!
//! The driver API (`libcuda.so.1`, falling back to `libcuda.so`; the environment variable
//! [`LIBRARY_ENV`] names another file) is opened with `dlopen` the first time it is needed, and
//! only the handful of functions used here are resolved, from a small hand-written table. Nothing
//! links against CUDA, so the crate builds and its tests pass on machines without a GPU, and no
//! CUDA version has to be chosen at build time. Nothing here panics: a missing library, a missing
//! symbol or a failing `cuInit` is [`IpcError::CudaUnavailable`]; a failing driver call is
//! [`IpcError::Cuda`] with the call, its `CUresult` and the driver's name for it.
//!
//! Devices are named by UUID on the wire, never by ordinal: `CUDA_VISIBLE_DEVICES` may differ
//! between producer and consumer. Imports use the device's *primary* context, the one PyTorch and
//! the CUDA runtime use, so imported pointers can be handed to them directly.
//!
//! Not in scope: the wire format of exports and events (see the frame modules), allocations that
//! legacy CUDA IPC cannot share (stream-ordered pools, `cuMemCreate`/VMM memory, managed memory:
//! `cuIpcGetMemHandle` refuses them and the error says so), and sharing within one process (CUDA
//! refuses to open a handle in the process that exported it; callers pass the pointer instead).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, OsStr, OsString};
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use libloading::Library;

use crate::error::{IpcError, Result};
use crate::util::lock;

// ---------------------------------------------------------------------------------------------
// Driver types and constants (as declared in cuda.h)
// ---------------------------------------------------------------------------------------------

type CUresult = c_int;
type CUdevice = c_int;
type CUdeviceptr = u64;
type CUcontext = *mut c_void;
type CUevent = *mut c_void;
type CUstream = *mut c_void;

/// `CUipcMemHandle`: an opaque 64-byte handle to a device allocation.
#[repr(C)]
#[derive(Clone, Copy)]
struct CUipcMemHandle {
    reserved: [c_char; 64],
}

/// `CUipcEventHandle`: an opaque 64-byte handle to an interprocess event.
#[repr(C)]
#[derive(Clone, Copy)]
struct CUipcEventHandle {
    reserved: [c_char; 64],
}

/// `CUuuid`: a device's 16-byte UUID.
#[repr(C)]
#[derive(Clone, Copy)]
struct CUuuid {
    bytes: [c_char; 16],
}

const CUDA_SUCCESS: CUresult = 0;
const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
const CU_EVENT_INTERPROCESS: c_uint = 0x4;
const CU_POINTER_ATTRIBUTE_CONTEXT: c_uint = 1;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_uint = 9;

/// The environment variable that names the driver library to load instead of `libcuda.so.1`.
pub const LIBRARY_ENV: &str = "TENSORWIRE_CUDA_LIBRARY";

/// The libraries tried, in order, when [`LIBRARY_ENV`] is not set.
const DEFAULT_LIBRARIES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// How many opened IPC events a process keeps (least recently used ones are closed first).
const EVENT_CACHE_CAPACITY: usize = 1024;
/// How many of this process's exported allocations it recognises when a peer sends them back.
const EXPORTED_CAPACITY: usize = 4096;

/// How long an import waits for another thread that is closing the same handle.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

fn to_bytes<const N: usize>(chars: [c_char; N]) -> [u8; N] {
    chars.map(|c| c.to_ne_bytes()[0])
}

fn to_chars<const N: usize>(bytes: [u8; N]) -> [c_char; N] {
    bytes.map(|b| c_char::from_ne_bytes([b]))
}

// ---------------------------------------------------------------------------------------------
// The symbol table
// ---------------------------------------------------------------------------------------------

/// Looks up the first of `names` (each NUL-terminated) that `lib` exports.
///
/// # Safety
///
/// `T` must be the type of the symbol: a function pointer with the symbol's C signature.
// SAFETY: an `unsafe fn` because the symbol is handed out as `T` unchecked: only the
// caller knows the symbol's real signature (see `# Safety`).
unsafe fn symbol<T: Copy>(lib: &Library, names: &[&str]) -> std::result::Result<T, String> {
    for name in names {
        // SAFETY: forwarded from the caller, who promises `T` is the type of this symbol.
        if let Ok(sym) = unsafe { lib.get::<T>(name.as_bytes()) } {
            return Ok(*sym);
        }
    }
    let names: Vec<&str> = names.iter().map(|n| n.trim_end_matches('\0')).collect();
    Err(format!("it has no symbol {}", names.join(" or ")))
}

macro_rules! driver_api {
    ($( $field:ident = [$($name:literal),+] fn($($arg:ty),* $(,)?); )*) => {
        /// The driver functions this module calls, resolved from the loaded library.
        struct Api {
            // SAFETY: a function-pointer type, not unsafe code: calling one is unsafe, and
            // every call site says why its arguments are valid.
            $( $field: unsafe extern "C" fn($($arg),*) -> CUresult, )*
        }

        impl Api {
            /// Resolves every function, or says which one is missing.
            ///
            /// # Safety
            ///
            /// `lib` must be a CUDA driver library: each name must be a function with the C
            /// signature declared for it in this table (the one `cuda.h` declares).
            // SAFETY: an `unsafe fn` because the table's signatures are trusted, not checked:
            // only the caller knows `lib` is a CUDA driver (see `# Safety`).
            unsafe fn resolve(lib: &Library) -> std::result::Result<Api, String> {
                Ok(Api {
                    $( $field: {
                        // SAFETY: the caller promises `lib` is a CUDA driver, whose functions of
                        // these names have the signature of this field, copied from cuda.h.
                        unsafe { symbol(lib, &[$(concat!($name, "\0")),+]) }?
                    }, )*
                })
            }
        }
    };
}

driver_api! {
    init = ["cuInit"] fn(c_uint);
    driver_get_version = ["cuDriverGetVersion"] fn(*mut c_int);
    device_get = ["cuDeviceGet"] fn(*mut CUdevice, c_int);
    device_get_count = ["cuDeviceGetCount"] fn(*mut c_int);
    device_get_uuid = ["cuDeviceGetUuid_v2", "cuDeviceGetUuid"] fn(*mut CUuuid, CUdevice);
    primary_ctx_retain = ["cuDevicePrimaryCtxRetain"] fn(*mut CUcontext, CUdevice);
    primary_ctx_release = ["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"]
        fn(CUdevice);
    ctx_push = ["cuCtxPushCurrent_v2"] fn(CUcontext);
    ctx_pop = ["cuCtxPopCurrent_v2"] fn(*mut CUcontext);
    pointer_get_attribute = ["cuPointerGetAttribute"] fn(*mut c_void, c_uint, CUdeviceptr);
    mem_get_address_range = ["cuMemGetAddressRange_v2"]
        fn(*mut CUdeviceptr, *mut usize, CUdeviceptr);
    ipc_get_mem_handle = ["cuIpcGetMemHandle"] fn(*mut CUipcMemHandle, CUdeviceptr);
    ipc_open_mem_handle = ["cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"]
        fn(*mut CUdeviceptr, CUipcMemHandle, c_uint);
    ipc_close_mem_handle = ["cuIpcCloseMemHandle"] fn(CUdeviceptr);
    event_create = ["cuEventCreate"] fn(*mut CUevent, c_uint);
    event_record = ["cuEventRecord"] fn(CUevent, CUstream);
    event_destroy = ["cuEventDestroy_v2"] fn(CUevent);
    ipc_get_event_handle = ["cuIpcGetEventHandle"] fn(*mut CUipcEventHandle, CUevent);
    ipc_open_event_handle = ["cuIpcOpenEventHandle"] fn(*mut CUevent, CUipcEventHandle);
    stream_wait_event = ["cuStreamWaitEvent"] fn(CUstream, CUevent, c_uint);
    // Test and benchmark helpers (see `DeviceBuffer`).
    mem_alloc = ["cuMemAlloc_v2"] fn(*mut CUdeviceptr, usize);
    mem_free = ["cuMemFree_v2"] fn(CUdeviceptr);
    memcpy_htod = ["cuMemcpyHtoD_v2"] fn(CUdeviceptr, *const c_void, usize);
    memcpy_dtoh = ["cuMemcpyDtoH_v2"] fn(*mut c_void, CUdeviceptr, usize);
}

// SAFETY: a function-pointer type, not unsafe code: the one call (`error_name`) says why
// its arguments are valid.
type GetErrorName = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;

// ---------------------------------------------------------------------------------------------
// The loader
// ---------------------------------------------------------------------------------------------

/// The driver, loaded and initialised once per process.
pub struct CudaDriver {
    api: Api,
    get_error_name: Option<GetErrorName>,
    path: String,
    /// The UUID of each visible device, by ordinal (filled on first use).
    uuids: OnceLock<Vec<[u8; 16]>>,
    /// Never unloaded: once `cuInit` has run, the driver owns threads and process state.
    _lib: ManuallyDrop<Library>,
}

impl fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDriver")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

static DRIVER: OnceLock<std::result::Result<CudaDriver, String>> = OnceLock::new();

impl CudaDriver {
    /// The process-wide driver, loaded on first use.
    ///
    /// Fails with [`IpcError::CudaUnavailable`] when there is no usable driver; the failure is
    /// remembered, so later calls fail the same way without trying again.
    pub fn get() -> Result<&'static CudaDriver> {
        match DRIVER.get_or_init(load_default) {
            Ok(driver) => Ok(driver),
            Err(reason) => Err(IpcError::CudaUnavailable {
                reason: reason.clone(),
            }),
        }
    }

    /// The file the driver was loaded from.
    pub fn library_path(&self) -> &str {
        &self.path
    }

    /// The CUDA version the driver supports, as `1000 * major + 10 * minor`.
    pub fn driver_version(&self) -> Result<i32> {
        let mut version = 0;
        // SAFETY: `version` is a valid place for the one int the call writes.
        let rc = unsafe { (self.api.driver_get_version)(&mut version) };
        self.check("cuDriverGetVersion", rc)?;
        Ok(version)
    }

    /// How many devices this process sees.
    pub fn device_count(&self) -> Result<i32> {
        let mut count = 0;
        // SAFETY: `count` is a valid place for the one int the call writes.
        let rc = unsafe { (self.api.device_get_count)(&mut count) };
        self.check("cuDeviceGetCount", rc)?;
        Ok(count)
    }

    /// The UUID of the device with this ordinal.
    pub fn device_uuid(&self, ordinal: i32) -> Result<[u8; 16]> {
        let device = self.device(ordinal)?;
        let mut uuid = CUuuid { bytes: [0; 16] };
        // SAFETY: `uuid` is a valid place for the CUuuid the call writes; `device` came from
        // cuDeviceGet.
        let rc = unsafe { (self.api.device_get_uuid)(&mut uuid, device) };
        self.check("cuDeviceGetUuid", rc)?;
        Ok(to_bytes(uuid.bytes))
    }

    /// The ordinal of the device with this UUID (devices are identified by UUID on the wire,
    /// never by index).
    pub fn device_by_uuid(&self, uuid: &[u8; 16]) -> Result<i32> {
        let uuids = match self.uuids.get() {
            Some(uuids) => uuids,
            None => {
                let count = self.device_count()?;
                let uuids = (0..count)
                    .map(|ordinal| self.device_uuid(ordinal))
                    .collect::<Result<Vec<_>>>()?;
                self.uuids.get_or_init(|| uuids)
            }
        };
        let index = uuids.iter().position(|u| u == uuid);
        match index.and_then(|i| i32::try_from(i).ok()) {
            Some(ordinal) => Ok(ordinal),
            None => Err(IpcError::CudaUnavailable {
                reason: format!(
                    "no device with UUID {} is visible in this process (check CUDA_VISIBLE_DEVICES)",
                    format_uuid(uuid)
                ),
            }),
        }
    }

    fn device(&self, ordinal: i32) -> Result<CUdevice> {
        let mut device = 0;
        // SAFETY: `device` is a valid place for the CUdevice the call writes.
        let rc = unsafe { (self.api.device_get)(&mut device, ordinal) };
        self.check("cuDeviceGet", rc)?;
        Ok(device)
    }
}

/// True when a driver loads and at least one device is present (for tests and Python to skip
/// cleanly).
pub fn is_available() -> bool {
    CudaDriver::get()
        .and_then(CudaDriver::device_count)
        .is_ok_and(|count| count > 0)
}

/// Loads the driver named by [`LIBRARY_ENV`], or else the first default library that opens.
fn load_default() -> std::result::Result<CudaDriver, String> {
    let candidates: Vec<OsString> = match std::env::var_os(LIBRARY_ENV) {
        Some(path) if !path.is_empty() => vec![path],
        _ => DEFAULT_LIBRARIES.iter().map(OsString::from).collect(),
    };
    let mut reasons = Vec::new();
    for candidate in &candidates {
        match open_library(candidate) {
            // The fallbacks are for a library that cannot be found, not for one that loads and
            // then fails: that one is the driver, and its failure is the answer.
            Ok(lib) => return init_driver(lib, candidate),
            Err(reason) => reasons.push(reason),
        }
    }
    Err(reasons.join("; "))
}

/// Loads and initialises the driver at `path`, uncached (the process-wide one is
/// [`CudaDriver::get`]); for tests, which must not race over [`LIBRARY_ENV`].
#[cfg(test)]
fn load_from(path: &Path) -> Result<CudaDriver> {
    let path = path.as_os_str();
    let lib = open_library(path).map_err(|reason| IpcError::CudaUnavailable { reason })?;
    init_driver(lib, path).map_err(|reason| IpcError::CudaUnavailable { reason })
}

fn open_library(path: &OsStr) -> std::result::Result<Library, String> {
    // SAFETY: loading a library runs its initialisers. The candidates are the system CUDA driver
    // or a file the user named in TENSORWIRE_CUDA_LIBRARY for exactly this purpose, so running
    // their initialisers is what is asked for.
    unsafe { Library::new(path) }
        .map_err(|e| format!("cannot load {}: {e}", Path::new(path).display()))
}

fn init_driver(lib: Library, path: &OsStr) -> std::result::Result<CudaDriver, String> {
    let shown = Path::new(path).display().to_string();
    // SAFETY: a library exporting the CUDA driver's entry points is taken to be the CUDA
    // driver (that is what the caller asked to load), so the symbols have cuda.h's signatures.
    let api = unsafe { Api::resolve(&lib) }
        .map_err(|e| format!("{shown} is not a usable CUDA driver: {e}"))?;
    // SAFETY: as above; cuGetErrorName has this signature in every driver that exports it.
    let get_error_name = unsafe { symbol::<GetErrorName>(&lib, &["cuGetErrorName\0"]) }.ok();
    let driver = CudaDriver {
        api,
        get_error_name,
        path: shown,
        uuids: OnceLock::new(),
        _lib: ManuallyDrop::new(lib),
    };
    // SAFETY: cuInit takes flags by value (0 is the only valid value) and may be called from
    // any thread, any number of times.
    let rc = unsafe { (driver.api.init)(0) };
    if rc != CUDA_SUCCESS {
        return Err(format!(
            "cuInit failed in {} with error {rc} ({})",
            driver.path,
            driver.error_name(rc)
        ));
    }
    Ok(driver)
}

// ---------------------------------------------------------------------------------------------
// Error mapping
// ---------------------------------------------------------------------------------------------

impl CudaDriver {
    /// The driver's name for a `CUresult`, or "unknown".
    fn error_name(&self, code: CUresult) -> String {
        let Some(get_error_name) = self.get_error_name else {
            return "unknown".to_owned();
        };
        let mut name: *const c_char = ptr::null();
        // SAFETY: `name` is a valid place for the string pointer the call writes.
        let rc = unsafe { get_error_name(code, &mut name) };
        if rc != CUDA_SUCCESS || name.is_null() {
            return "unknown".to_owned();
        }
        // SAFETY: on success the driver points `name` at a static NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `Ok` for `CUDA_SUCCESS`, else [`IpcError::Cuda`] naming `call` and the code.
    fn check(&self, call: &'static str, code: CUresult) -> Result<()> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(IpcError::Cuda {
                call,
                code,
                name: self.error_name(code),
            })
        }
    }
}

fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex = crate::util::hex(uuid);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn overflow(what: &'static str) -> IpcError {
    IpcError::Tensor(tensorwire_core::Error::Overflow { what })
}

/// Checks that `[offset, offset + length)` lies within `[0, limit)`.
fn check_span(what: impl FnOnce() -> String, offset: u64, length: u64, limit: u64) -> Result<()> {
    match offset.checked_add(length) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(IpcError::Tensor(tensorwire_core::Error::OutOfBounds {
            tensor: what(),
            offset,
            length,
            limit,
        })),
    }
}

fn stream_handle(stream: u64) -> Result<CUstream> {
    let address = usize::try_from(stream).map_err(|_| overflow("CUDA stream handle"))?;
    Ok(ptr::without_provenance_mut(address))
}

// ---------------------------------------------------------------------------------------------
// Contexts and thin call wrappers
// ---------------------------------------------------------------------------------------------

/// A context pushed on this thread's context stack; popped on drop.
struct CtxGuard<'a> {
    driver: &'a CudaDriver,
    /// The context stack is per thread: the guard must be dropped where it was made.
    _not_send: PhantomData<*const ()>,
}

impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        let mut popped: CUcontext = ptr::null_mut();
        // SAFETY: this guard pushed a context on this thread (it is not Send), so there is one
        // to pop; `popped` is a valid place for the context the call writes.
        unsafe { (self.driver.api.ctx_pop)(&mut popped) };
    }
}

/// A device's primary context, retained (released on drop).
struct PrimaryContext {
    driver: &'static CudaDriver,
    ordinal: i32,
    device: CUdevice,
    ctx: CUcontext,
}

// SAFETY: a CUcontext is a process-wide handle the driver lets any thread use; this type only
// pushes it (per thread, undone before returning) and releases it once, in Drop.
unsafe impl Send for PrimaryContext {}
// SAFETY: as for Send; `&PrimaryContext` only allows pushing, which the driver makes thread-safe.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    fn retain(driver: &'static CudaDriver, ordinal: i32) -> Result<PrimaryContext> {
        let device = driver.device(ordinal)?;
        let mut ctx: CUcontext = ptr::null_mut();
        // SAFETY: `ctx` is a valid place for the context the call writes; `device` came from
        // cuDeviceGet.
        let rc = unsafe { (driver.api.primary_ctx_retain)(&mut ctx, device) };
        driver.check("cuDevicePrimaryCtxRetain", rc)?;
        Ok(PrimaryContext {
            driver,
            ordinal,
            device,
            ctx,
        })
    }

    fn push(&self) -> Result<CtxGuard<'static>> {
        self.driver.push(self.ctx)
    }

    /// Copies `dst.len()` bytes at `offset` of the device range `(base, size)` (memory
    /// of this context's device) to `dst`, synchronously, checking the range first.
    fn read(
        &self,
        what: &str,
        (base, size): (u64, u64),
        offset: u64,
        dst: &mut [u8],
    ) -> Result<()> {
        let len = u64::try_from(dst.len()).map_err(|_| overflow("copy length"))?;
        check_span(|| what.to_owned(), offset, len, size)?;
        let _guard = self.push()?;
        self.driver.copy_to_host(base + offset, dst)
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: `retain` retained this device's primary context once; this releases it once.
        unsafe { (self.driver.api.primary_ctx_release)(self.device) };
    }
}

/// An event handle that may cross threads.
struct RawEvent(CUevent);

// SAFETY: a CUevent is a process-wide handle the driver lets any thread use.
unsafe impl Send for RawEvent {}
// SAFETY: as for Send; the driver's event calls are thread-safe.
unsafe impl Sync for RawEvent {}

impl CudaDriver {
    fn push(&self, ctx: CUcontext) -> Result<CtxGuard<'_>> {
        // SAFETY: `ctx` is a live context (retained by the caller, or the one owning a live
        // allocation); pushing only changes this thread's context stack, and the guard pops it.
        let rc = unsafe { (self.api.ctx_push)(ctx) };
        self.check("cuCtxPushCurrent", rc)?;
        Ok(CtxGuard {
            driver: self,
            _not_send: PhantomData,
        })
    }

    fn pointer_context(&self, ptr: CUdeviceptr) -> Result<CUcontext> {
        let mut ctx: CUcontext = ptr::null_mut();
        // SAFETY: for CU_POINTER_ATTRIBUTE_CONTEXT the driver writes one CUcontext to `data`,
        // which points at `ctx`; the pointer queried is only looked up, never dereferenced.
        let rc = unsafe {
            (self.api.pointer_get_attribute)(
                ptr::from_mut(&mut ctx).cast(),
                CU_POINTER_ATTRIBUTE_CONTEXT,
                ptr,
            )
        };
        self.check("cuPointerGetAttribute", rc)?;
        Ok(ctx)
    }

    fn pointer_device_ordinal(&self, ptr: CUdeviceptr) -> Result<i32> {
        let mut ordinal: c_int = 0;
        // SAFETY: for CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL the driver writes one int to `data`,
        // which points at `ordinal`.
        let rc = unsafe {
            (self.api.pointer_get_attribute)(
                ptr::from_mut(&mut ordinal).cast(),
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        self.check("cuPointerGetAttribute", rc)?;
        Ok(ordinal)
    }

    /// The base and size of the allocation holding `ptr`.
    fn address_range(&self, ptr: CUdeviceptr) -> Result<(u64, u64)> {
        let mut base: CUdeviceptr = 0;
        let mut size: usize = 0;
        // SAFETY: `base` and `size` are valid places for the two values the call writes.
        let rc = unsafe { (self.api.mem_get_address_range)(&mut base, &mut size, ptr) };
        self.check("cuMemGetAddressRange", rc)?;
        let size = u64::try_from(size).map_err(|_| overflow("CUDA allocation size"))?;
        Ok((base, size))
    }

    fn ipc_get_mem_handle(&self, base: CUdeviceptr) -> Result<[u8; 64]> {
        let mut handle = CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `handle` is a valid place for the handle the call writes.
        let rc = unsafe { (self.api.ipc_get_mem_handle)(&mut handle, base) };
        self.check("cuIpcGetMemHandle", rc)?;
        Ok(to_bytes(handle.reserved))
    }

    fn ipc_open_mem_handle(&self, handle: &[u8; 64]) -> Result<CUdeviceptr> {
        let handle = CUipcMemHandle {
            reserved: to_chars(*handle),
        };
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid place for the pointer the call writes; the handle is passed by
        // value and the driver validates it.
        let rc = unsafe {
            (self.api.ipc_open_mem_handle)(&mut ptr, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        };
        self.check("cuIpcOpenMemHandle", rc)?;
        Ok(ptr)
    }

    fn ipc_close_mem_handle(&self, ptr: CUdeviceptr) -> Result<()> {
        // SAFETY: `ptr` was returned by cuIpcOpenMemHandle and is closed exactly once, by the
        // one owner of the mapping; no Rust reference points into device memory.
        let rc = unsafe { (self.api.ipc_close_mem_handle)(ptr) };
        self.check("cuIpcCloseMemHandle", rc)
    }

    fn event_create(&self, flags: c_uint) -> Result<CUevent> {
        let mut event: CUevent = ptr::null_mut();
        // SAFETY: `event` is a valid place for the event the call writes.
        let rc = unsafe { (self.api.event_create)(&mut event, flags) };
        self.check("cuEventCreate", rc)?;
        Ok(event)
    }

    fn event_destroy(&self, event: CUevent) {
        // SAFETY: the caller owns `event` (created or opened here) and destroys it once.
        unsafe { (self.api.event_destroy)(event) };
    }

    /// Pushes `ctx`, destroys `event` (which lives in `ctx`) and pops.
    fn destroy_event_in(&self, ctx: &PrimaryContext, event: CUevent) {
        if event.is_null() {
            return;
        }
        let _guard = ctx.push();
        self.event_destroy(event);
    }
}

// ---------------------------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------------------------

/// What the producer sends for one device allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CudaExport {
    /// The UUID of the device holding the allocation.
    pub device_uuid: [u8; 16],
    /// The allocation's `CUipcMemHandle`.
    pub handle: [u8; 64],
    /// The allocation's base address in the producer (for diagnostics; consumers map it
    /// elsewhere).
    pub base: u64,
    /// The allocation's size in bytes.
    pub alloc_size: u64,
}

/// Finds the allocation holding `[ptr, ptr + len)` and gets an IPC handle for its base.
///
/// The pointer's context and device come from `cuPointerGetAttribute`, the allocation's base
/// and size from `cuMemGetAddressRange` (an error if the range leaves the allocation), and the
/// handle from `cuIpcGetMemHandle`, with the pointer's context pushed around the calls. Returns
/// the export and `ptr - base`, the tensor's offset in the allocation.
pub fn export_pointer(ptr: u64, len: u64) -> Result<(CudaExport, u64)> {
    let driver = CudaDriver::get()?;
    if let Some(reexport) = reexport_of_import(ptr, len)? {
        return Ok(reexport);
    }
    let ordinal = driver.pointer_device_ordinal(ptr)?;
    let owner = driver.pointer_context(ptr)?;
    // Memory not owned by one context reports none; the device's primary context then serves.
    let primary;
    let guard = if owner.is_null() {
        primary = PrimaryContext::retain(driver, ordinal)?;
        primary.push()?
    } else {
        driver.push(owner)?
    };
    let (base, alloc_size) = driver.address_range(ptr)?;
    let offset = offset_in_allocation(ptr, len, base, alloc_size)?;
    let handle = driver.ipc_get_mem_handle(base)?;
    drop(guard);
    let device_uuid = driver.device_uuid(ordinal)?;
    lock(&EXPORTED).insert((device_uuid, handle), base);
    Ok((
        CudaExport {
            device_uuid,
            handle,
            base,
            alloc_size,
        },
        offset,
    ))
}

/// Allocations this process exported, by (device UUID, handle), with their base here: a peer
/// that sends one back (an echo, or a tensor it got from us) is given our own memory by
/// [`open_export`], not an IPC mapping (CUDA refuses to open a handle in the process that
/// made it). Bounded; a forgotten entry only means such a handle fails to open.
static EXPORTED: Mutex<BoundedCache<MappingKey, u64>> =
    Mutex::new(BoundedCache::new(EXPORTED_CAPACITY));

/// `[ptr, ptr + len)` inside memory this process imported: the exporter's handle again, with
/// the offset in its allocation. Memory mapped from a handle has no handle of its own
/// (`cuIpcGetMemHandle` refuses it), so a tensor received from a peer and shared on — back to
/// its owner or to a third process — goes out as the owner's export.
fn reexport_of_import(ptr: u64, len: u64) -> Result<Option<(CudaExport, u64)>> {
    // Only the mapping holding `ptr` is upgraded; it is dropped after the lock is let go
    // (a last `Arc` dropped under the lock would deadlock in `CudaMapping::drop`).
    let mapping = lock(&MAPPINGS)
        .values()
        .find(|entry| (entry.ptr..entry.ptr.saturating_add(entry.size)).contains(&ptr))
        .and_then(|entry| entry.mapping.upgrade());
    let Some(mapping) = mapping else {
        return Ok(None);
    };
    let offset = offset_in_allocation(ptr, len, mapping.ptr, mapping.export.alloc_size)?;
    Ok(Some((mapping.export.clone(), offset)))
}

/// `ptr - base`, when `[ptr, ptr + len)` lies within the allocation `[base, base + size)`.
fn offset_in_allocation(ptr: u64, len: u64, base: u64, size: u64) -> Result<u64> {
    let what = || format!("CUDA pointer {ptr:#x}");
    match ptr.checked_sub(base) {
        Some(offset) => {
            check_span(what, offset, len, size)?;
            Ok(offset)
        }
        None => Err(IpcError::Tensor(tensorwire_core::Error::OutOfBounds {
            tensor: what(),
            offset: 0,
            length: len,
            limit: size,
        })),
    }
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

/// An IPC event recorded on the producer's stream; the producer keeps it alive until consumers
/// have waited (drop destroys it).
pub struct ProducerEvent {
    event: RawEvent,
    handle: [u8; 64],
    ctx: PrimaryContext,
}

impl fmt::Debug for ProducerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProducerEvent")
            .field("device", &self.ctx.ordinal)
            .finish_non_exhaustive()
    }
}

impl ProducerEvent {
    /// Creates an interprocess event (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`) in the
    /// primary context of device `device`, records it on `stream` (0 = that context's legacy
    /// default stream; other streams must belong to the primary context, as PyTorch's do), and
    /// gets its IPC handle.
    pub fn record(device: i32, stream: u64) -> Result<ProducerEvent> {
        let driver = CudaDriver::get()?;
        let stream = stream_handle(stream)?;
        let mut this = ProducerEvent {
            event: RawEvent(ptr::null_mut()),
            handle: [0; 64],
            ctx: PrimaryContext::retain(driver, device)?,
        };
        let _guard = this.ctx.push()?;
        // From here on, dropping `this` destroys the event.
        this.event.0 = driver.event_create(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)?;
        // SAFETY: the event was just created in the pushed context; `stream` is the caller's
        // stream handle of that context (or 0), which the driver validates.
        let rc = unsafe { (driver.api.event_record)(this.event.0, stream) };
        driver.check("cuEventRecord", rc)?;
        let mut handle = CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: `handle` is a valid place for the handle the call writes; the event is live
        // and interprocess.
        let rc = unsafe { (driver.api.ipc_get_event_handle)(&mut handle, this.event.0) };
        driver.check("cuIpcGetEventHandle", rc)?;
        this.handle = to_bytes(handle.reserved);
        Ok(this)
    }

    /// The event's `CUipcEventHandle`, for consumers to pass to [`wait_event`].
    pub fn handle(&self) -> [u8; 64] {
        self.handle
    }

    /// The ordinal of the device the event belongs to.
    pub fn device_ordinal(&self) -> i32 {
        self.ctx.ordinal
    }
}

impl Drop for ProducerEvent {
    fn drop(&mut self) {
        self.ctx.driver.destroy_event_in(&self.ctx, self.event.0);
    }
}

/// An IPC event opened in this process, in the primary context of its device.
struct OpenedEvent {
    event: RawEvent,
    ctx: PrimaryContext,
}

impl Drop for OpenedEvent {
    fn drop(&mut self) {
        self.ctx.driver.destroy_event_in(&self.ctx, self.event.0);
    }
}

/// A map that keeps at most `capacity` entries, dropping the least recently used.
struct BoundedCache<K, V> {
    entries: BTreeMap<K, (V, u64)>,
    tick: u64,
    capacity: usize,
}

impl<K: Ord + Clone, V> BoundedCache<K, V> {
    const fn new(capacity: usize) -> Self {
        BoundedCache {
            entries: BTreeMap::new(),
            tick: 0,
            capacity,
        }
    }

    fn get(&mut self, key: &K) -> Option<&V> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|entry| {
            entry.1 = tick;
            &entry.0
        })
    }

    /// Inserts, returning what was pushed out (an evicted or replaced value) for the caller to
    /// drop.
    fn insert(&mut self, key: K, value: V) -> Option<V> {
        let mut pushed_out = None;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, tick))| *tick)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                pushed_out = self.entries.remove(&oldest).map(|(v, _)| v);
            }
        }
        self.tick += 1;
        if let Some((replaced, _)) = self.entries.insert(key, (value, self.tick)) {
            pushed_out = Some(replaced);
        }
        pushed_out
    }

    fn remove(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key).map(|(value, _)| value)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

type EventKey = ([u8; 16], [u8; 64]);

static EVENTS: Mutex<BoundedCache<EventKey, Arc<OpenedEvent>>> =
    Mutex::new(BoundedCache::new(EVENT_CACHE_CAPACITY));

/// The opened event for `handle` on the device with `device_uuid`, from the cache or opened now.
fn opened_event(
    driver: &'static CudaDriver,
    device_uuid: &[u8; 16],
    handle: &[u8; 64],
) -> Result<Arc<OpenedEvent>> {
    let key = (*device_uuid, *handle);
    let mut cache = lock(&EVENTS);
    if let Some(event) = cache.get(&key) {
        return Ok(Arc::clone(event));
    }
    let ordinal = driver.device_by_uuid(device_uuid)?;
    let mut opened = OpenedEvent {
        event: RawEvent(ptr::null_mut()),
        ctx: PrimaryContext::retain(driver, ordinal)?,
    };
    {
        let _guard = opened.ctx.push()?;
        let ipc = CUipcEventHandle {
            reserved: to_chars(*handle),
        };
        // SAFETY: `opened.event` is a valid place for the event the call writes; the handle is
        // passed by value and the driver validates it.
        let rc = unsafe { (driver.api.ipc_open_event_handle)(&mut opened.event.0, ipc) };
        driver.check("cuIpcOpenEventHandle", rc)?;
    }
    let opened = Arc::new(opened);
    let pushed_out = cache.insert(key, Arc::clone(&opened));
    drop(cache);
    drop(pushed_out);
    Ok(opened)
}

/// Makes `stream` wait for the producer's event `handle`, on the device with `device_uuid`
/// (`cuStreamWaitEvent`; 0 = the legacy default stream of the device's primary context).
///
/// Opened events are cached per process, keyed by device and handle bytes, for the
/// 1024 most recently used handles.
pub fn wait_event(device_uuid: &[u8; 16], handle: &[u8; 64], stream: u64) -> Result<()> {
    let driver = CudaDriver::get()?;
    let stream = stream_handle(stream)?;
    let event = opened_event(driver, device_uuid, handle)?;
    let _guard = event.ctx.push()?;
    // SAFETY: the event is live (held by `event`) and belongs to the pushed context; `stream` is
    // the caller's stream handle of that context (or 0), which the driver validates.
    let rc = unsafe { (driver.api.stream_wait_event)(stream, event.event.0, 0) };
    driver.check("cuStreamWaitEvent", rc)
}

// ---------------------------------------------------------------------------------------------
// Import
// ---------------------------------------------------------------------------------------------

type MappingKey = ([u8; 16], [u8; 64]);

/// The live mappings of this process. An entry whose `Weak` is dead belongs to a mapping whose
/// drop is closing it right now; the drop removes the entry once the handle is closed.
static MAPPINGS: Mutex<BTreeMap<MappingKey, MappingEntry>> = Mutex::new(BTreeMap::new());

/// A live mapping, and where it lies in this process (to find it by address without
/// upgrading every `Weak`).
struct MappingEntry {
    mapping: Weak<CudaMapping>,
    ptr: u64,
    size: u64,
}
/// Signalled when a mapping has been closed and its entry removed.
static MAPPING_CLOSED: Condvar = Condvar::new();
static OPENED: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);

/// One imported allocation mapped into this process. Closed (`cuIpcCloseMemHandle`, with its
/// device's primary context pushed) when the last `Arc` goes.
pub struct CudaMapping {
    ptr: u64,
    size: u64,
    key: MappingKey,
    /// What was imported (the exporter's base and allocation size).
    export: CudaExport,
    /// Keeps the primary context alive while the mapping lives.
    ctx: PrimaryContext,
}

impl fmt::Debug for CudaMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaMapping")
            .field("device_ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &format_uuid(&self.key.0))
            .finish_non_exhaustive()
    }
}

impl CudaMapping {
    /// The base of the mapping in this process.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The size of the mapped allocation in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The ordinal of the device in this process.
    pub fn device_ordinal(&self) -> i32 {
        self.ctx.ordinal
    }

    /// The UUID of the device.
    pub fn device_uuid(&self) -> [u8; 16] {
        self.key.0
    }

    /// Copies `dst.len()` bytes at `offset` in the mapping to host memory (synchronous, on the
    /// legacy default stream). A helper for tests, tools and non-PyTorch consumers.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.ctx
            .read("CUDA mapping", (self.ptr, self.size), offset, dst)
    }
}

impl Drop for CudaMapping {
    fn drop(&mut self) {
        let driver = self.ctx.driver;
        // Close under the cache lock, so no import can open the handle again before it is closed.
        let mut cache = lock(&MAPPINGS);
        {
            let _guard = self.ctx.push();
            // Nothing can be done about a failure here (the driver is likely shutting down).
            let _ = driver.ipc_close_mem_handle(self.ptr);
        }
        let ours = cache
            .get(&self.key)
            .is_some_and(|entry| ptr::eq(entry.mapping.as_ptr(), self));
        if ours {
            cache.remove(&self.key);
        }
        drop(cache);
        LIVE.fetch_sub(1, Ordering::Relaxed);
        MAPPING_CLOSED.notify_all();
    }
}

/// Counters for tests and server info.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// How many times `cuIpcOpenMemHandle` succeeded in this process.
    pub opened: u64,
    /// How many mappings are live in this process.
    pub live: u64,
}

/// How many handles this process has opened, and how many mappings are live.
pub fn import_stats() -> ImportStats {
    ImportStats {
        opened: OPENED.load(Ordering::Relaxed),
        live: LIVE.load(Ordering::Relaxed),
    }
}

/// Opens `export` in this process, once.
///
/// A process-wide cache keyed by (device UUID, handle) holds a `Weak` to each live mapping, so
/// importing a handle that is already mapped returns the same `Arc` (opening costs
/// milliseconds, and older drivers refuse to open a handle twice). The mapping lives in the
/// device's primary context (the one PyTorch uses), which stays retained while it lives, and is
/// opened with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`; its size (`cuMemGetAddressRange`) must be
/// at least `export.alloc_size`.
///
/// CUDA refuses to open a handle in the process that exported it: for an export that may be
/// this process's own memory sent back, use [`open_export`].
pub fn import(export: &CudaExport) -> Result<Arc<CudaMapping>> {
    let driver = CudaDriver::get()?;
    let key = (export.device_uuid, export.handle);
    let mut cache = lock(&MAPPINGS);
    let started = Instant::now();
    loop {
        match cache.get(&key).map(|entry| entry.mapping.upgrade()) {
            None => break,
            Some(Some(mapping)) => return Ok(mapping),
            Some(None) => {
                // The last user dropped it and its drop is closing the handle: wait for that.
                let left = CLOSE_WAIT.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(IpcError::Timeout {
                        what: "another thread to close the same CUDA IPC handle".to_owned(),
                        waited_ms: u64::try_from(CLOSE_WAIT.as_millis()).unwrap_or(u64::MAX),
                    });
                }
                cache = match MAPPING_CLOSED.wait_timeout(cache, left) {
                    Ok((cache, _)) => cache,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
        }
    }

    let ordinal = driver.device_by_uuid(&export.device_uuid)?;
    let ctx = PrimaryContext::retain(driver, ordinal)?;
    let (ptr, size) = {
        let _guard = ctx.push()?;
        let ptr = driver.ipc_open_mem_handle(&export.handle)?;
        let checked = driver.address_range(ptr).and_then(|(_, size)| {
            if size >= export.alloc_size {
                Ok(size)
            } else {
                Err(IpcError::protocol(format!(
                    "the imported CUDA allocation is {size} bytes, the export says {}",
                    export.alloc_size
                )))
            }
        });
        match checked {
            Ok(size) => (ptr, size),
            Err(e) => {
                let _ = driver.ipc_close_mem_handle(ptr);
                return Err(e);
            }
        }
    };
    OPENED.fetch_add(1, Ordering::Relaxed);
    LIVE.fetch_add(1, Ordering::Relaxed);
    let mapping = Arc::new(CudaMapping {
        ptr,
        size,
        key,
        export: export.clone(),
        ctx,
    });
    cache.insert(
        key,
        MappingEntry {
            mapping: Arc::downgrade(&mapping),
            ptr,
            size,
        },
    );
    Ok(mapping)
}

/// Memory of this process that a peer sent back (see [`open_export`]). Nothing was opened
/// for it and nothing closes it: whoever owns the memory here must keep it alive while the
/// pointer is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalMemory {
    /// The allocation's base in this process.
    pub ptr: u64,
    /// The allocation's size (as exported).
    pub size: u64,
    /// The device's ordinal in this process.
    pub device_ordinal: i32,
    /// The device's UUID.
    pub device_uuid: [u8; 16],
}

/// What an export opens to in this process.
#[derive(Debug, Clone)]
pub enum Opened {
    /// Another process's allocation, mapped (closed with its last `Arc`).
    Mapped(Arc<CudaMapping>),
    /// This process's own allocation, sent back by a peer.
    Local(LocalMemory),
}

impl Opened {
    /// The allocation's base in this process.
    pub fn device_ptr(&self) -> u64 {
        match self {
            Opened::Mapped(mapping) => mapping.device_ptr(),
            Opened::Local(local) => local.ptr,
        }
    }

    /// The device's ordinal in this process.
    pub fn device_ordinal(&self) -> i32 {
        match self {
            Opened::Mapped(mapping) => mapping.device_ordinal(),
            Opened::Local(local) => local.device_ordinal,
        }
    }

    /// The device's UUID.
    pub fn device_uuid(&self) -> [u8; 16] {
        match self {
            Opened::Mapped(mapping) => mapping.device_uuid(),
            Opened::Local(local) => local.device_uuid,
        }
    }
}

/// [`import`], except that an export this process made itself — a peer sending our own
/// memory back, as an echo or a tensor it got from us, which CUDA refuses to open here —
/// comes back as [`Opened::Local`]: this process remembers the allocations it exported
/// (the `EXPORTED_CAPACITY` most recent) and checks that an allocation at that base still
/// has that handle. A handle of ours whose allocation has been freed since is an error. The
/// driver cannot tell a new allocation that took the same address (it gives it the same
/// handle): the caller must check that the memory still belongs to what it shared, as the
/// Python decoder does through its live storages.
pub fn open_export(export: &CudaExport) -> Result<Opened> {
    let driver = CudaDriver::get()?;
    let key = (export.device_uuid, export.handle);
    let Some(base) = lock(&EXPORTED).get(&key).copied() else {
        return import(export).map(Opened::Mapped);
    };
    let device_ordinal = driver.device_by_uuid(&export.device_uuid)?;
    let ctx = PrimaryContext::retain(driver, device_ordinal)?;
    let still_ours = {
        let _guard = ctx.push()?;
        match driver.address_range(base) {
            Ok((found, size)) if found == base && size >= export.alloc_size => {
                driver.ipc_get_mem_handle(base).ok() == Some(export.handle)
            }
            _ => false,
        }
    };
    if !still_ours {
        lock(&EXPORTED).remove(&key);
        return Err(IpcError::Tensor(tensorwire_core::Error::invalid(
            "a peer sent back a CUDA IPC handle of memory this process has freed since \
             it shared it",
        )));
    }
    Ok(Opened::Local(LocalMemory {
        ptr: base,
        size: export.alloc_size,
        device_ordinal,
        device_uuid: export.device_uuid,
    }))
}

// ---------------------------------------------------------------------------------------------
// Test and benchmark helpers
// ---------------------------------------------------------------------------------------------

impl CudaDriver {
    /// Copies device memory at `src` to `dst` (with the right context pushed by the caller).
    fn copy_to_host(&self, src: CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `dst` is valid for writes of `dst.len()` bytes for the whole (synchronous)
        // call; the caller checked the device range against its allocation.
        let rc = unsafe { (self.api.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len()) };
        self.check("cuMemcpyDtoH", rc)
    }

    /// Copies `src` to device memory at `dst` (with the right context pushed by the caller).
    fn copy_to_device(&self, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is valid for reads of `src.len()` bytes for the whole (synchronous)
        // call; the caller checked the device range against its allocation.
        let rc = unsafe { (self.api.memcpy_htod)(dst, src.as_ptr().cast(), src.len()) };
        self.check("cuMemcpyHtoD", rc)
    }
}

/// Device memory from `cuMemAlloc` in a device's primary context, freed on drop.
///
/// A helper for tests and benchmarks that need device memory without PyTorch; the sharing
/// paths themselves never allocate.
pub struct DeviceBuffer {
    ptr: u64,
    size: u64,
    ctx: PrimaryContext,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device_ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.ctx.ordinal)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `size` bytes (uninitialised) on device `device`.
    pub fn alloc(device: i32, size: u64) -> Result<DeviceBuffer> {
        let driver = CudaDriver::get()?;
        let bytes = usize::try_from(size).map_err(|_| overflow("allocation size"))?;
        let ctx = PrimaryContext::retain(driver, device)?;
        let mut ptr: CUdeviceptr = 0;
        {
            let _guard = ctx.push()?;
            // SAFETY: `ptr` is a valid place for the pointer the call writes.
            let rc = unsafe { (driver.api.mem_alloc)(&mut ptr, bytes) };
            driver.check("cuMemAlloc", rc)?;
        }
        Ok(DeviceBuffer { ptr, size, ctx })
    }

    /// The device address of the buffer.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The size of the buffer in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The ordinal of the device holding the buffer.
    pub fn device_ordinal(&self) -> i32 {
        self.ctx.ordinal
    }

    /// Copies `src` into the buffer at `offset` (synchronous).
    pub fn write(&mut self, offset: u64, src: &[u8]) -> Result<()> {
        let len = u64::try_from(src.len()).map_err(|_| overflow("copy length"))?;
        check_span(|| "device buffer".to_owned(), offset, len, self.size)?;
        let _guard = self.ctx.push()?;
        self.ctx.driver.copy_to_device(self.ptr + offset, src)
    }

    /// Copies `dst.len()` bytes at `offset` in the buffer to `dst` (synchronous).
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.ctx
            .read("device buffer", (self.ptr, self.size), offset, dst)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _guard = self.ctx.push();
        // SAFETY: `ptr` came from cuMemAlloc and is freed once, here; nothing in Rust points
        // into it.
        unsafe { (self.ctx.driver.api.mem_free)(self.ptr) };
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::process::Command;

    /// Set in the child process of `gpu_import_in_child_process`: the export to import.
    const CHILD_ENV: &str = "TENSORWIRE_CUDA_IPC_TEST_CHILD";

    fn no_gpu() -> bool {
        if is_available() {
            false
        } else {
            eprintln!("skipped: no CUDA device");
            true
        }
    }

    fn is_unavailable<T: fmt::Debug>(result: Result<T>) -> bool {
        matches!(result, Err(IpcError::CudaUnavailable { .. }))
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex<const N: usize>(text: &str) -> [u8; N] {
        let mut out = [0u8; N];
        assert_eq!(text.len(), 2 * N, "hex field {text:?}");
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex digit");
        }
        out
    }

    #[test]
    fn cuda_get_without_driver_is_unavailable_twice() {
        if CudaDriver::get().is_ok() {
            eprintln!("skipped: a CUDA driver is present");
            return;
        }
        let first = CudaDriver::get().expect_err("no driver");
        let second = CudaDriver::get().expect_err("no driver");
        match (first, second) {
            (IpcError::CudaUnavailable { reason: a }, IpcError::CudaUnavailable { reason: b }) => {
                assert!(!a.is_empty());
                assert_eq!(a, b, "the failure is cached");
                eprintln!("CUDA unavailable: {a}");
            }
            other => panic!("expected CudaUnavailable twice, got {other:?}"),
        }
        assert!(!is_available());
    }

    #[test]
    fn cuda_operations_without_driver_are_unavailable() {
        if CudaDriver::get().is_ok() {
            eprintln!("skipped: a CUDA driver is present");
            return;
        }
        let export = CudaExport {
            device_uuid: [7; 16],
            handle: [9; 64],
            base: 0x1000,
            alloc_size: 4096,
        };
        assert!(is_unavailable(export_pointer(0x1000, 16)));
        assert!(is_unavailable(import(&export)));
        assert!(is_unavailable(open_export(&export)));
        assert!(is_unavailable(wait_event(&[7; 16], &[9; 64], 0)));
        assert!(is_unavailable(ProducerEvent::record(0, 0)));
        assert!(is_unavailable(DeviceBuffer::alloc(0, 16)));
        assert_eq!(import_stats(), ImportStats::default());
    }

    #[test]
    fn cuda_load_from_missing_file_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("no-such-libcuda.so");
        match load_from(&path) {
            Err(IpcError::CudaUnavailable { reason }) => {
                assert!(reason.contains(&path.display().to_string()), "{reason}");
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
    }

    #[test]
    fn cuda_load_from_non_library_names_the_path() {
        let mut file = tempfile::NamedTempFile::new().expect("tempfile");
        file.write_all(b"this is not a CUDA driver\n")
            .expect("write");
        let path = file.path().to_path_buf();
        match load_from(&path) {
            Err(IpcError::CudaUnavailable { reason }) => {
                assert!(reason.contains(&path.display().to_string()), "{reason}");
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn cuda_load_from_other_library_names_the_missing_symbol() {
        // A real shared library that is not a CUDA driver: it loads, cuInit is missing.
        match load_from(Path::new("libc.so.6")) {
            Err(IpcError::CudaUnavailable { reason }) => {
                assert!(reason.contains("libc.so.6"), "{reason}");
                assert!(reason.contains("cuInit"), "{reason}");
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
    }

    #[test]
    fn cuda_offset_in_allocation_checks_the_range() {
        assert_eq!(
            offset_in_allocation(0x1100, 0x100, 0x1000, 0x1000).ok(),
            Some(0x100)
        );
        assert_eq!(
            offset_in_allocation(0x1000, 0x1000, 0x1000, 0x1000).ok(),
            Some(0)
        );
        assert_eq!(
            offset_in_allocation(0x2000, 0, 0x1000, 0x1000).ok(),
            Some(0x1000)
        );
        for (ptr, len) in [
            (0x1f00, 0x101),
            (0x0fff, 1),
            (0x2000, 1),
            (0x1000, u64::MAX),
        ] {
            match offset_in_allocation(ptr, len, 0x1000, 0x1000) {
                Err(IpcError::Tensor(tensorwire_core::Error::OutOfBounds { limit, .. })) => {
                    assert_eq!(limit, 0x1000);
                }
                other => panic!("{ptr:#x}+{len:#x}: expected OutOfBounds, got {other:?}"),
            }
        }
    }

    #[test]
    fn cuda_bounded_cache_drops_the_least_recently_used() {
        let mut cache = BoundedCache::new(2);
        assert!(cache.insert(1, "one").is_none());
        assert!(cache.insert(2, "two").is_none());
        assert_eq!(cache.get(&1), Some(&"one")); // 2 is now the oldest
        assert_eq!(cache.insert(3, "three"), Some("two"));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&2), None);
        assert_eq!(
            cache.insert(1, "uno"),
            Some("one"),
            "replacing does not evict"
        );
        assert_eq!(cache.get(&3), Some(&"three"));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn cuda_handle_bytes_round_trip() {
        let bytes: [u8; 64] = std::array::from_fn(|i| (i * 37 % 256) as u8);
        assert_eq!(to_bytes(to_chars(bytes)), bytes);
        assert!(stream_handle(0).expect("null stream").is_null());
        assert_eq!(stream_handle(0x1234).expect("stream").addr(), 0x1234);
        assert_eq!(
            format_uuid(&[0xab; 16]),
            "GPU-abababab-abab-abab-abab-abababababab"
        );
    }

    #[test]
    fn cuda_gpu_device_uuids_round_trip() {
        if no_gpu() {
            return;
        }
        let driver = CudaDriver::get().expect("driver");
        assert!(driver.driver_version().expect("version") > 0);
        let count = driver.device_count().expect("count");
        for ordinal in 0..count {
            let uuid = driver.device_uuid(ordinal).expect("uuid");
            assert_eq!(driver.device_by_uuid(&uuid).expect("by uuid"), ordinal);
        }
        assert!(is_unavailable(driver.device_by_uuid(&[0xee; 16])));
    }

    #[test]
    fn cuda_gpu_export_pointer_at_offset() {
        if no_gpu() {
            return;
        }
        let buffer = DeviceBuffer::alloc(0, 1 << 20).expect("alloc");
        let (export, offset) = export_pointer(buffer.device_ptr() + 4096, 256).expect("export");
        assert_eq!(offset, 4096);
        assert_eq!(export.base, buffer.device_ptr());
        assert!(export.alloc_size >= buffer.size());
        let uuid = CudaDriver::get()
            .expect("driver")
            .device_uuid(0)
            .expect("uuid");
        assert_eq!(export.device_uuid, uuid);
        let (again, _) = export_pointer(buffer.device_ptr(), 1).expect("export base");
        assert_eq!(again.base, export.base);

        let past_end = export_pointer(buffer.device_ptr() + export.alloc_size - 8, 16);
        assert!(
            matches!(past_end, Err(IpcError::Tensor(_))),
            "range leaving the allocation: {past_end:?}"
        );
        let host = [0u8; 16];
        let host_ptr = host.as_ptr().addr() as u64;
        assert!(
            export_pointer(host_ptr, 16).is_err(),
            "host memory is not exportable"
        );

        // Our own export, sent back: the memory itself, no IPC mapping opened.
        let before = import_stats();
        match open_export(&export).expect("own export") {
            Opened::Local(local) => {
                assert_eq!(local.ptr, buffer.device_ptr());
                assert_eq!(local.device_uuid, uuid);
            }
            Opened::Mapped(mapping) => panic!("our own memory was mapped: {mapping:?}"),
        }
        assert_eq!(import_stats(), before);
        // `import` itself never resolves our memory: CUDA refuses the handle here.
        match import(&export) {
            Err(IpcError::Cuda { call, .. }) => assert_eq!(call, "cuIpcOpenMemHandle"),
            Ok(mapping) => eprintln!("note: this driver opened a same-process handle: {mapping:?}"),
            Err(other) => panic!("unexpected error: {other}"),
        }

        // Once the allocation is freed, the handle no longer resolves: a clear error. (A
        // new allocation that takes the same address gets the same handle from the driver
        // — seen on an H200 with driver 580 — and would resolve; the Python decoder's
        // check for a live storage owning the memory is what refuses that.)
        let freed_base = buffer.device_ptr();
        drop(buffer);
        let driver = CudaDriver::get().expect("driver");
        let reused = {
            let ctx = PrimaryContext::retain(driver, 0).expect("context");
            let _guard = ctx.push().expect("push");
            driver.address_range(freed_base).is_ok()
        };
        if reused {
            eprintln!("note: another test's allocation took the freed address");
        } else {
            let err = open_export(&export).expect_err("freed memory resolved as ours");
            assert!(err.to_string().contains("freed"), "{err}");
        }
        assert_eq!(import_stats().live, before.live);
    }

    #[test]
    fn cuda_gpu_import_in_child_process() {
        if no_gpu() {
            return;
        }
        let mut buffer = DeviceBuffer::alloc(0, 1 << 20).expect("alloc");
        let pattern: Vec<u8> = (0..512u32).map(|i| (i * 7 + 3) as u8).collect();
        buffer.write(8192, &pattern).expect("write");
        let event = ProducerEvent::record(0, 0).expect("record event");
        let (export, offset) = export_pointer(buffer.device_ptr() + 8192, 512).expect("export");
        assert_eq!(offset, 8192);

        let payload = format!(
            "{}:{}:{}:{}:{}:{}:{}",
            hex(&export.device_uuid),
            hex(&export.handle),
            export.base,
            export.alloc_size,
            offset,
            pattern.len(),
            hex(&event.handle())
        );
        let exe = std::env::current_exe().expect("test binary");
        let output = Command::new(exe)
            .args(["cuda::tests::child_import_role", "--exact", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, payload)
            .output()
            .expect("spawn child");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "child failed:\n{stdout}\n{stderr}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("CHILD_BYTES=").map(|(_, bytes)| bytes))
            .unwrap_or_else(|| panic!("no CHILD_BYTES line:\n{stdout}\n{stderr}"));
        assert_eq!(line.trim(), hex(&pattern));
        drop(event);
        drop(buffer);
    }

    /// The child half of `cuda_gpu_import_in_child_process`; does nothing unless spawned by it.
    #[test]
    fn child_import_role() {
        let Ok(payload) = std::env::var(CHILD_ENV) else {
            return;
        };
        let fields: Vec<&str> = payload.split(':').collect();
        assert_eq!(fields.len(), 7, "payload {payload:?}");
        let number = |s: &str| s.parse::<u64>().expect("number");
        let export = CudaExport {
            device_uuid: unhex(fields[0]),
            handle: unhex(fields[1]),
            base: number(fields[2]),
            alloc_size: number(fields[3]),
        };
        let (offset, len) = (number(fields[4]), number(fields[5]));
        let event: [u8; 64] = unhex(fields[6]);

        let mapping = import(&export).expect("import");
        let again = import(&export).expect("import again");
        assert!(
            Arc::ptr_eq(&mapping, &again),
            "second import reuses the mapping"
        );
        assert_eq!(import_stats(), ImportStats { opened: 1, live: 1 });
        assert!(mapping.size() >= export.alloc_size);
        assert_eq!(mapping.device_uuid(), export.device_uuid);

        wait_event(&export.device_uuid, &event, 0).expect("wait event");
        wait_event(&export.device_uuid, &event, 0).expect("wait cached event");
        let mut bytes = vec![0u8; usize::try_from(len).expect("len")];
        mapping.read(offset, &mut bytes).expect("read");
        println!("CHILD_BYTES={}", hex(&bytes));

        // In the importing process, `open_export` maps (the handle is not ours).
        match open_export(&export).expect("open export") {
            Opened::Mapped(same) => assert!(Arc::ptr_eq(&same, &mapping)),
            Opened::Local(local) => panic!("another process's memory taken as ours: {local:?}"),
        }

        // Imported memory shared on goes out as the exporter's handle, at the same offset.
        let (again_out, again_offset) =
            export_pointer(mapping.device_ptr() + offset + 16, len - 16).expect("re-export");
        assert_eq!(again_out.handle, export.handle);
        assert_eq!(again_out.alloc_size, export.alloc_size);
        assert_eq!(again_offset, offset + 16);
        assert!(export_pointer(mapping.device_ptr() + export.alloc_size - 8, 16).is_err());

        drop(again);
        drop(mapping);
        assert_eq!(import_stats(), ImportStats { opened: 1, live: 0 });
        let reopened = import(&export).expect("import after close");
        assert_eq!(import_stats(), ImportStats { opened: 2, live: 1 });
        drop(reopened);

        // Threads importing and dropping the same handle at once: each import either shares a
        // live mapping or opens after the previous one has been closed, never in between.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..20 {
                        let mapping = import(&export).expect("concurrent import");
                        let mut first = [0u8; 1];
                        mapping.read(offset, &mut first).expect("concurrent read");
                        assert_eq!(first[0], bytes[0]);
                    }
                });
            }
        });
        assert_eq!(import_stats().live, 0);
    }
}
