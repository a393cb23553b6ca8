//! A self-contained check of one driver: memory, copies, IPC (through a child process), run-time compiled
//! kernels eager and through a captured graph, launch overheads, a VMM export/import round trip, and the calls
//! for what the caller owns (a borrowed stream, a shared range of memory).
//!
//! `cargo run -p gpu --example gpu_smoke -- [--backend auto|host|cuda|hip] [--device N]`
//! Exits non-zero on any mismatch or driver error.

use gpu::{
    open, Backend, DriverKind, DriverOptions, Gpu, GpuError, HostLaunch, KernelFault, KernelLibrary, LaunchDims,
    MemKind, ShareHandle,
};
use rand::Rng;
use std::process::ExitCode;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The kernels' one by-value parameter struct (the same layout as `struct Params` below).
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Params {
    ptr: u64,
    n: u64,
}

const SOURCE: &str = r#"
struct Params { unsigned long long ptr; unsigned long long n; };

extern "C" __global__ void add_one(Params p) {
    unsigned char* d = (unsigned char*)p.ptr;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
        d[i] = (unsigned char)(d[i] + 1);
    }
}

extern "C" __global__ void empty(Params p) { (void)p; }
"#;

fn host_add_one(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    let p: Params = l.params()?;
    // SAFETY: the caller passes a live buffer of `n` bytes, as the device kernel expects.
    let d = unsafe { std::slice::from_raw_parts_mut(p.ptr as *mut u8, p.n as usize) };
    d.iter_mut().for_each(|b| *b = b.wrapping_add(1));
    Ok(())
}

fn host_empty(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    l.params::<Params>().map(|_| ()).map_err(KernelFault::from)
}

static SMOKE: KernelLibrary = KernelLibrary {
    name: "gpu_smoke",
    source: SOURCE,
    headers: &[],
    host: &[("add_one", host_add_one), ("empty", host_empty)],
};

const BYTES: usize = (1 << 20) + 17;
const LAUNCHES: usize = 1000;

struct Args {
    backend: Backend,
    device: Option<usize>,
    /// `--ipc-child HEX BYTES`: map a parent's allocation, check its pattern, overwrite it with 0x5a.
    ipc_child: Option<(Vec<u8>, usize)>,
}

fn parse_args() -> Res<Args> {
    let mut args = Args { backend: Backend::Auto, device: None, ipc_child: None };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |what: &str| it.next().ok_or_else(|| format!("{a} needs {what}"));
        match a.as_str() {
            "--backend" => args.backend = value("auto, host, cuda or hip")?.parse()?,
            "--device" => args.device = Some(value("an ordinal")?.parse()?),
            "--ipc-child" => {
                let handle = unhex(&value("a hex handle")?)?;
                let bytes = value("a size")?.parse()?;
                args.ipc_child = Some((handle, bytes));
            }
            "-h" | "--help" => {
                println!("usage: gpu_smoke [--backend auto|host|cuda|hip] [--device N]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    Ok(args)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Res<Vec<u8>> {
    s.as_bytes()
        .chunks(2)
        .map(|pair| match std::str::from_utf8(pair) {
            Ok(p) if p.len() == 2 => Ok(u8::from_str_radix(p, 16)?),
            _ => Err(format!("bad hex {s:?}").into()),
        })
        .collect()
}

fn check(ok: bool, what: &str) -> Res<()> {
    if ok {
        println!("  ok    {what}");
        Ok(())
    } else {
        Err(format!("MISMATCH: {what}").into())
    }
}

/// The byte the IPC test's parent writes at `i`.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(7).wrapping_add(3) % 251) as u8
}

fn main() -> ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_smoke: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Res<()> {
    let opts = DriverOptions {
        device: args.device,
        local_rank: None,
        shm_prefix: format!("/arx-smoke{}", std::process::id()),
    };
    let opened = open(args.backend, &opts)?;
    let gpu = opened.gpu;
    if let Some((handle, bytes)) = args.ipc_child {
        return ipc_child(&gpu, &handle, bytes);
    }
    let info = gpu.info();
    println!(
        "driver {} ({}) on {} (ordinal {} of {}, {}, {} multiprocessors, bus {})",
        info.kind,
        info.driver_version,
        info.name,
        info.ordinal,
        info.count,
        info.arch,
        info.multiprocessors,
        info.bus_id
    );
    match gpu.memory()? {
        Some((free, total)) => {
            println!("  device memory: {} of {} MiB free", free >> 20, total >> 20);
            check(0 < free && free <= total, "free device memory within the total")?;
        }
        None => check(info.kind == gpu::DriverKind::Host, "only the host driver reports no device memory")?,
    }
    for note in &opened.notes {
        println!("  passed over {note}");
    }

    memory(&gpu)?;
    ipc(&gpu, &args)?;
    kernels(&gpu)?;
    vmm(&gpu)?;
    caller_owned(&gpu)?;
    println!("all checks passed");
    Ok(())
}

fn memory(gpu: &Gpu) -> Res<()> {
    println!("memory:");
    let s = gpu.stream()?;
    let a = gpu.alloc(BYTES, MemKind::Device)?;
    let b = gpu.alloc(BYTES, MemKind::Ipc { uncached: false })?;
    let mut data = vec![0u8; BYTES];
    rand::rng().fill_bytes(&mut data);
    s.upload(&a, 0, &data)?;
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.copy(b.ptr(), a.ptr(), BYTES)? };
    let mut out = vec![0u8; BYTES];
    s.download(&b, 0, &mut out)?;
    check(out == data, "upload, device copy, download")?;
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.memset(b.ptr().offset(100), 0xa5, 1000)? };
    s.download(&b, 0, &mut out)?;
    let want: Vec<u8> =
        data.iter().enumerate().map(|(i, &x)| if (100..1100).contains(&i) { 0xa5 } else { x }).collect();
    check(out == want, "memset of a sub-range")?;
    let mut tail = [0u8; 17];
    s.download(&a, BYTES - 17, &mut tail)?;
    check(tail[..] == data[BYTES - 17..], "download at an offset")?;
    check(s.download(&a, 1, &mut out).is_err(), "an overrunning download is refused")?;
    Ok(())
}

/// Exports an allocation, has a child process map it, check what the parent wrote, and overwrite it.
fn ipc(gpu: &Gpu, args: &Args) -> Res<()> {
    println!("ipc:");
    let s = gpu.stream()?;
    let buf = gpu.alloc(BYTES, MemKind::Ipc { uncached: true })?;
    let data: Vec<u8> = (0..BYTES).map(pattern).collect();
    s.upload(&buf, 0, &data)?;
    let handle = gpu.ipc_export(&buf)?;
    if gpu.kind() == DriverKind::Cuda {
        check(handle.len() == 64, "a CUDA IPC handle is 64 bytes")?;
    }
    check(gpu.ipc_export(&gpu.alloc(64, MemKind::Device)?).is_err(), "MemKind::Device memory is not exportable")?;
    let mut child = std::process::Command::new(std::env::current_exe()?);
    let backend = match gpu.kind() {
        DriverKind::Host => "host",
        DriverKind::Cuda => "cuda",
        DriverKind::Hip => "hip",
    };
    child.args(["--backend", backend, "--ipc-child", &hex(&handle), &BYTES.to_string()]);
    if let Some(d) = args.device {
        child.args(["--device", &d.to_string()]);
    }
    let status = child.status()?;
    check(status.success(), "a child process maps the allocation and finds the parent's bytes")?;
    let mut out = vec![0u8; BYTES];
    s.download(&buf, 0, &mut out)?;
    check(out.iter().all(|&x| x == 0x5a), "the parent sees the child's writes")?;
    Ok(())
}

fn ipc_child(gpu: &Gpu, handle: &[u8], bytes: usize) -> Res<()> {
    let s = gpu.stream()?;
    let mapped = gpu.ipc_import(handle, bytes)?;
    let mut out = vec![0u8; bytes];
    s.download(&mapped, 0, &mut out)?;
    if out.iter().enumerate().any(|(i, &x)| x != pattern(i)) {
        return Err("child: the mapped allocation does not hold the parent's pattern".into());
    }
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.memset(mapped.ptr(), 0x5a, bytes)? };
    s.sync()?;
    Ok(())
}

fn kernels(gpu: &Gpu) -> Res<()> {
    println!("kernels:");
    let s = gpu.stream()?;
    let t = std::time::Instant::now();
    let module = gpu.load(&SMOKE)?;
    println!("  load  {} in {:.1} ms", SMOKE.name, t.elapsed().as_secs_f64() * 1e3);
    let add_one = module.kernel("add_one")?;
    let empty = module.kernel("empty")?;
    check(module.kernel("missing").is_err(), "an unknown kernel name is refused")?;
    let block = 256u32;
    let resident = add_one.max_resident_blocks(block, 0)?;
    let shown = if resident == usize::MAX { "unlimited".to_string() } else { resident.to_string() };
    println!("  info  add_one: {shown} resident blocks of {block} threads");
    check(resident >= 1, "at least one block of add_one fits")?;

    let buf = gpu.alloc(BYTES, MemKind::Device)?;
    let mut data = vec![0u8; BYTES];
    rand::rng().fill_bytes(&mut data);
    s.upload(&buf, 0, &data)?;
    let grid = (BYTES.div_ceil(block as usize)).min(resident.min(4096)) as u32;
    let dims = LaunchDims { grid, block, shared_bytes: 0 };
    let params = Params { ptr: buf.ptr().0, n: BYTES as u64 };
    let plus = |k: u8| -> Vec<u8> { data.iter().map(|x| x.wrapping_add(k)).collect() };
    let mut out = vec![0u8; BYTES];

    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.launch(&add_one, dims, &params)? };
    s.sync()?;
    s.download(&buf, 0, &mut out)?;
    check(out == plus(1), "add_one, launched eagerly")?;

    check(!s.is_capturing()?, "a fresh stream is not capturing")?;
    s.begin_capture()?;
    check(s.is_capturing()?, "a stream in capture says so")?;
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.launch(&add_one, dims, &params)? };
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.launch(&add_one, dims, &params)? };
    let graph = s.end_capture()?;
    check(!s.is_capturing()?, "a stream whose capture ended is not capturing")?;
    s.download(&buf, 0, &mut out)?;
    check(out == plus(1), "captured launches do not run before replay")?;
    s.replay(&graph)?;
    s.replay(&graph)?;
    s.sync()?;
    s.download(&buf, 0, &mut out)?;
    check(out == plus(5), "a graph of two add_one launches, replayed twice")?;

    // Launch overheads: an empty kernel of one block, eager and as a one-launch graph.
    let one = LaunchDims { grid: 1, block: 32, shared_bytes: 0 };
    let nothing = Params { ptr: 0, n: 0 };
    let (e0, e1) = (gpu.event()?, gpu.event()?);
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.launch(&empty, one, &nothing)? };
    s.sync()?;
    s.record(&e0)?;
    for _ in 0..LAUNCHES {
        // SAFETY: this smoke test's own buffers and kernels, sized for the call.
        unsafe { s.launch(&empty, one, &nothing)? };
    }
    s.record(&e1)?;
    e1.sync()?;
    let eager_us = e0.elapsed_ms(&e1)? as f64 * 1e3 / LAUNCHES as f64;
    s.begin_capture()?;
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.launch(&empty, one, &nothing)? };
    let g1 = s.end_capture()?;
    s.replay(&g1)?;
    s.sync()?;
    s.record(&e0)?;
    for _ in 0..LAUNCHES {
        s.replay(&g1)?;
    }
    s.record(&e1)?;
    e1.sync()?;
    let graph_us = e0.elapsed_ms(&e1)? as f64 * 1e3 / LAUNCHES as f64;
    println!("  time  empty kernel: {eager_us:.2} us per eager launch, {graph_us:.2} us per graph replay");
    check(eager_us.is_finite() && graph_us.is_finite() && eager_us >= 0.0, "event timing")?;
    Ok(())
}

fn vmm(gpu: &Gpu) -> Res<()> {
    println!("vmm:");
    let s = gpu.stream()?;
    let v = gpu.vmm_create(BYTES)?;
    check(v.bytes() == BYTES, "a VMM allocation reports the requested size")?;
    let fd = gpu.vmm_export_fd(&v)?;
    let w = gpu.vmm_import_fd(fd, BYTES)?;
    check(v.ptr() != w.ptr(), "the import is a second mapping")?;
    let mut data = vec![0u8; BYTES];
    rand::rng().fill_bytes(&mut data);
    s.upload(&v, 0, &data)?;
    let mut out = vec![0u8; BYTES];
    s.download(&w, 0, &mut out)?;
    check(out == data, "bytes written through the creator's mapping are seen through the import")?;
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { s.memset(w.ptr(), 0x3c, 4096)? };
    s.download(&v, 0, &mut out[..4096])?;
    check(out[..4096].iter().all(|&x| x == 0x3c), "and back")?;
    check(gpu.ipc_export(&v).is_err(), "VMM memory is not a cuMemAlloc IPC allocation")?;
    Ok(())
}

/// What a framework hands in: its own stream, and memory its allocator made (played here by this driver's).
fn caller_owned(gpu: &Gpu) -> Res<()> {
    println!("caller-owned:");
    check(!gpu.info().bus_id.is_empty(), "the device has a PCI bus id")?;
    let own = gpu.stream()?;
    let buf = gpu.alloc(BYTES, MemKind::Device)?;
    // SAFETY: `own` is a live stream of this device's context and outlives the borrow.
    let borrowed = unsafe { gpu.borrow_stream(own.handle())? };
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { borrowed.memset(buf.ptr(), 0x11, BYTES)? };
    borrowed.sync()?;
    drop(borrowed);
    let mut out = vec![0u8; BYTES];
    own.download(&buf, 0, &mut out)?;
    check(out.iter().all(|&x| x == 0x11), "a memset through a borrowed stream")?;
    // SAFETY: this smoke test's own buffers and kernels, sized for the call.
    unsafe { own.memset(buf.ptr(), 0x22, BYTES)? };
    own.sync()?;
    own.download(&buf, 0, &mut out)?;
    check(out.iter().all(|&x| x == 0x22), "dropping the borrow leaves the stream alive")?;

    let ipc = gpu.alloc(BYTES, MemKind::Ipc { uncached: false })?;
    let r = gpu.share_range(ipc.ptr().offset(4096), 1000)?;
    check(
        matches!(r.handle, ShareHandle::Ipc(_))
            && r.base == ipc.ptr()
            && r.offset == 4096
            && r.alloc_bytes >= BYTES
            && r.base.offset(r.offset) == ipc.ptr().offset(4096),
        "share_range of an IPC allocation gives its base, size and the offset",
    )?;
    check(
        matches!(gpu.share_range(buf.ptr().offset(64), 64), Err(GpuError::Unsupported(_))),
        "share_range refuses MemKind::Device memory",
    )?;
    check(
        matches!(gpu.share_range(ipc.ptr().offset(4096), r.alloc_bytes), Err(GpuError::BadArgs(_))),
        "share_range refuses a range past the allocation's end",
    )?;

    // VMM handles can be imported in the same process, so this one is checked end to end.
    let v = gpu.vmm_create(BYTES)?;
    let mut data = vec![0u8; 5000];
    rand::rng().fill_bytes(&mut data);
    own.upload(&v, 8192, &data)?;
    let r = gpu.share_range(v.ptr().offset(8192), data.len())?;
    check(r.base == v.ptr() && r.offset == 8192 && r.alloc_bytes >= BYTES, "share_range of a VMM allocation")?;
    let ShareHandle::Vmm(fd) = r.handle else { return Err("a VMM allocation must be shared as a descriptor".into()) };
    let w = gpu.vmm_import_fd(fd, r.alloc_bytes)?;
    let mut got = vec![0u8; data.len()];
    own.download(&w, r.offset, &mut got)?;
    check(got == data, "its import sees the bytes at base + offset")?;
    Ok(())
}
