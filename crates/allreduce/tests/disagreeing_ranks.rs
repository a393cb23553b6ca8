//! Ranks that disagree on one call, as multi-process jobs (see `communicator.rs`): captures of different calls are
//! refused at the capture's end, and ranks that run different kernels on one call fail naming each other. On the host
//! driver by default; `ARX_TEST_BACKEND=cuda` (or hip) and `ARX_TEST_RANKS=8` run them on a GPU node.

use allreduce::{Algorithm, DType, Error, Op};
use gpu::MemKind;
use measure::check::input_values;

mod common;
use common::{all_reduce_with, as_job, backend, comm_on, ranks};

#[test]
fn ranks_that_captured_different_calls_are_refused_on_every_rank() {
    as_job("ranks_that_captured_different_calls_are_refused_on_every_rank", 3, |info| {
        let capacity = 64 << 10;
        let mut comm = comm_on(backend(), info, capacity);
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let buf = gpu.alloc(2 * capacity, MemKind::Ipc { uncached: false }).unwrap();
        let (i, o) = (buf.ptr(), buf.ptr().offset(capacity));
        comm.begin_graph_capture().unwrap();
        stream.begin_capture().unwrap();
        // Rank 1 captures a call of another size: nothing runs during a capture, so nothing waits.
        let count = if comm.rank() == 1 { 2048 } else { 1024 };
        // SAFETY: our own buffer; the graph is never replayed.
        unsafe {
            all_reduce_with(&comm, Some(Algorithm::SymmZc1Shot), i, o, count, DType::F32, stream.handle()).unwrap()
        };
        let _graph = stream.end_capture().unwrap();
        // SAFETY: never replayed.
        let err = unsafe { comm.end_graph_capture() }.unwrap_err();
        assert!(matches!(err, Error::Mismatch(_)), "{err}");
        assert!(err.to_string().contains("ranks made different calls"), "{err}");
        // SAFETY: refused: nothing is being recorded.
        assert!(matches!(unsafe { comm.end_graph_capture() }, Err(Error::BadArgs(_))));
    });
}

/// Ranks that run different kernels of one flag array on one call fail, the first to see it naming the peer and both
/// kernels, instead of passing each other's barriers and returning sums of buffers their peers never wrote: rank 0
/// forces the zero-copy two-shot, the others the epoch one-shot (what inputs registered on some ranks and not on
/// others lead `auto` to); then, on a new communicator, rank 0 asks car's one-shot for the residual add and RMSNorm
/// and the others for the plain sum. On the host driver the call returns the error; on a GPU `check` after the
/// stream drained.
#[test]
fn ranks_that_run_different_algorithms_on_one_call_fail_naming_each_other() {
    as_job("ranks_that_run_different_algorithms_on_one_call_fail_naming_each_other", ranks(3), |info| {
        let (capacity, count, dtype) = (1 << 20, 4096, DType::F32);
        let cases = [
            (Algorithm::SymmZc2Shot, Algorithm::SymmEpoch1Shot, false, "symm_zc_2shot", "symm_epoch_1shot"),
            (Algorithm::Car1Shot, Algorithm::Car1Shot, true, "car_1shot_norm", "car_1shot"),
        ];
        for (zero, others, zero_norms, zero_runs, others_run) in cases {
            let comm = comm_on(backend(), info.clone(), capacity);
            let gpu = comm.gpu().clone();
            let stream = gpu.stream().unwrap();
            let input = comm.registered_input();
            let [output, residual, weight] = [0; 3].map(|_| gpu.alloc(capacity, MemKind::Device).unwrap());
            stream.upload(input, 0, &dtype.encode(&input_values(1, comm.rank(), count, dtype))).unwrap();
            stream.fill(&weight, 0).unwrap();
            let me = comm.rank() == 0;
            let norm =
                allreduce::AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden: 1024, eps: 1e-5 };
            // SAFETY: the registered input and our own output, residual and weight, of `capacity` bytes.
            let issued = unsafe {
                let call = comm.call(Op::AllReduce, dtype, input.ptr(), output.ptr(), count).unwrap();
                let call = if me && zero_norms { call.with_add_rms_norm(norm).unwrap() } else { call };
                comm.issue(call, Some(if me { zero } else { others }), stream.handle())
            };
            let err = match issued {
                Err(e) => e,
                Ok(_) => {
                    stream.sync().unwrap();
                    comm.check().expect_err("a call whose ranks ran different kernels must fail")
                }
            };
            let Error::Peer { ranks, what } = &err else { panic!("{err}") };
            let (mine, theirs) = if me { (zero_runs, others_run) } else { (others_run, zero_runs) };
            // The first rank to see it names the peer and both kernels; another may be ended by that rank's abort
            // first.
            if what.contains("where this rank ran") {
                assert!(what.starts_with(&format!("ran {theirs} where this rank ran {mine}")), "{err}");
                assert_eq!(ranks.len(), 1, "{err}");
                assert_eq!(ranks[0] == 0, !me, "{err}");
            }
            let named = u8::from(what.contains("where this rank ran"));
            let all = comm.rendezvous().all_gather("named", &[named]).unwrap();
            assert!(
                all.iter().any(|b| b[0] == 1),
                "no rank named the mismatch between {zero_runs} and {others_run}: {err}"
            );
        }
    });
}
