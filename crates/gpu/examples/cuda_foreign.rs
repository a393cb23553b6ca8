//! A CUDA-only check of what a framework hands the library: streams and memory made outside the driver (here
//! with raw driver calls, as PyTorch would), through `borrow_stream` and `share_range`. `gpu_smoke` covers the
//! driver's own streams and memory; this covers the paths only foreign ones take: a stream of another context
//! refused, cuMemAlloc memory shared at an offset and read by a child process, VMM chunks of one reservation
//! (exported with their POSIX fd, or refused without it), pool memory, and addresses no allocator knows.
//!
//! `cargo run -p gpu --example cuda_foreign -- [--device N]`; exits non-zero on any mismatch or driver error.

use cudarc::driver::sys as cu;
use gpu::{open, Backend, DevicePtr, DriverOptions, Gpu, GpuError, MemKind, ShareHandle};
use std::ffi::c_void;
use std::process::ExitCode;
use std::ptr::null_mut;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The size of the cuMemAlloc allocation a child process maps.
const ALLOC: usize = 8 << 20;
/// Where in it the shared range starts, and how long the range is.
const OFFSET: usize = 4096;
const LEN: usize = 1000;

fn ck(call: &str, status: cu::CUresult) -> Res<()> {
    if status == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {status:?}").into())
    }
}

fn check(ok: bool, what: &str) -> Res<()> {
    if ok {
        println!("  ok    {what}");
        Ok(())
    } else {
        Err(format!("MISMATCH: {what}").into())
    }
}

/// The byte the parent writes at `i` of the shared range.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(13).wrapping_add(5) % 251) as u8
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda_foreign: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let device = match args.iter().position(|a| a == "--device") {
        Some(i) => Some(args.get(i + 1).ok_or("--device needs an ordinal")?.parse()?),
        None => None,
    };
    let opts = DriverOptions { device, local_rank: None, shm_prefix: format!("/arx-foreign{}", std::process::id()) };
    let gpu = open(Backend::Cuda, &opts)?.gpu;
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(&gpu, args.get(i + 1).ok_or("--child needs a hex handle")?);
    }
    println!("cuda device {} ({}), bus {}", gpu.info().ordinal, gpu.info().name, gpu.info().bus_id);
    check(
        gpu.info().bus_id.len() >= 12 && gpu.info().bus_id == gpu.info().bus_id.to_lowercase(),
        "a lower-case bus id",
    )?;
    streams(&gpu)?;
    alloc_memory(&gpu, device)?;
    vmm_memory(&gpu)?;
    other_memory(&gpu)?;
    println!("all checks passed");
    Ok(())
}

/// Maps the parent's allocation, checks the range at OFFSET and overwrites it with 0x77.
fn child(gpu: &Gpu, hex: &str) -> Res<()> {
    let handle =
        (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)).collect::<Result<Vec<_>, _>>()?;
    let s = gpu.stream()?;
    let mapped = gpu.ipc_import(&handle, ALLOC)?;
    let mut out = vec![0u8; LEN];
    s.download(&mapped, OFFSET, &mut out)?;
    if out.iter().enumerate().any(|(i, &x)| x != pattern(i)) {
        return Err("child: the range does not hold the parent's bytes".into());
    }
    // SAFETY: this check's own buffers, sized for the call.
    unsafe { s.memset(mapped.ptr().offset(OFFSET), 0x77, LEN)? };
    s.sync()?;
    Ok(())
}

fn streams(gpu: &Gpu) -> Res<()> {
    println!("streams:");
    let own = gpu.stream()?;
    let buf = gpu.alloc(1 << 20, MemKind::Device)?;
    let mut s: cu::CUstream = null_mut();
    // SAFETY: writes one stream, in the primary context the driver made current.
    ck("cuStreamCreate", unsafe { cu::cuStreamCreate(&mut s, 0) })?;
    for raw in [s as u64, 0, 2] {
        // SAFETY: a live stream of the primary context and the default streams, each outliving its borrow.
        let b = unsafe { gpu.borrow_stream(raw)? };
        // SAFETY: this check's own buffers, sized for the call.
        unsafe { b.memset(buf.ptr(), raw as u8 + 1, 1 << 20)? };
        b.sync()?;
        drop(b);
        let mut out = vec![0u8; 1 << 20];
        own.download(&buf, 0, &mut out)?;
        check(out.iter().all(|&x| x == raw as u8 + 1), &format!("a memset through borrowed stream {raw:#x}"))?;
    }
    // SAFETY: the stream outlived its borrow, which must have left it alive; destroyed once.
    unsafe {
        ck("cuStreamSynchronize", cu::cuStreamSynchronize(s))?;
        ck("cuStreamDestroy", cu::cuStreamDestroy_v2(s))?;
    }
    let (mut dev, mut ctx, mut theirs): (cu::CUdevice, cu::CUcontext, cu::CUstream) = (0, null_mut(), null_mut());
    // SAFETY: a context of our own on the same device, current on this thread, and one stream in it.
    unsafe {
        ck("cuDeviceGet", cu::cuDeviceGet(&mut dev, gpu.info().ordinal as i32))?;
        ck("cuCtxCreate", cu::cuCtxCreate_v4(&mut ctx, null_mut(), 0, dev))?;
        ck("cuStreamCreate", cu::cuStreamCreate(&mut theirs, 0))?;
    }
    // SAFETY: a live stream; the driver refuses it without using it.
    let refused = unsafe { gpu.borrow_stream(theirs as u64) };
    // SAFETY: the stream and context made above, destroyed once.
    unsafe {
        ck("cuStreamDestroy", cu::cuStreamDestroy_v2(theirs))?;
        ck("cuCtxDestroy", cu::cuCtxDestroy_v2(ctx))?;
    }
    match refused {
        Err(GpuError::BadArgs(m)) => check(m.contains("context"), &format!("a stream of another context: {m}")),
        Err(e) => Err(format!("a stream of another context: wrong error {e}").into()),
        Ok(_) => Err("a stream of another context was adopted".into()),
    }
}

/// cuMemAlloc memory made outside the driver, shared at an offset, read and written by a child process.
fn alloc_memory(gpu: &Gpu, device: Option<usize>) -> Res<()> {
    println!("cuMemAlloc memory:");
    gpu.stream()?.sync()?;
    let mut p: cu::CUdeviceptr = 0;
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    // SAFETY: one allocation in the primary context (current after the driver's call above), then LEN bytes
    // written inside it.
    unsafe {
        ck("cuMemAlloc", cu::cuMemAlloc_v2(&mut p, ALLOC))?;
        ck("cuMemcpyHtoD", cu::cuMemcpyHtoD_v2(p + OFFSET as u64, data.as_ptr() as *const c_void, LEN))?;
    }
    let r = gpu.share_range(DevicePtr(p + OFFSET as u64), LEN)?;
    check(r.base.0 == p && r.offset == OFFSET && r.alloc_bytes == ALLOC, &format!("its base, size and offset: {r:?}"))?;
    let ShareHandle::Ipc(handle) = r.handle else { return Err("cuMemAlloc memory must be shared by IPC".into()) };
    let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
    let mut child = std::process::Command::new(std::env::current_exe()?);
    child.args(["--child", &hex]);
    if let Some(d) = device {
        child.args(["--device", &d.to_string()]);
    }
    check(child.status()?.success(), "a child imports it with alloc_bytes and reads the range at the offset")?;
    let mut back = vec![0u8; LEN];
    // SAFETY: reads LEN bytes inside the allocation into `back`, then frees it once.
    unsafe {
        ck("cuMemcpyDtoH", cu::cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p + OFFSET as u64, LEN))?;
    }
    check(back.iter().all(|&x| x == 0x77), "the parent sees the child's writes")?;
    let overrun = gpu.share_range(DevicePtr(p + OFFSET as u64), ALLOC);
    // SAFETY: the allocation made above, freed once.
    ck("cuMemFree", unsafe { cu::cuMemFree_v2(p) })?;
    check(matches!(overrun, Err(GpuError::BadArgs(_))), "a range past the allocation's end is refused")
}

/// Two VMM chunks mapped back to back in one reservation (as PyTorch's expandable segments are), the first
/// exportable as a POSIX fd, the second not.
fn vmm_memory(gpu: &Gpu) -> Res<()> {
    println!("VMM memory:");
    let location =
        cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: gpu.info().ordinal as i32 };
    let prop = |types| cu::CUmemAllocationProp {
        type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: types,
        location,
        win32HandleMetaData: null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    };
    let fd_prop = prop(cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    let plain_prop = prop(cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE);
    let (mut gran, mut va) = (0usize, 0 as cu::CUdeviceptr);
    let (mut h1, mut h2): (cu::CUmemGenericAllocationHandle, cu::CUmemGenericAllocationHandle) = (0, 0);
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    let access = cu::CUmemAccessDesc { location, flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    let option = cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
    // SAFETY: two allocations of one granule each, mapped back to back in a reservation of four granules and
    // opened to this device; then LEN bytes written inside the first.
    unsafe {
        ck("cuMemGetAllocationGranularity", cu::cuMemGetAllocationGranularity(&mut gran, &fd_prop, option))?;
        ck("cuMemCreate", cu::cuMemCreate(&mut h1, gran, &fd_prop, 0))?;
        ck("cuMemCreate", cu::cuMemCreate(&mut h2, gran, &plain_prop, 0))?;
        ck("cuMemAddressReserve", cu::cuMemAddressReserve(&mut va, 4 * gran, 0, 0, 0))?;
        ck("cuMemMap", cu::cuMemMap(va, gran, 0, h1, 0))?;
        ck("cuMemMap", cu::cuMemMap(va + gran as u64, gran, 0, h2, 0))?;
        ck("cuMemSetAccess", cu::cuMemSetAccess(va, 2 * gran, &access, 1))?;
        ck("cuMemcpyHtoD", cu::cuMemcpyHtoD_v2(va + 12345, data.as_ptr() as *const c_void, LEN))?;
    }
    let r = gpu.share_range(DevicePtr(va + 12345), LEN)?;
    check(r.base.0 == va && r.offset == 12345 && r.alloc_bytes == gran, &format!("the first chunk alone: {r:?}"))?;
    let ShareHandle::Vmm(fd) = r.handle else { return Err("VMM memory must be shared as a descriptor".into()) };
    let mapped = gpu.vmm_import_fd(fd, r.alloc_bytes)?;
    let mut got = vec![0u8; LEN];
    gpu.stream()?.download(&mapped, r.offset, &mut got)?;
    check(got == data, "its import sees the bytes at base + offset")?;
    drop(mapped);
    let across = gpu.share_range(DevicePtr(va + gran as u64 - 10), 20);
    let second = gpu.share_range(DevicePtr(va + gran as u64 + 100), 20);
    // SAFETY: undoes the mappings, handles and reservation made above, once each; share_range released the
    // handle it retained, so this frees the memory.
    unsafe {
        ck("cuMemUnmap", cu::cuMemUnmap(va, 2 * gran))?;
        ck("cuMemRelease", cu::cuMemRelease(h1))?;
        ck("cuMemRelease", cu::cuMemRelease(h2))?;
        ck("cuMemAddressFree", cu::cuMemAddressFree(va, 4 * gran))?;
    }
    match across {
        Err(GpuError::BadArgs(m)) => check(true, &format!("a range across two chunks is refused: {m}"))?,
        other => return Err(format!("a range across two chunks: {other:?}").into()),
    }
    match second {
        Err(GpuError::Unsupported(m)) => check(m.contains("POSIX"), &format!("a chunk without the fd type: {m}")),
        other => Err(format!("a chunk without the fd type: {other:?}").into()),
    }
}

/// Pool memory, a host address and the driver's own MemKind::Device memory: each refused with a reason.
fn other_memory(gpu: &Gpu) -> Res<()> {
    println!("memory that cannot be shared:");
    let (mut q, mut s): (cu::CUdeviceptr, cu::CUstream) = (0, null_mut());
    gpu.stream()?.sync()?;
    // SAFETY: a stream and one pool allocation on it, complete before use.
    unsafe {
        ck("cuStreamCreate", cu::cuStreamCreate(&mut s, 0))?;
        ck("cuMemAllocAsync", cu::cuMemAllocAsync(&mut q, 1 << 20, s))?;
        ck("cuStreamSynchronize", cu::cuStreamSynchronize(s))?;
    }
    let pool = gpu.share_range(DevicePtr(q + 64), 64);
    // SAFETY: the allocation and stream made above, freed and destroyed once.
    unsafe {
        ck("cuMemFreeAsync", cu::cuMemFreeAsync(q, s))?;
        ck("cuStreamSynchronize", cu::cuStreamSynchronize(s))?;
        ck("cuStreamDestroy", cu::cuStreamDestroy_v2(s))?;
    }
    match pool {
        Err(GpuError::Unsupported(m)) => check(m.contains("pool"), &format!("pool memory: {m}"))?,
        other => return Err(format!("pool memory: {other:?}").into()),
    }
    let stack = [0u8; 64];
    match gpu.share_range(DevicePtr(stack.as_ptr() as u64), stack.len()) {
        Err(GpuError::Unsupported(m)) => check(true, &format!("a host address: {m}"))?,
        other => return Err(format!("a host address: {other:?}").into()),
    }
    let private = gpu.alloc(4096, MemKind::Device)?;
    match gpu.share_range(private.ptr().offset(8), 8) {
        Err(GpuError::Unsupported(m)) => check(true, &format!("MemKind::Device memory: {m}")),
        other => Err(format!("MemKind::Device memory: {other:?}").into()),
    }
}
