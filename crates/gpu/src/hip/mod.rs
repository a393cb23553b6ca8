//! The HIP driver: ROCm's runtime (`libamdhip64`) and hipRTC (`libhiprtc`), loaded at run time through the
//! table in [`sys`], under the shared core ([`crate::device`]). Supported: ROCm 6.0 and later (7.x included). ROCm 5.x is refused as not available: its
//! device-property struct and (before 5.7) its VMM property struct have other layouts, and MI300X needs 6.x.
//!
//! A machine without ROCm gets [`GpuError::NotAvailable`] naming `libamdhip64`, never a panic; so does one
//! whose runtime loads but sees no device. Handles are HIP's own pointers (`hipStream_t`, `hipEvent_t`,
//! `hipModule_t`, `hipFunction_t`, `hipGraphExec_t`) as integers; every one is kept in a live set, so a stale or
//! foreign handle is refused instead of reaching the runtime. Every method makes the device current on the
//! calling thread first (HIP's current device is per thread), so the driver may be used from any thread.
//!
//! Memory kinds: [`MemKind::Ipc`] with `uncached` takes `hipExtMallocWithFlags(hipDeviceMallocUncached)`
//! (fine-grained, uncached: what upstream car allocates), without it plain `hipMalloc` (coarse-grained);
//! [`MemKind::Device`] is `hipMalloc`. VMM allocations are `hipMemCreate` of the pinned type, coarse-grained too.
//! IPC and VMM allocations are whole multiples of [`SHARE_UNIT`] (or of a larger runtime granularity), as on CUDA,
//! and VMM methods are refused on a device that reports no VMM support. Nothing here multicasts.

mod hiprtc;
mod raw;
mod runtime;
mod sys;

use crate::device::Device;
use crate::{c_buf_text, pick_ordinal, DeviceInfo, Driver, DriverKind, DriverOptions, GpuError, Result};
use hiprtc::Hiprtc;
use runtime::Runtime;
use std::ffi::{c_char, c_int, CStr};
use std::ptr::null_mut;
use std::sync::Arc;

fn not_available(reason: String) -> GpuError {
    GpuError::NotAvailable { backend: "hip", reason }
}

/// `hipMemGetAccess` answers for VMM mappings only from ROCm 6.1 on (6.0's returns success for any address), and
/// share_range needs it to tell VMM memory apart before it may call `hipMemRetainAllocationHandle`, which crashes
/// on other memory in the ROCm releases before the fix of rocm-systems#5807 (2026).
fn vmm_query_works(version: (u32, u32, u32)) -> bool {
    (version.0, version.1) >= (6, 1)
}

/// `hipMemImportFromShareableHandle` takes a POSIX descriptor's value cast to a pointer from ROCm 7.1 on (as
/// CUDA does); before, a pointer to the `int` holding it (PyTorch's symmetric memory makes the same switch).
fn fd_passed_by_value(version: (u32, u32, u32)) -> bool {
    (version.0, version.1) >= (7, 1)
}

/// The processor of a target ID: `gfx942` of `gfx942:sramecc+:xnack-`. `None` unless it is `gfx` + digits and
/// lower-case letters.
fn processor(target_id: &str) -> Option<&str> {
    let p = target_id.split(':').next()?.trim();
    let rest = p.strip_prefix("gfx")?;
    (!rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())).then_some(p)
}

/// `bytes` rounded up to a multiple of `granularity` (0 counts as 1); `None` on overflow. At least one unit.
fn round_up(bytes: usize, granularity: usize) -> Option<usize> {
    let g = granularity.max(1);
    bytes.max(1).div_ceil(g).checked_mul(g)
}

/// The least size unit of memory peers map (IPC and VMM allocations), as on CUDA, where peers read other sizes slowly;
/// ROCm's recommended VMM granularity alone can be as small as a page (docs/rocm.md).
const SHARE_UNIT: usize = 2 << 20;

/// What shared allocations are rounded to and VMM reservations aligned to: [`SHARE_UNIT`], or the runtime's VMM
/// granularity where that is larger (granularities are powers of two, so either is a multiple of the other).
fn share_unit(granularity: usize) -> usize {
    SHARE_UNIT.max(granularity)
}

/// Why VMM allocations are refused on a device without VMM support.
const NO_VMM: &str = "this device reports no virtual memory management support \
                      (hipDeviceAttributeVirtualMemoryManagementSupported is 0), so it can neither create nor map VMM \
                      allocations (hipMemCreate); only classic IPC memory can be shared here";

fn device_location(ordinal: c_int) -> sys::hipMemLocation {
    sys::hipMemLocation { type_: sys::hipMemLocationTypeDevice, id: ordinal }
}

/// Pinned device memory on device `ordinal`, shareable as a POSIX file descriptor.
fn vmm_prop(ordinal: c_int) -> sys::hipMemAllocationProp {
    sys::hipMemAllocationProp {
        type_: sys::hipMemAllocationTypePinned,
        requestedHandleType: sys::hipMemHandleTypePosixFileDescriptor,
        location: device_location(ordinal),
        win32HandleMetaData: null_mut(),
        allocFlags: sys::hipMemAllocFlags::default(),
    }
}

/// Opens the HIP driver on the device `opts` picks.
pub(crate) fn open(opts: &DriverOptions) -> Result<Arc<dyn Driver>> {
    let rt = Runtime::load().map_err(not_available)?;
    Ok(Arc::new(Device::new(Hip::new(opts, rt)?)?))
}

/// One HIP device and what its calls need.
pub(crate) struct Hip {
    info: DeviceInfo,
    ordinal: c_int,
    /// What `hipDeviceGet` returned for it, which `hipStreamGetDevice` reports.
    device: sys::hipDevice_t,
    /// The device's full target ID (`gfx942:sramecc+:xnack-`), what hipRTC compiles for.
    target_id: String,
    /// Whether the device supports VMM (`hipMemCreate` and the mapping calls).
    vmm: bool,
    /// The size unit of shared allocations and the alignment of VMM reservations ([`share_unit`]).
    share_unit: usize,
    rt: Runtime,
    /// hipRTC, or why it is not here (only module_load needs it).
    rtc: std::result::Result<Hiprtc, String>,
}

// SAFETY: the raw pointers (memory, and the handles kept as integers) are only used through the HIP runtime,
// which is thread-safe; each call sets the device on its thread.
unsafe impl Send for Hip {}
// SAFETY: as above.
unsafe impl Sync for Hip {}

impl Hip {
    fn new(opts: &DriverOptions, rt: Runtime) -> Result<Hip> {
        let api = &rt.api;
        // SAFETY: hipInit may be called any number of times, from any thread.
        rt.ck("hipInit", unsafe { (api.hipInit)(0) })
            .map_err(|e| not_available(format!("{}: {e}", rt.path.display())))?;
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        let status = unsafe { (api.hipGetDeviceCount)(&mut count) };
        if status == sys::hipErrorNoDevice || status == sys::hipErrorInsufficientDriver {
            return Err(not_available(format!(
                "{} loads but sees no device: {}",
                rt.path.display(),
                rt.ck("hipGetDeviceCount", status).unwrap_err()
            )));
        }
        rt.ck("hipGetDeviceCount", status)?;
        if count <= 0 {
            return Err(not_available(format!("{} loads but sees no device", rt.path.display())));
        }
        let ordinal = pick_ordinal(opts, count as usize)?;
        let dev_ord = ordinal as c_int;
        // SAFETY: the ordinal is below the count.
        rt.ck("hipSetDevice", unsafe { (api.hipSetDevice)(dev_ord) })?;
        let mut device: sys::hipDevice_t = 0;
        // SAFETY: writes one device.
        rt.ck("hipDeviceGet", unsafe { (api.hipDeviceGet)(&mut device, dev_ord) })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds the length passed.
        rt.ck("hipDeviceGetName", unsafe { (api.hipDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, device) })?;
        let name = c_buf_text(&name);
        let mut bus = [0 as c_char; 64];
        // SAFETY: the buffer holds the length passed (an id is 12 characters and a NUL).
        rt.ck("hipDeviceGetPCIBusId", unsafe {
            (api.hipDeviceGetPCIBusId)(bus.as_mut_ptr(), bus.len() as c_int, dev_ord)
        })?;
        let bus_id = c_buf_text(&bus).to_ascii_lowercase();
        let mut cus: c_int = 0;
        // SAFETY: writes one int.
        rt.ck("hipDeviceGetAttribute", unsafe {
            (api.hipDeviceGetAttribute)(&mut cus, sys::hipDeviceAttributeMultiprocessorCount, dev_ord)
        })?;
        let mut vmm: c_int = 0;
        // SAFETY: writes one int.
        rt.ck("hipDeviceGetAttribute", unsafe {
            (api.hipDeviceGetAttribute)(&mut vmm, sys::hipDeviceAttributeVirtualMemoryManagementSupported, dev_ord)
        })?;
        let vmm = vmm != 0;
        // Without VMM the granularity query may fail, and only IPC allocations (rounded to SHARE_UNIT) are made.
        let granularity = if vmm { Self::vmm_granularity(&rt, dev_ord)? } else { 0 };
        let target_id = Self::target_id(&rt, dev_ord)?;
        let arch = processor(&target_id)
            .ok_or_else(|| GpuError::Driver {
                call: "hipGetDevicePropertiesR0600",
                code: 0,
                msg: format!("gcnArchName {target_id:?} is not a gfx target ID"),
            })?
            .to_string();
        let rtc = Hiprtc::load(&rt);
        Ok(Hip {
            info: DeviceInfo {
                kind: DriverKind::Hip,
                name,
                ordinal,
                count: count as usize,
                arch,
                multiprocessors: cus.max(1) as usize,
                size_align: 512,
                bus_id,
                driver_version: format!("HIP {}.{}.{}", rt.version.0, rt.version.1, rt.version.2),
            },
            ordinal: dev_ord,
            device,
            target_id,
            vmm,
            share_unit: share_unit(granularity),
            rt,
            rtc,
        })
    }

    /// The device's `gcnArchName` (no attribute query returns it). The struct is filled into a buffer with
    /// room to spare, so a runtime that writes more than the 6.x layout cannot overrun it.
    fn target_id(rt: &Runtime, device: c_int) -> Result<String> {
        #[repr(C)]
        struct Padded {
            props: sys::hipDeviceProp_tR0600,
            _spare: [u8; 4096],
        }
        // SAFETY: all-zero bytes are a valid value of this plain C struct (integers, arrays, null pointers).
        let mut buf: Box<Padded> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: writes one hipDeviceProp_tR0600 into `buf`, which is larger.
        rt.ck("hipGetDevicePropertiesR0600", unsafe { (rt.api.hipGetDevicePropertiesR0600)(&mut buf.props, device) })?;
        let raw = &mut buf.props.gcnArchName;
        raw[raw.len() - 1] = 0;
        // SAFETY: NUL-terminated just above at the latest.
        Ok(unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy().trim().to_string())
    }

    /// The recommended VMM granularity of device `ordinal`.
    fn vmm_granularity(rt: &Runtime, ordinal: c_int) -> Result<usize> {
        let prop = vmm_prop(ordinal);
        let mut gran = 0usize;
        // SAFETY: `prop` is a complete allocation description; writes one size.
        rt.ck("hipMemGetAllocationGranularity", unsafe {
            (rt.api.hipMemGetAllocationGranularity)(&mut gran, &prop, sys::hipMemAllocationGranularityRecommended)
        })?;
        Ok(gran)
    }
}

#[cfg(test)]
mod tests {
    use super::runtime::{decode_version, HIP_LIBRARY};
    use super::*;
    use crate::Backend;

    fn opts() -> DriverOptions {
        DriverOptions { device: None, local_rank: None, shm_prefix: String::new() }
    }

    #[test]
    fn open_without_rocm_is_not_available_naming_libamdhip64() {
        match open(&opts()) {
            Ok(d) => assert_eq!(d.info().kind, DriverKind::Hip),
            Err(GpuError::NotAvailable { backend, reason }) => {
                assert_eq!(backend, "hip");
                if Runtime::load().is_err() {
                    assert!(reason.contains(HIP_LIBRARY), "{reason}");
                }
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        // Through the public entry point too; `auto` passes over it with a note.
        match crate::open(Backend::Hip, &opts()) {
            Ok(o) => assert_eq!(o.gpu.kind(), DriverKind::Hip),
            Err(e) => assert!(matches!(e, GpuError::NotAvailable { backend: "hip", .. }), "{e}"),
        }
        let auto = crate::open(Backend::Auto, &opts()).expect("auto always opens something");
        if auto.gpu.kind() != DriverKind::Hip {
            assert!(auto.notes.iter().any(|n| n.starts_with("hip: ")), "{:?}", auto.notes);
        }
    }

    #[test]
    fn target_ids_reduce_to_their_processor() {
        assert_eq!(processor("gfx942:sramecc+:xnack-"), Some("gfx942"));
        assert_eq!(processor("gfx90a:sramecc+:xnack-"), Some("gfx90a"));
        assert_eq!(processor("gfx1100"), Some("gfx1100"));
        assert_eq!(processor(" gfx942 "), Some("gfx942"));
        assert_eq!(processor(""), None);
        assert_eq!(processor("gfx"), None);
        assert_eq!(processor("sm_90"), None);
        assert_eq!(processor("gfx94-2:xnack+"), None);
    }

    #[test]
    fn shared_allocations_come_in_whole_units_of_at_least_2_mib() {
        assert_eq!(share_unit(4096), 2 << 20, "a page-sized granularity");
        assert_eq!(share_unit(0), 2 << 20, "no VMM, no granularity");
        assert_eq!(share_unit(2 << 20), 2 << 20);
        assert_eq!(share_unit(8 << 20), 8 << 20, "a larger granularity wins");
        assert_eq!(round_up(12 << 10, share_unit(4096)), Some(2 << 20), "a flag array takes a whole unit");
    }

    #[test]
    fn vmm_sizes_round_up_to_the_granularity() {
        assert_eq!(round_up(1, 2 << 20), Some(2 << 20));
        assert_eq!(round_up(2 << 20, 2 << 20), Some(2 << 20));
        assert_eq!(round_up((2 << 20) + 1, 2 << 20), Some(4 << 20));
        assert_eq!(round_up(0, 4096), Some(4096), "at least one unit");
        assert_eq!(round_up(100, 0), Some(100), "a zero granularity counts as one byte");
        assert_eq!(round_up(usize::MAX, 4096), None);
    }

    #[test]
    fn versions_decode_and_pick_the_fd_convention() {
        assert_eq!(decode_version(60_241_134), (6, 2, 41134));
        assert_eq!(decode_version(70_151_831), (7, 1, 51831));
        assert_eq!(decode_version(-1), (0, 0, 0));
        assert!(!fd_passed_by_value((6, 4, 43484)));
        assert!(!fd_passed_by_value((7, 0, 51831)));
        assert!(fd_passed_by_value((7, 1, 52802)));
        assert!(fd_passed_by_value((8, 0, 0)));
    }
}
