//! What a sweep needs of memory, checked before it allocates: on the host driver before any rank starts (every
//! "device" buffer is host memory, and a sweep beyond it is OOM-killed half-way: `--max_size 30` asks for gigabytes
//! per buffer); on a GPU by every rank once its communicator is up, against the device's free memory.

use collective_core::{DType, Op};
use std::path::Path;

/// Bytes of the benchmark's own buffers per rank (private memory): the input and three input variants of the
/// capacity each, and the output of `op`'s ([`Op::output_capacity`]: all-gather's holds every rank's input).
fn bench_bytes(op: Op, capacity: usize, world: usize) -> usize {
    4 * capacity + op.output_capacity(capacity, world)
}

/// Host bytes of one rank's checks at the largest size (private memory, on any driver): its input, up to three
/// float64 expected outputs (the seeded input's, for either rounding, and the last input variant's), and while one
/// is made, its float64 sum and one rank's input drawn as f32, encoded, decoded to f64 and narrowed again.
fn check_bytes(op: Op, dtype: DType, capacity: usize, world: usize) -> usize {
    let (count, outputs) = (capacity / dtype.size(), op.output_capacity(capacity, world) / dtype.size());
    capacity + 4 * 8 * outputs + (4 + dtype.size() + 8 + 4) * count
}

/// Bytes a sweep needs in all: of memory, and of that in /dev/shm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub memory: u64,
    pub shm: u64,
}

/// All `methods`' own buffers per rank, from the registry's rows (the communicator's, which `auto` runs, are
/// counted once for every sweep).
fn methods_buffers(names: &[String]) -> methods::Buffers {
    names.iter().map(|m| methods::buffers_of(m)).fold(methods::Buffers::default(), |a, b| a + b)
}

/// The estimate for `world` ranks of `methods` running `op` on `dtype` at `capacity` bytes per input buffer.
pub fn estimate(names: &[String], op: Op, dtype: DType, capacity: usize, world: usize) -> Need {
    let own = methods_buffers(names) + methods::communicator_buffers();
    let memory = bench_bytes(op, capacity, world) + own.capacities * capacity + check_bytes(op, dtype, capacity, world);
    Need { memory: (memory * world) as u64, shm: (own.shm * capacity * world) as u64 }
}

/// Device bytes the sweep still allocates on one device once the communicators are up (their engines are already in
/// the device's free memory): the benchmark's buffers and each method's own, for the `ranks` of the `world` that
/// share it.
pub fn device_need(names: &[String], op: Op, capacity: usize, world: usize, ranks: usize) -> u64 {
    ((bench_bytes(op, capacity, world) + methods_buffers(names).capacities * capacity) * ranks) as u64
}

/// Refuses a sweep whose device allocations would not fit in the device's `free` bytes (of `total`).
pub fn check_device(need: u64, free: u64, total: u64, ranks: usize) -> Result<(), String> {
    if need <= free {
        return Ok(());
    }
    Err(format!(
        "this sweep needs about {} more of device memory ({ranks} rank(s) on this device) and {} of {} is free: \
         lower --max_size (or -e), --num_ranks or the --methods list",
        gib(need),
        gib(free),
        gib(total)
    ))
}

/// MemAvailable from /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Free bytes of the file system at `dir`, for an unprivileged user.
fn free_space(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Refuses a sweep whose estimate exceeds what this machine has free now (checks what it cannot read pass).
pub fn check(need: Need) -> Result<(), String> {
    check_against(need, mem_available(), free_space(Path::new("/dev/shm")))
}

fn check_against(need: Need, memory: Option<u64>, shm: Option<u64>) -> Result<(), String> {
    let advice = "lower --max_size (or -e), --num_ranks or the --methods list";
    if let Some(free) = memory.filter(|&free| need.memory > free) {
        return Err(format!(
            "this sweep needs about {} of host memory (the host driver's buffers, all ranks) and {} is available \
             (MemAvailable): {advice}",
            gib(need.memory),
            gib(free)
        ));
    }
    if let Some(free) = shm.filter(|&free| need.shm > free) {
        return Err(format!(
            "this sweep needs about {} in /dev/shm and {} is free there: {advice}",
            gib(need.shm),
            gib(free)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_need_counts_the_ranks_on_the_device_and_refuses_past_free_memory() {
        let methods = vec!["auto".to_string(), "car_1shot".to_string(), "symm_zc_2shot".to_string()];
        // Five benchmark buffers, car's two and the tuned design's four, per rank, at 1 GiB each.
        assert_eq!(device_need(&methods, Op::AllReduce, 1 << 30, 8, 8), (11 * 8) << 30);
        // An all-gather's output holds the 8 ranks' inputs: 4 + 8 benchmark capacities and car's 2.
        let ag = vec!["car_ag".to_string()];
        assert_eq!(device_need(&ag, Op::AllGather, 1 << 30, 8, 1), 14 << 30);
        assert!(check_device(10 << 30, 10 << 30, 80 << 30, 1).is_ok());
        let e = check_device(88 << 30, 60 << 30, 141 << 30, 8).unwrap_err();
        assert!(e.contains("88.0 GiB") && e.contains("60.0 GiB of 141.0 GiB") && e.contains("8 rank(s)"), "{e}");
    }

    #[test]
    fn estimates_scale_with_ranks_and_methods_and_refuse_what_is_not_free() {
        let methods: Vec<String> = ["car_1shot", "symm_1shot", "auto", "nccl"].map(String::from).to_vec();
        let need = estimate(&methods, Op::AllReduce, DType::Bf16, 1 << 20, 2);
        // Per rank: 5 benchmark + 13 communicator + 2 car + 1 symm capacities, and the checks' 26: the input, three
        // float64 outputs of 4 capacities each (2-byte elements), a float64 sum (4) and an input drawn (9); in
        // /dev/shm: 9 communicator (car's one-shot, reduce-scatter and all-gather two each, its two-shot three) + 2
        // car.
        assert_eq!(need, Need { memory: 47 << 21, shm: 11 << 21 });
        assert_eq!(estimate(&methods, Op::AllReduce, DType::Bf16, 1 << 20, 4).memory, 2 * need.memory);
        // fp32: the checks' float64 outputs are 2 capacities each, an input drawn 5: 1 + 3 * 2 + 2 + 5 = 14.
        assert_eq!(estimate(&methods, Op::AllReduce, DType::F32, 1 << 20, 2).memory, (21 + 14) << 21);
        // An all-gather's output, and its expected outputs, hold every rank's input.
        let ag = vec!["car_ag".to_string()];
        let (bench, own) = (4 + 2, 13 + 2);
        let checks = 1 + 4 * 2 * 4 + 9;
        assert_eq!(estimate(&ag, Op::AllGather, DType::Bf16, 1 << 20, 2).memory, (bench + own + checks) << 21);
        assert!(check_against(need, Some(need.memory), Some(need.shm)).is_ok());
        assert!(check_against(need, None, None).is_ok(), "what cannot be read is not held against the sweep");
        let e = check_against(need, Some(need.memory - 1), None).unwrap_err();
        assert!(e.contains("MemAvailable") && e.contains("--max_size"), "{e}");
        assert!(check_against(need, None, Some(need.shm - 1)).unwrap_err().contains("/dev/shm"));
        assert!(mem_available().unwrap() > 0 && free_space(Path::new("/dev/shm")).is_some());
    }
}
