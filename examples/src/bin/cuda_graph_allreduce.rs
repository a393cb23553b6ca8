//! The library on CUDA through cudarc: a program with its own context, stream and buffers allreduces eagerly and
//! inside its own captured graph, and checks every result. Run one rank per GPU (or 8 ranks on one GPU under MPS):
//! `comm-bench launch -n 8 -- target/release/cuda_graph_allreduce` or `torchrun --nproc-per-node 8 ...`.

use allreduce::{Communicator, Mode, Options, Residency};
use cudarc::driver::{sys, CudaContext};
use half::bf16;

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
    stream.synchronize()?;
    if rank == 0 {
        comm.notes().iter().for_each(|n| println!("note: {n}"));
    }
    drop(comm);
    drop(keep);
    Ok(())
}
