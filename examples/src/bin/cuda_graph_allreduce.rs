//! The library on CUDA through cudarc: a program with its own context, stream and buffers allreduces eagerly and
//! inside its own captured graph (plain calls at comm_bench.py's sizes, and calls with the residual add and RMSNorm),
//! reduce-scatters and all-gathers, and checks every result. Run one rank per GPU (or 8 ranks on one GPU under MPS):
//! `comm-bench launch -n 8 -- target/release/cuda_graph_allreduce` or `torchrun --nproc-per-node 8 ...`.

use allreduce::{Communicator, Mode, Options, Residency};
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let opts = Options { backend: allreduce::Backend::Cuda, capacity_bytes: 32 << 20, ..Options::default() };
    let mut comm = Communicator::from_env(opts)?;
    let (rank, world) = (comm.rank(), comm.world());
    // The program's own context (the device's primary context, as the communicator's) and stream.
    let ctx = CudaContext::new(comm.gpu().info().ordinal)?;
    let stream = ctx.new_stream()?;
    if rank == 0 {
        print!("{}", comm.placement());
        for mode in Mode::ALL {
            println!("{} table: {}", mode.name(), comm.table_source(mode, Residency::Caller));
        }
    }
    let sizes = measure::sizes::comm_bench_sizes(10, 24, 20, comm.gpu().info().size_align);
    let value = |r: usize, i: usize, call: usize| ((r * 3 + i % 11 + call) % 13) as f32;
    let expect = |i: usize, call: usize| (0..world).map(|r| value(r, i, call)).sum::<f32>();
    let check = |got: &[bf16], call: usize, what: &str| {
        let bad = (0..got.len()).find(|&i| got[i].to_f32() != expect(i, call));
        if let Some(i) = bad {
            panic!("rank {rank}: {what}: element {i} is {}, expected {}", got[i], expect(i, call));
        }
    };
    // The captured calls' buffers stay allocated while the communicator lives (end_graph_capture's contract).
    let mut keep = Vec::new();
    for &count in &sizes {
        let host = |call: usize| -> Vec<bf16> { (0..count).map(|i| bf16::from_f32(value(rank, i, call))).collect() };
        // Eager, out of place.
        let input = stream.clone_htod(&host(0))?;
        let mut output = stream.alloc_zeros::<bf16>(count)?;
        let eager = comm.all_reduce_cuda(&input, &mut output, &stream)?;
        check(&stream.clone_dtoh(&output)?, 0, &format!("eager {count} ({eager})"));
        // Captured into the program's own graph (in place, and out of place with the capture's buffers registered
        // with every peer when it ends), then replayed on new inputs: cudarc's cross-stream event tracking cannot
        // be captured, so it is off while capturing.
        let mut data = stream.clone_htod(&host(1))?;
        let mut out = stream.alloc_zeros::<bf16>(count)?;
        comm.begin_graph_capture()?;
        // SAFETY: everything below runs on this one stream until tracking is enabled again.
        unsafe { ctx.disable_event_tracking() };
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = comm.all_reduce_cuda_in_place(&mut data, &stream);
        let captured_out = comm.all_reduce_cuda(&data, &mut out, &stream);
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
        // SAFETY: re-enabled after the capture ended; every slice in use is on this one stream.
        unsafe { ctx.enable_event_tracking() };
        // SAFETY: `data` and `out` outlive the communicator (dropped after it, at the end of main), and the graph
        // is replayed only below.
        unsafe { comm.end_graph_capture()? };
        let (captured, _) = (captured?, captured_out?);
        let graph = graph.ok_or("empty capture")?;
        for call in 1..4 {
            stream.memcpy_htod(&host(call), &mut data)?;
            graph.launch()?;
            check(&stream.clone_dtoh(&data)?, call, &format!("graph replay {call}, {count} ({captured})"));
            // The second captured call summed the first's result: every rank's sum, times the world size.
            let twice: Vec<bf16> = stream.clone_dtoh(&out)?;
            let bad = (0..count).find(|&i| twice[i].to_f32() != expect(i, call) * world as f32);
            assert!(
                bad.is_none(),
                "rank {rank}: graph replay {call}, {count}: registered out-of-place call wrong at {bad:?}"
            );
        }
        keep.push((data, out));
        if rank == 0 {
            println!("{count:>9} elements: eager {eager}, graph {captured}: checked");
        }
    }
    // A reduce-scatter then an all-gather of its shards: the allreduce's sums, on every rank.
    let count = 4096 * world;
    let input = stream.clone_htod(&(0..count).map(|i| bf16::from_f32(value(rank, i, 0))).collect::<Vec<_>>())?;
    let mut shard = stream.alloc_zeros::<bf16>(count / world)?;
    let mut gathered = stream.alloc_zeros::<bf16>(count)?;
    comm.reduce_scatter_cuda(&input, &mut shard, &stream)?;
    comm.all_gather_cuda(&shard, &mut gathered, &stream)?;
    check(&stream.clone_dtoh(&gathered)?, 0, "reduce-scatter then all-gather");
    let kept = norm_calls(&mut comm, &ctx, &stream)?;
    stream.synchronize()?;
    if rank == 0 {
        comm.notes().iter().for_each(|n| println!("note: {n}"));
    }
    drop(comm);
    drop((keep, kept));
    Ok(())
}

/// The allreduce with the residual add and RMSNorm, eagerly and captured into the program's graph (in place, then
/// replayed on new inputs), against float64: `r` exact (small integers), `y` within bf16's rounding. Returns the
/// buffers the captured calls use, which must outlive the communicator.
fn norm_calls(
    comm: &mut Communicator,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
) -> Result<Vec<CudaSlice<bf16>>, Box<dyn std::error::Error>> {
    let (rank, world, hidden, eps) = (comm.rank(), comm.world(), 4096, 1e-5f32);
    let value = |r: usize, i: usize, call: usize| ((r * 5 + i % 7 + call) % 11) as f32;
    let res = |i: usize| (i % 5) as f32 - 2.0;
    let w = |j: usize| 0.5 + (j % 7) as f32 / 8.0;
    let weight = stream.clone_htod(&(0..hidden).map(|j| bf16::from_f32(w(j))).collect::<Vec<_>>())?;
    let mut keep = Vec::new();
    for rows in [1, 8, 64] {
        let count = rows * hidden;
        let x = |call: usize| -> Vec<bf16> { (0..count).map(|i| bf16::from_f32(value(rank, i, call))).collect() };
        let res_host: Vec<bf16> = (0..count).map(|i| bf16::from_f32(res(i))).collect();
        let check = |r: &[bf16], y: &[bf16], call: usize, what: &str| {
            let want_r = |i: usize| res(i) as f64 + (0..world).map(|k| value(k, i, call) as f64).sum::<f64>();
            for row in 0..rows {
                let idx = row * hidden..(row + 1) * hidden;
                let mean = idx.clone().map(|i| want_r(i) * want_r(i)).sum::<f64>() / hidden as f64;
                let inv = 1.0 / (mean + eps as f64).sqrt();
                for i in idx {
                    let want_y = want_r(i) * inv * w(i - row * hidden) as f64;
                    let (gr, gy) = (r[i].to_f32() as f64, y[i].to_f32() as f64);
                    assert!(gr == want_r(i), "rank {rank}: {what}: r[{i}] is {gr}, expected {}", want_r(i));
                    let tol = want_y.abs() / 128.0 + 1e-6;
                    assert!((gy - want_y).abs() <= tol, "rank {rank}: {what}: y[{i}] is {gy}, expected {want_y}");
                }
            }
        };
        // Eager, out of place.
        let input = stream.clone_htod(&x(0))?;
        let mut residual = stream.clone_htod(&res_host)?;
        let mut y = stream.alloc_zeros::<bf16>(count)?;
        let eager = comm.all_reduce_add_rms_norm_cuda(&input, &mut residual, &weight, eps, &mut y, stream)?;
        check(&stream.clone_dtoh(&residual)?, &stream.clone_dtoh(&y)?, 0, &format!("norm eager {rows}x{hidden}"));
        // Captured in place, replayed on new inputs and a fresh residual.
        let mut data = stream.clone_htod(&x(1))?;
        comm.begin_graph_capture()?;
        // SAFETY: everything below runs on this one stream until tracking is enabled again.
        unsafe { ctx.disable_event_tracking() };
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = comm.all_reduce_add_rms_norm_cuda_in_place(&mut data, &mut residual, &weight, eps, stream);
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
        // SAFETY: re-enabled after the capture ended; every slice in use is on this one stream.
        unsafe { ctx.enable_event_tracking() };
        // SAFETY: `data`, `residual` and `weight` outlive the communicator (returned to main, which drops them
        // after it), and the graph is replayed only below.
        unsafe { comm.end_graph_capture()? };
        let (captured, graph) = (captured?, graph.ok_or("empty capture")?);
        for call in 1..4 {
            stream.memcpy_htod(&x(call), &mut data)?;
            stream.memcpy_htod(&res_host, &mut residual)?;
            graph.launch()?;
            let what = format!("norm graph replay {call}, {rows}x{hidden}");
            check(&stream.clone_dtoh(&residual)?, &stream.clone_dtoh(&data)?, call, &what);
        }
        if rank == 0 {
            println!("{rows:>4} rows of {hidden}, residual add + RMSNorm: eager {eager}, graph {captured}: checked");
        }
        keep.extend([data, residual]);
    }
    keep.push(weight);
    Ok(keep)
}
