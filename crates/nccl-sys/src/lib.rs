//! The NCCL ABI, which RCCL exports under the same symbol names, loaded at run time with `libloading`.
//!
//! No crate on crates.io carries this table, so it is written out here from `nccl.h`. Nothing links at build
//! time: a machine without NCCL builds and runs everything else, and [`NcclLib::load`] says plainly why it
//! cannot open the library.

// The C names are kept so each item can be looked up in nccl.h as written.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::mem::ManuallyDrop;

/// Status of every NCCL call; `ncclSuccess` is 0.
pub type ncclResult_t = c_int;
pub const ncclSuccess: ncclResult_t = 0;
/// The caller used the library wrongly (here: a call on a communicator that was aborted).
pub const ncclInvalidUsage: ncclResult_t = 5;
/// A non-blocking communicator's operation has not finished: poll `ncclCommGetAsyncError` until it says otherwise.
pub const ncclInProgress: ncclResult_t = 7;

/// `ncclDataType_t` is a C enum, passed as an `int`.
pub type ncclDataType_t = c_int;
pub const ncclFloat16: ncclDataType_t = 6;
pub const ncclFloat32: ncclDataType_t = 7;
pub const ncclBfloat16: ncclDataType_t = 9;

/// `ncclRedOp_t` is a C enum, passed as an `int`.
pub type ncclRedOp_t = c_int;
pub const ncclSum: ncclRedOp_t = 0;

/// `winFlags` of [`ncclCommWindowRegisterFn`]: every rank registers a buffer of the same layout, which lets
/// NCCL pick its symmetric-memory kernels.
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;

pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// The bootstrap id one rank creates and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [u8; NCCL_UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    pub fn zeroed() -> ncclUniqueId {
        ncclUniqueId { internal: [0; NCCL_UNIQUE_ID_BYTES] }
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.internal
    }
    /// The id another rank sent; `None` unless `bytes` is exactly one id long.
    pub fn from_bytes(bytes: &[u8]) -> Option<ncclUniqueId> {
        Some(ncclUniqueId { internal: bytes.try_into().ok()? })
    }
}

/// `NCCL_CONFIG_UNDEF_INT`: a field NCCL fills with its default.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `ncclConfig_t` as NCCL 2.14 declared it, the first version with a config. NCCL copies `size` bytes of it and
/// gives every field a later version added its default, by `version`, so this prefix stays valid on newer libraries
/// (RCCL keeps the same prefix).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
}

impl ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER` of NCCL 2.14 with `blocking = 0`: calls on the communicator return at once
    /// (`ncclInProgress`) and the caller polls, so every wait can have a deadline and end in `ncclCommAbort`.
    pub fn non_blocking() -> ncclConfig_t {
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: 0xcafe_beef,
            version: 21400,
            blocking: 0,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            netName: std::ptr::null(),
        }
    }
}

impl fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ncclUniqueId({} bytes)", NCCL_UNIQUE_ID_BYTES)
    }
}

/// Behind `ncclComm_t`; never built on the Rust side.
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}
pub type ncclComm_t = *mut ncclComm;

/// Behind `ncclWindow_t`; never built on the Rust side.
#[repr(C)]
pub struct ncclWindow {
    _opaque: [u8; 0],
}
pub type ncclWindow_t = *mut ncclWindow;

/// `cudaStream_t` / `hipStream_t`.
pub type ncclStream_t = *mut c_void;

pub type ncclGetVersionFn = unsafe extern "C" fn(version: *mut c_int) -> ncclResult_t;
pub type ncclGetUniqueIdFn = unsafe extern "C" fn(id: *mut ncclUniqueId) -> ncclResult_t;
pub type ncclCommInitRankFn =
    unsafe extern "C" fn(comm: *mut ncclComm_t, nranks: c_int, id: ncclUniqueId, rank: c_int) -> ncclResult_t;
/// NCCL >= 2.14.
pub type ncclCommInitRankConfigFn = unsafe extern "C" fn(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t;
pub type ncclCommDestroyFn = unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t;
pub type ncclCommAbortFn = unsafe extern "C" fn(comm: ncclComm_t) -> ncclResult_t;
pub type ncclCommGetAsyncErrorFn = unsafe extern "C" fn(comm: ncclComm_t, error: *mut ncclResult_t) -> ncclResult_t;
pub type ncclGetErrorStringFn = unsafe extern "C" fn(result: ncclResult_t) -> *const c_char;
pub type ncclAllReduceFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: ncclStream_t,
) -> ncclResult_t;
/// `recvcount` is the number of elements each rank receives.
pub type ncclReduceScatterFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: ncclStream_t,
) -> ncclResult_t;
/// `sendcount` is the number of elements each rank sends; `recvbuff` receives `nranks * sendcount`, in rank order.
pub type ncclAllGatherFn = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: ncclStream_t,
) -> ncclResult_t;
pub type ncclMemAllocFn = unsafe extern "C" fn(ptr: *mut *mut c_void, size: usize) -> ncclResult_t;
pub type ncclMemFreeFn = unsafe extern "C" fn(ptr: *mut c_void) -> ncclResult_t;
pub type ncclCommWindowRegisterFn = unsafe extern "C" fn(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t;
pub type ncclCommWindowDeregisterFn = unsafe extern "C" fn(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t;

/// Which vendor's library to open; both export the NCCL ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// NVIDIA's NCCL, for the cuda driver.
    Nccl,
    /// AMD's RCCL, for the hip driver.
    Rccl,
}

impl Flavor {
    /// The names tried in order: the versioned soname first, as the runtime packages ship only that.
    pub fn libraries(self) -> &'static [&'static str] {
        match self {
            Flavor::Nccl => &["libnccl.so.2", "libnccl.so"],
            Flavor::Rccl => &["librccl.so.1", "librccl.so"],
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Nccl => "NCCL",
            Flavor::Rccl => "RCCL",
        }
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The library could not be opened, or lacks a symbol every supported version has.
#[derive(Debug, thiserror::Error)]
#[error("cannot load {library}: {reason}")]
pub struct LoadError {
    pub library: String,
    pub reason: String,
}

/// A failed NCCL call: the call's name, its status and NCCL's text for it.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed: {msg} (ncclResult_t {code})")]
pub struct NcclError {
    pub call: &'static str,
    pub code: ncclResult_t,
    pub msg: String,
}

/// Decodes `ncclGetVersion`'s code: `major*10000 + minor*100 + patch` since 2.9, `major*1000 + minor*100 +
/// patch` before (the oldest 2.x codes are below 10000).
pub fn decode_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 10000 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    }
}

/// The opened library and its entry points.
///
/// The fn pointers point into the library, which this struct keeps mapped; call them only through an
/// `NcclLib` that is still alive.
pub struct NcclLib {
    /// Never unloaded: NCCL leaves threads and CUDA/HIP callbacks behind that would run unmapped code after a
    /// `dlclose`.
    _library: ManuallyDrop<Library>,
    library: String,
    version: (u32, u32, u32),
    pub ncclGetVersion: ncclGetVersionFn,
    pub ncclGetUniqueId: ncclGetUniqueIdFn,
    pub ncclCommInitRank: ncclCommInitRankFn,
    /// NCCL >= 2.14 (RCCL of ROCm 5.4+): the non-blocking initialisation.
    pub ncclCommInitRankConfig: Option<ncclCommInitRankConfigFn>,
    pub ncclCommDestroy: ncclCommDestroyFn,
    pub ncclCommAbort: ncclCommAbortFn,
    pub ncclCommGetAsyncError: ncclCommGetAsyncErrorFn,
    pub ncclGetErrorString: ncclGetErrorStringFn,
    pub ncclAllReduce: ncclAllReduceFn,
    pub ncclReduceScatter: ncclReduceScatterFn,
    pub ncclAllGather: ncclAllGatherFn,
    /// NCCL >= 2.19 (and recent RCCL).
    pub ncclMemAlloc: Option<ncclMemAllocFn>,
    pub ncclMemFree: Option<ncclMemFreeFn>,
    /// NCCL >= 2.27.
    pub ncclCommWindowRegister: Option<ncclCommWindowRegisterFn>,
    pub ncclCommWindowDeregister: Option<ncclCommWindowDeregisterFn>,
}

impl fmt::Debug for NcclLib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclLib").field("library", &self.library).field("version", &self.version).finish()
    }
}

/// Copies one symbol out of `lib`.
///
/// # Safety
/// `T` must be the fn pointer type of the C declaration of `symbol`.
unsafe fn symbol<T: Copy>(lib: &Library, symbol: &str) -> Result<T, libloading::Error> {
    // SAFETY: the caller vouches for the type; the copied pointer stays valid while `lib` is mapped.
    Ok(unsafe { *lib.get::<T>(symbol.as_bytes())? })
}

impl NcclLib {
    /// Opens the library of `flavor`, trying its names in order.
    pub fn load(flavor: Flavor) -> Result<NcclLib, LoadError> {
        NcclLib::open(flavor.libraries())
    }

    /// Opens the first of `names` that loads (a soname searched on the loader's path, or a path).
    pub fn open(names: &[&str]) -> Result<NcclLib, LoadError> {
        let mut failures = Vec::new();
        for &name in names {
            // SAFETY: opening NCCL runs its initialisers, which using it requires anyway.
            match unsafe { Library::new(name) } {
                Ok(lib) => return NcclLib::bind(lib, name),
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        Err(LoadError {
            library: names.join(" or "),
            reason: if failures.is_empty() { "no library name given".into() } else { failures.join("; ") },
        })
    }

    fn bind(lib: Library, name: &str) -> Result<NcclLib, LoadError> {
        let missing = |sym: &str, e: libloading::Error| LoadError {
            library: name.to_string(),
            reason: format!("missing symbol {sym}: {e}"),
        };
        macro_rules! required {
            ($sym:ident) => {
                // SAFETY: the field's type is the fn pointer type of the declaration in nccl.h.
                unsafe { symbol(&lib, stringify!($sym)) }.map_err(|e| missing(stringify!($sym), e))?
            };
        }
        macro_rules! optional {
            ($sym:ident) => {
                // SAFETY: as for `required!`.
                unsafe { symbol(&lib, stringify!($sym)) }.ok()
            };
        }
        let ncclGetVersion: ncclGetVersionFn = required!(ncclGetVersion);
        let mut code: c_int = 0;
        // SAFETY: ncclGetVersion writes one int.
        let status = unsafe { ncclGetVersion(&mut code) };
        if status != ncclSuccess {
            return Err(LoadError { library: name.to_string(), reason: format!("ncclGetVersion returned {status}") });
        }
        Ok(NcclLib {
            library: name.to_string(),
            version: decode_version(code),
            ncclGetVersion,
            ncclGetUniqueId: required!(ncclGetUniqueId),
            ncclCommInitRank: required!(ncclCommInitRank),
            ncclCommInitRankConfig: optional!(ncclCommInitRankConfig),
            ncclCommDestroy: required!(ncclCommDestroy),
            ncclCommAbort: required!(ncclCommAbort),
            ncclCommGetAsyncError: required!(ncclCommGetAsyncError),
            ncclGetErrorString: required!(ncclGetErrorString),
            ncclAllReduce: required!(ncclAllReduce),
            ncclReduceScatter: required!(ncclReduceScatter),
            ncclAllGather: required!(ncclAllGather),
            ncclMemAlloc: optional!(ncclMemAlloc),
            ncclMemFree: optional!(ncclMemFree),
            ncclCommWindowRegister: optional!(ncclCommWindowRegister),
            ncclCommWindowDeregister: optional!(ncclCommWindowDeregister),
            _library: ManuallyDrop::new(lib),
        })
    }

    /// The name the library was opened under.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// (major, minor, patch) as `ncclGetVersion` reported it when the library was opened.
    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    /// NCCL's text for a status.
    pub fn error_string(&self, result: ncclResult_t) -> String {
        // SAFETY: ncclGetErrorString takes any value and returns a static string or null.
        let text = unsafe { (self.ncclGetErrorString)(result) };
        if text.is_null() {
            return format!("unknown ncclResult_t {result}");
        }
        // SAFETY: non-null results are NUL-terminated static strings.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }

    /// `Err` naming `call` and NCCL's text unless `result` is `ncclSuccess`.
    pub fn check(&self, result: ncclResult_t, call: &'static str) -> Result<(), NcclError> {
        if result == ncclSuccess {
            Ok(())
        } else {
            Err(NcclError { call, code: result, msg: self.error_string(result) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    #[test]
    fn missing_library_is_a_load_error_naming_it() {
        let err = NcclLib::open(&["libnccl-not-here.so.7"]).unwrap_err();
        assert_eq!(err.library, "libnccl-not-here.so.7");
        assert!(err.to_string().contains("libnccl-not-here.so.7"), "{err}");
        let err = NcclLib::open(&["libnope-a.so", "libnope-b.so"]).unwrap_err();
        assert!(err.reason.contains("libnope-a.so") && err.reason.contains("libnope-b.so"), "{err}");
        assert!(NcclLib::open(&[]).is_err());
    }

    #[test]
    fn load_by_flavor_names_the_sonames_when_absent() {
        for flavor in [Flavor::Nccl, Flavor::Rccl] {
            if let Err(err) = NcclLib::load(flavor) {
                assert!(err.library.contains(flavor.libraries()[0]), "{err}");
            }
        }
    }

    #[test]
    fn a_library_without_nccl_symbols_is_refused() {
        // libc is loaded in every process and has no NCCL entry points.
        let err = NcclLib::open(&["libc.so.6"]).unwrap_err();
        assert_eq!(err.library, "libc.so.6");
        assert!(err.reason.contains("ncclGetVersion"), "{err}");
    }

    #[test]
    fn versions_decode() {
        assert_eq!(decode_version(22703), (2, 27, 3));
        assert_eq!(decode_version(21805), (2, 18, 5));
        assert_eq!(decode_version(20900), (2, 9, 0));
        assert_eq!(decode_version(2804), (2, 8, 4));
        assert_eq!(decode_version(-1), (0, 0, 0));
    }

    #[test]
    fn abi_sizes() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        assert_eq!(align_of::<ncclUniqueId>(), 1);
        assert_eq!(size_of::<ncclComm_t>(), size_of::<*mut c_void>());
        assert_eq!(size_of::<ncclWindow_t>(), size_of::<*mut c_void>());
        assert_eq!(size_of::<ncclResult_t>(), 4);
        assert_eq!(size_of::<ncclDataType_t>(), 4);
        // nccl.h 2.14: size_t, two unsigned ints, four ints, a pointer.
        assert_eq!(size_of::<ncclConfig_t>(), 40);
        assert_eq!(ncclConfig_t::non_blocking().size, 40);
        let id = ncclUniqueId { internal: [7; 128] };
        assert_eq!(ncclUniqueId::from_bytes(id.as_bytes()).unwrap().internal, [7; 128]);
        assert!(ncclUniqueId::from_bytes(&[0; 127]).is_none());
    }
}
