//! The communicator as a multi-process job: each test re-runs this test binary as the ranks of a job (through the
//! project's launcher) and the ranks run the test's body. On the host driver by default; `ARX_TEST_BACKEND=cuda`
//! (or hip) and `ARX_TEST_RANKS=8` run the driver-independent tests on a GPU node (8 ranks on one GPU under MPS).

use allreduce::{Algorithm, CallError, Communicator, DType, DevicePtr, Error, Mode, Op, Options, Residency};
use gpu::MemKind;
use measure::check::{agree_verdict, fingerprint, input_values, reference, tolerance, Expected};
use symm::tuned::TWO_SHOT_EPOCH_MAX_BYTES;
use symm::tuned::{EPOCH_MAX_BYTES, LL_HANDOVER_EAGER_BYTES, LL_HANDOVER_GRAPH_BYTES, LL_MAX_BYTES};

mod common;
use common::{all_reduce_with, as_job, backend, comm_on, host_comm, ranks, tuned_on};

/// Element counts on both sides of every size at which some choice changes: the tuned designs' hand-overs, the
/// packet area's end, and every built-in table's range bounds.
fn handover_counts(dtype: DType, capacity: usize) -> Vec<usize> {
    let mut bytes =
        vec![LL_HANDOVER_GRAPH_BYTES, LL_HANDOVER_EAGER_BYTES, LL_MAX_BYTES, TWO_SHOT_EPOCH_MAX_BYTES, EPOCH_MAX_BYTES];
    for d in [gpu::DriverKind::Host, gpu::DriverKind::Cuda, gpu::DriverKind::Hip] {
        for t in allreduce::tune::built_in(d).0 {
            bytes.extend(t.entries.iter().filter_map(|e| e.max_bytes));
        }
    }
    let mut counts = vec![1, 8, 13];
    for b in bytes {
        let n = b / dtype.size();
        counts.extend([n - 1, n, n + 1, n + dtype.vec() + 3]);
    }
    counts.retain(|&n| n >= 1 && n * dtype.size() <= capacity);
    counts.sort_unstable();
    counts.dedup();
    counts
}

/// With a bias (`bias`: its buffer), every design adds it after the ranks' inputs: the float64 reference has one more
/// term, and every design must still give the same bits.
#[test]
fn every_algorithm_gives_the_same_bits_on_both_sides_of_every_handover() {
    as_job("every_algorithm_gives_the_same_bits_on_both_sides_of_every_handover", ranks(3), |info| {
        let capacity = 1 << 20;
        let comm = comm_on(backend(), info, capacity);
        let (rank, world) = (comm.rank(), comm.world());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let input = gpu.alloc(capacity, MemKind::Device).unwrap();
        let output = gpu.alloc(capacity, MemKind::Device).unwrap();
        let bias_buf = gpu.alloc(capacity, MemKind::Device).unwrap();
        for (dtype, with_bias) in DType::ALL.into_iter().flat_map(|d| [(d, false), (d, true)]) {
            for count in handover_counts(dtype, capacity) {
                let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
                let values = dtype.encode(&input_values(seed, rank, count, dtype));
                let mut want = reference(seed, world, count, dtype, 0, count);
                // The bias: the values of a rank past the last, so every rank has the same.
                let bias = with_bias.then(|| {
                    let b = input_values(seed, world, count, dtype);
                    stream.upload(&bias_buf, 0, &dtype.encode(&b)).unwrap();
                    want.iter_mut().zip(&b).for_each(|(w, &b)| *w += b as f64);
                    bias_buf.ptr()
                });
                let terms = world + usize::from(with_bias);
                let mut prints = Vec::new();
                let runs: Vec<Option<Algorithm>> =
                    Algorithm::CANDIDATES.into_iter().map(Some).chain([None, None]).collect();
                for (k, algo) in runs.into_iter().enumerate() {
                    stream.upload(&input, 0, &values).unwrap();
                    stream.fill(&output, 0xFF).unwrap();
                    let in_place = k == Algorithm::CANDIDATES.len() + 1;
                    let out = if in_place { &input } else { &output };
                    // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
                    unsafe {
                        let call = comm.call(Op::AllReduce, dtype, input.ptr(), out.ptr(), count).unwrap();
                        let call = bias.map_or(Ok(call), |b| call.with_bias(b)).unwrap();
                        comm.issue(call, algo, stream.handle()).unwrap()
                    };
                    stream.sync().unwrap();
                    let mut got = vec![0u8; count * dtype.size()];
                    stream.download(out, 0, &mut got).unwrap();
                    let algo = algo.map_or("communicator".into(), |a| a.to_string());
                    let what = format!("{dtype} x {count}, {algo}{}", if with_bias { " + bias" } else { "" });
                    let verdict = agree_verdict(
                        comm.rendezvous(),
                        &got,
                        dtype,
                        &want,
                        tolerance(dtype, terms, false),
                        true,
                        &what,
                    );
                    assert_eq!(verdict.unwrap(), None);
                    prints.push((what, fingerprint(&got)));
                }
                let first = &prints[0];
                for p in &prints[1..] {
                    assert_eq!(p.1, first.1, "{} and {} differ bitwise", p.0, first.0);
                }
            }
        }
    });
}

#[test]
fn bad_calls_get_typed_errors_before_any_work() {
    as_job("bad_calls_get_typed_errors_before_any_work", ranks(2), |info| {
        let capacity = 4096;
        let comm = comm_on(backend(), info, capacity);
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let buf = gpu.alloc(2 * capacity, MemKind::Device).unwrap();
        let p = buf.ptr();
        let s = stream.handle();
        // SAFETY: every call below is refused before it touches memory (and the buffers are ours anyway).
        unsafe {
            assert!(matches!(comm.all_reduce(p, p, 4097, DType::F32, s), Err(Error::Call(CallError::TooLarge { .. }))));
            assert!(matches!(
                comm.all_reduce(p.offset(2), p.offset(2), 8, DType::Bf16, s),
                Err(Error::Call(CallError::Misaligned { what: "input", .. }))
            ));
            assert!(matches!(
                comm.all_reduce(p, p.offset(18), 8, DType::Bf16, s),
                Err(Error::Call(CallError::Misaligned { what: "output", .. }))
            ));
            let overlap = comm.all_reduce(p, p.offset(16), 64, DType::F32, s);
            assert!(matches!(overlap, Err(Error::Call(CallError::Overlap { .. }))));
            assert!(matches!(comm.all_reduce(p, p, 0, DType::F32, s), Err(Error::Call(CallError::Empty))));
            let rs = comm.reduce_scatter(p, p.offset(4096), 7, DType::F32, s);
            assert!(matches!(rs, Err(Error::Call(CallError::Indivisible { .. }))));
            // A call checked for another communicator (another world size) is refused, not run.
            let foreign = allreduce::Call::new(allreduce::Op::AllReduce, DType::F32, p, p, 8, comm.world() + 1, 64);
            assert!(matches!(comm.issue(foreign.unwrap(), None, s), Err(Error::Call(CallError::Foreign { .. }))));
            // Inside the registered buffers only from their start.
            let (ri, ro) = (comm.registered_input().ptr(), comm.registered_output().ptr());
            let inside = comm.all_reduce(ri.offset(256), ro, 8, DType::F32, s);
            assert!(matches!(&inside, Err(Error::BadArgs(m)) if m.contains("registered input")), "{inside:?}");
            let inside = comm.all_reduce(p, ro.offset(16), 8, DType::F32, s);
            assert!(matches!(&inside, Err(Error::BadArgs(m)) if m.contains("registered output")), "{inside:?}");
        }
        let mut short = vec![0f32; 3];
        if gpu.kind() != gpu::DriverKind::Host {
            let refused = comm.all_reduce_host(&[1f32; 3], &mut short);
            assert!(matches!(refused, Err(Error::Unsupported(_))), "{refused:?}");
            return;
        }
        // On the host driver a stream handle is a number it checks (on a GPU driver, an invalid handle is the
        // undefined behaviour the unsafe contract excludes).
        // SAFETY: refused before any work.
        assert!(matches!(unsafe { comm.all_reduce(p, p, 8, DType::F32, 0xdead) }, Err(Error::Gpu(_))));
        assert!(matches!(comm.all_reduce_host(&[1f32; 4], &mut short), Err(Error::BadArgs(_))));
        // The communicator still works after refusing.
        let mut data = vec![1.0f32; 100];
        comm.all_reduce_host_in_place(&mut data).unwrap();
        assert!(data.iter().all(|&v| v == comm.world() as f32));
    });
}

#[test]
fn host_slices_any_alignment_in_place_and_reduce_scatter() {
    as_job("host_slices_any_alignment_in_place_and_reduce_scatter", 4, |info| {
        let comm = host_comm(info, 1 << 16);
        let (rank, world) = (comm.rank(), comm.world());
        let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
        let n = 4099;
        let x: Vec<f32> = input_values(seed, rank, n + 1, DType::F32);
        let want = reference(seed, world, n + 1, DType::F32, 0, n + 1);
        // An odd offset: not 16-byte aligned, staged.
        let mut out = vec![f32::NAN; n + 1];
        comm.all_reduce_host(&x[1..], &mut out[1..]).unwrap();
        let tol = tolerance(DType::F32, world, false);
        for i in 1..=n {
            assert!((out[i] as f64 - want[i]).abs() <= tol * want[i] + 1e-30, "element {i}");
        }
        let mut inplace = x[1..].to_vec();
        comm.all_reduce_host_in_place(&mut inplace).unwrap();
        assert_eq!(inplace, out[1..], "in place gives the same bits as out of place");
        let count = 4 * world * 10;
        let bf: Vec<half::bf16> =
            input_values(seed, rank, count, DType::Bf16).iter().map(|&v| half::bf16::from_f32(v)).collect();
        let mut shard = vec![half::bf16::NAN; count / world];
        comm.reduce_scatter_host(&bf, &mut shard).unwrap();
        assert_eq!(comm.last_algorithm(), Some(Algorithm::CarReduceScatter));
        let (lo, hi) = measure::check::output_range(allreduce::Op::ReduceScatter, count, world, rank);
        let want = reference(seed, world, count, DType::Bf16, lo, hi);
        let got: Vec<f64> = shard.iter().map(|v| v.to_f64()).collect();
        assert_eq!(measure::check::compare(&got, &want, tolerance(DType::Bf16, world, false)).wrong, 0);
    });
}

/// All-gather on fresh random inputs: every rank's output is every rank's input in rank order, exactly and with the
/// same bits on every rank, through the raw call (every dtype; counts whose rank slots are not 16-byte aligned, and
/// the whole capacity) and the host slices (an unaligned slice, staged); in place and a forced reduce-scatter
/// refused.
#[test]
fn all_gather_gives_every_rank_every_input_in_rank_order() {
    as_job("all_gather_gives_every_rank_every_input_in_rank_order", ranks(3), |info| {
        let capacity = 1 << 16;
        let comm = comm_on(backend(), info, capacity);
        let (rank, world, rdv) = (comm.rank(), comm.world(), comm.rendezvous());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let input = gpu.alloc(capacity, MemKind::Device).unwrap();
        let output = gpu.alloc(world * capacity, MemKind::Device).unwrap();
        for dtype in DType::ALL {
            for count in [1, 13, 4099, capacity / dtype.size()] {
                let seed = measure::check::agree_seed(rdv).unwrap();
                stream.upload(&input, 0, &dtype.encode(&input_values(seed, rank, count, dtype))).unwrap();
                stream.fill(&output, 0xFF).unwrap();
                // SAFETY: our own buffers, of the capacity and of the world's outputs; every rank makes this call.
                let algo = unsafe { comm.all_gather(input.ptr(), output.ptr(), count, dtype, stream.handle()) };
                assert_eq!(algo.unwrap(), Algorithm::CarAllGather);
                stream.sync().unwrap();
                let want = Expected::seeded(Op::AllGather, seed, world, count, dtype, rank, false);
                let mut got = vec![0u8; want.values.len() * dtype.size()];
                stream.download(&output, 0, &mut got).unwrap();
                let what = format!("all_gather {dtype} x {count}");
                let verdict = agree_verdict(rdv, &got, dtype, &want.values, want.tol, want.bitwise, &what);
                assert_eq!(verdict.unwrap(), None);
            }
        }
        let (p, s) = (input.ptr(), stream.handle());
        // SAFETY: both are refused before any work.
        unsafe {
            let in_place = comm.all_gather(p, p, 8, DType::F32, s);
            assert!(matches!(in_place, Err(Error::Call(CallError::Overlap { .. }))), "{in_place:?}");
            let call = comm.call(Op::AllGather, DType::F32, p, output.ptr(), 8).unwrap();
            let forced = comm.issue(call, Some(Algorithm::CarReduceScatter), s);
            assert!(matches!(&forced, Err(Error::BadArgs(m)) if m == "car_rs does not run all_gather"), "{forced:?}");
        }
        if gpu.kind() != gpu::DriverKind::Host {
            return;
        }
        let (seed, n) = (measure::check::agree_seed(rdv).unwrap(), 1000);
        let x = input_values(seed, rank, n + 1, DType::F32);
        let mut out = vec![f32::NAN; world * n + 1];
        comm.all_gather_host(&x[1..], &mut out[1..]).unwrap();
        let want: Vec<f32> = (0..world).flat_map(|r| input_values(seed, r, n + 1, DType::F32).split_off(1)).collect();
        assert!(out[1..].iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "an unaligned slice, staged");
        assert!(matches!(comm.all_gather_host(&x, &mut out[..n]), Err(Error::BadArgs(_))));
    });
}

#[test]
fn tables_are_named_and_cached_tables_found() {
    as_job("tables_are_named_and_cached_tables_found", 2, |info| {
        let comm = host_comm(info, 1 << 16);
        for mode in Mode::ALL {
            for residency in Residency::ALL {
                let source = comm.table_source(mode, residency);
                assert!(matches!(source, allreduce::TableSource::BuiltIn { .. }), "{mode:?} {residency}");
                // A built-in table measured for another job shape says so.
                let text = source.to_string();
                assert!(text.contains(&format!("{} buffers", residency.name())), "{text}");
            }
        }
        assert!(comm.notes().iter().any(|n| n.contains("no tune table")));
        assert_eq!(comm.placement().ranks_per_device, 2);
        assert!(comm.placement().to_string().contains("bus id host"));
    });
}

#[test]
fn registered_caller_buffers_are_read_in_place() {
    as_job("registered_caller_buffers_are_read_in_place", ranks(3), |info| {
        let capacity = 1 << 20;
        let mut comm = comm_on(backend(), info, capacity);
        let (rank, world) = (comm.rank(), comm.world());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let mine = gpu.alloc(2 * capacity, MemKind::Ipc { uncached: true }).unwrap();
        let private = gpu.alloc(4096, MemKind::Device).unwrap();
        // SAFETY: our own allocations, alive as long as the communicator.
        let refused = unsafe { comm.register(private.ptr(), 4096) };
        assert!(matches!(refused, Err(Error::Unsupported(_)) | Err(Error::Gpu(_))), "{:?}", refused.err());
        // SAFETY: as above.
        let id = unsafe { comm.register(mine.ptr(), 2 * capacity).unwrap() };
        let out = mine.ptr().offset(capacity);
        // The last count lies past the packet two-shot's area (a packet area of every source), at any world size.
        let past_packets = symm::tuned::LL_MAX_BYTES * world / 2 + 4099;
        for count in [8, 4099, past_packets] {
            let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
            let dtype = DType::Bf16;
            let want = reference(seed, world, count, dtype, 0, count);
            let zero_copy = [
                Algorithm::SymmZc1Shot,
                Algorithm::SymmZc2ShotPush,
                Algorithm::SymmZc2ShotPull,
                Algorithm::SymmZc2Shot,
                Algorithm::SymmZc2ShotLl,
            ];
            for algo in zero_copy {
                stream.fill(&mine, 0xFF).unwrap_or(());
                stream.upload(&mine, 0, &dtype.encode(&input_values(seed, rank, count, dtype))).unwrap();
                // SAFETY: registered ranges at the same offsets on every rank.
                unsafe { all_reduce_with(&comm, Some(algo), mine.ptr(), out, count, dtype, stream.handle()).unwrap() };
                stream.sync().unwrap();
                let mut got = vec![0u8; count * dtype.size()];
                stream.download(&mine, capacity, &mut got).unwrap();
                let v = agree_verdict(
                    comm.rendezvous(),
                    &got,
                    dtype,
                    &want,
                    tolerance(dtype, world, false),
                    true,
                    "registered",
                );
                assert_eq!(v.unwrap(), None, "{algo} x {count}");
            }
        }
        // Released on every rank: later calls on the range still run, exactly (through the copy-in now); a second
        // release of the same registration is refused on every rank.
        // The last call asked for the packet two-shot beyond its area: what ran (and is reported) is its stand-in.
        assert_eq!(comm.last_algorithm(), Some(Algorithm::SymmZc2Shot));
        stream.sync().unwrap();
        // SAFETY: every call on the registration has run (the stream is idle).
        unsafe { comm.release(id).unwrap() };
        let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
        let zc = Some(Algorithm::SymmZc2Shot);
        checked_call(&mut comm, seed, &stream, &mine, (0, capacity), 4099, DType::Bf16, zc, "after release");
        // SAFETY: refused before anything is unmapped.
        let again = unsafe { comm.release(id) };
        assert!(matches!(&again, Err(Error::Mismatch(m)) if m.contains("no such registration")), "{again:?}");
    });
}

#[test]
fn explicit_coordinates_and_a_missing_launcher() {
    std::env::remove_var("ALLREDUCE_JOB_ID");
    let me = launch::RankInfo::explicit(0, 1, 0, ipc::JobId::random()).unwrap();
    let comm = host_comm(me, 4096);
    let mut x = vec![half::f16::from_f32(0.5); 64];
    comm.all_reduce_host_in_place(&mut x).unwrap();
    assert!(x.iter().all(|v| v.to_f32() == 0.5));
    let _ = DevicePtr(0);
}

/// Half of a 2-node torchrun job (and a 16-rank one, over the one-node limit) is told at once that it spans nodes,
/// instead of waiting the set-up deadline for ranks that could never come through this node's shared memory.
/// Ranks of other jobs on the device (`Options::device_shared_by`): taken where more than the job's own, agreed by
/// every rank (a rank that says otherwise is named), and refused when 0.
#[test]
fn ranks_sharing_the_device_are_declared_and_agreed() {
    as_job("ranks_sharing_the_device_are_declared_and_agreed", 2, |info| {
        let opts = |n| Options {
            backend: gpu::Backend::Host,
            capacity_bytes: 4096,
            device_shared_by: n,
            ..Options::default()
        };
        let e = Communicator::new(info.clone(), opts(Some(0))).err();
        assert!(matches!(&e, Some(Error::BadArgs(m)) if m.contains("device_shared_by")), "{e:?}");
        let comm = Communicator::new(info.clone(), opts(Some(5))).unwrap();
        assert_eq!(comm.device_shared_by(), 5);
        let mut x = vec![1.0f32; 64];
        comm.all_reduce_host_in_place(&mut x).unwrap();
        assert!(x.iter().all(|&v| v == 2.0));
        drop(comm);
        // A second job of the same ranks (its id derived alike on each), where rank 1 says 3.
        let id = info.job.as_str();
        let last = if id.ends_with('0') { "1" } else { "0" };
        let mut again = info.clone();
        again.job = ipc::JobId::parse(&format!("{}{last}", &id[..id.len() - 1])).unwrap();
        let n = if again.rank == 1 { 3 } else { 5 };
        // The rank that compares first names the difference; the other learns it from that rank's abort.
        let e = Communicator::new(again, opts(Some(n))).err().expect("refused").to_string();
        assert!(e.contains("device_shared_by=Some(3)") && e.contains("device_shared_by=Some(5)"), "{e}");
    });
}

#[test]
fn a_job_that_spans_nodes_is_refused_at_once() {
    for (world, local) in [("8", "4"), ("16", "8")] {
        let env: std::collections::HashMap<String, String> = [
            ("RANK", "1"),
            ("WORLD_SIZE", world),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", local),
            ("GROUP_RANK", "0"),
            ("TORCHELASTIC_RUN_ID", "spans-nodes"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into_iter()
        .collect();
        let info = launch::detect_from(&env).unwrap().expect("torchrun's variables");
        assert_eq!(info.spans_nodes(), Some(local.parse().unwrap()));
        let start = std::time::Instant::now();
        let e = Communicator::new(info, Options { backend: gpu::Backend::Host, ..Options::default() }).err();
        assert!(matches!(&e, Some(Error::Unsupported(m)) if m.contains("spans nodes") && m.contains(world)), "{e:?}");
        // Well short of the set-up deadline (60 s at least) a refusal that waited for peers would reach, with room for
        // a loaded machine.
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "refused after {:?}", start.elapsed());
    }
}

/// The packet designs across the packet flags' wrap: the epoch counters start just below it, and calls of every tuned
/// design (packets of every size up to the area, the epoch and zero-copy designs between them) cross it, each result
/// exact, three times (near 2^32, 2^33 and 3 * 2^32). The last rank starts each call late, so the others poll slots it
/// has not written yet: with the old flags (the epoch's low 32 bits, no cleaning), epoch 2^32's flag was 0, which every
/// never-written slot holds, and they read those as data; and the slots hold packets of the flags the calls after the
/// wrap poll for, planted before the wrap's cleaning calls. Calls with the residual add and RMSNorm (`symm_ll_norm` and
/// `symm_zc_2shot_ll_norm`, whose rows take packets of their own) among them: r is the exact sum (a zero residual).
#[test]
fn packets_stay_exact_across_the_flag_wrap() {
    as_job("packets_stay_exact_across_the_flag_wrap", ranks(3), |info| {
        use allreduce::AddRmsNorm;
        use measure::check::{variant_input, variant_sum};
        use symm::tuned::{ll_flag, Design, PeerBuffers, TunedOptions};
        let capacity = 256 << 10;
        let comm = comm_on(backend(), info, 4096);
        let (rank, world) = (comm.rank(), comm.world());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let input = gpu.alloc(capacity, MemKind::Device).unwrap();
        let output = gpu.alloc(capacity, MemKind::Device).unwrap();
        let [residual, weight] = [0; 2].map(|_| gpu.alloc(capacity, MemKind::Device).unwrap());
        let dtype = DType::F32;
        let full = LL_MAX_BYTES / 4;
        // A call of `count` elements; with a row length, it carries the norm (rows of 8000 in vectors, of 301 not).
        // Call c runs at epoch m * 2^32 - 7 + c: the first full-area packet call is epoch m * 2^32, whose slots past
        // the small calls' were never written; the flags' own wrap (a multiple of 2^32 - 1) falls in the same run.
        // The wrap's cleaning calls are 4 and 5 (m = 1), 3 and 4 (m = 2), 2 and 3 (m = 3): the fused packet two-shot
        // (call 3), whose blocks each zero their own rows' slots, among them.
        let plan = [
            (Design::Ll, 13, None),
            (Design::Ll, 13, None),
            (Design::Ll, 3 * 8000, Some(8000)),
            (Design::ZeroCopyTwoShotLl, 7 * 300, Some(300)),
            (Design::EpochOneShot, 5000, None),
            (Design::ZeroCopyOneShot, 300, None),
            (Design::Ll, 1000, None),
            (Design::ZeroCopyTwoShot, 7000, None),
            (Design::Ll, full, None),
            (Design::Ll, full, None),
            (Design::ZeroCopyTwoShotLl, 4096, None),
            (Design::Ll, full - 1, None),
            (Design::Ll, 5 * 301, Some(301)),
            (Design::ZeroCopyTwoShotLl, 9000, None),
            (Design::Ll, full, None),
            (Design::Ll, full, None),
        ];
        for m in 1..=3u64 {
            let first_epoch = (m << 32) - 8;
            let opts = TunedOptions { first_epoch, ..TunedOptions::new(capacity) };
            let tuned = tuned_on(&comm, Design::Ll, opts);
            // Before the wrap's cleaning calls, every slot of each area gets a packet of the flag that the area's
            // first packet call after the wrap polls for, with data no sum contains, as if left there a whole flag
            // period ago: only the cleaning keeps those calls from reading it where the last rank has not written.
            let epoch = |call: usize| first_epoch + 1 + call as u64;
            let cleaning = (0..plan.len()).find(|&c| ll_flag(epoch(c) + 2) < ll_flag(epoch(c))).unwrap();
            let mut stale = [0u64; 2];
            for (call, &(design, _, _)) in plan.iter().enumerate().skip(cleaning + 2) {
                let parity = (epoch(call) & 1) as usize;
                if matches!(design, Design::Ll | Design::ZeroCopyTwoShotLl) && stale[parity] == 0 {
                    stale[parity] = ll_flag(epoch(call)) | 0x7f7f_7f7f;
                }
            }
            assert!(stale.iter().all(|&w| w != 0), "the plan polls both areas after the wrap");
            for (call, &(design, count, hidden)) in plan.iter().enumerate() {
                let k = call as u64;
                if call == cleaning {
                    let (area, bytes) = tuned.packet_area();
                    let words: Vec<u8> = (0..bytes / 8).flat_map(|i| stale[i * 16 / bytes].to_le_bytes()).collect();
                    let planted = gpu.alloc(bytes, MemKind::Device).unwrap();
                    stream.upload(&planted, 0, &words).unwrap();
                    // SAFETY: this rank's packet area, `bytes` long, which no peer writes between calls.
                    unsafe { stream.copy(area, planted.ptr(), bytes).unwrap() };
                    stream.sync().unwrap();
                    comm.rendezvous().barrier("stale packets planted").unwrap();
                }
                stream.upload(&input, 0, &variant_input(rank, count, k, dtype)).unwrap();
                stream.fill(&output, 0xFF).unwrap();
                let (i, o) = (input.ptr(), output.ptr());
                let mut call =
                    allreduce::Call::new(allreduce::Op::AllReduce, dtype, i, o, count, world, capacity).unwrap();
                if let Some(hidden) = hidden {
                    stream.fill(&residual, 0).unwrap();
                    stream.upload(&weight, 0, &dtype.encode(&vec![1.0; hidden])).unwrap();
                    let norm = AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden, eps: 1e-5 };
                    call = call.with_add_rms_norm(norm).unwrap();
                    assert!(tuned.carries_norm(design, &call), "{count} elements in rows of {hidden}");
                }
                if rank + 1 == world {
                    std::thread::sleep(std::time::Duration::from_millis(60));
                }
                // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
                unsafe { tuned.run_design(design, &call, &PeerBuffers::default(), &stream).unwrap() };
                let mut got = vec![0u8; count * 4];
                stream.download(if hidden.is_some() { &residual } else { &output }, 0, &mut got).unwrap();
                let want = variant_sum(world, 0, count, k);
                let what = format!("{design:?} x {count} (rows of {hidden:?}) at epoch {}", first_epoch + 1 + k);
                let verdict = agree_verdict(comm.rendezvous(), &got, dtype, &want, 0.0, true, &what);
                assert_eq!(verdict.unwrap(), None);
            }
            stream.sync().unwrap();
            comm.rendezvous().barrier("wrap round done").unwrap();
        }
    });
}

/// A file of tables that sends each residency to another algorithm, for the tests that follow.
fn tables_by_residency(dir: &std::path::Path, world: usize) -> std::path::PathBuf {
    let by = |r: Residency| match r {
        Residency::Caller => "car_1shot",
        Residency::Registered => "symm_zc_2shot",
        Residency::CallerRegistered => "symm_zc_1shot",
    };
    let set: Vec<allreduce::TuneTable> = Mode::ALL
        .into_iter()
        .flat_map(|mode| Residency::ALL.map(move |r| (mode, r)))
        .map(|(mode, r)| allreduce::TuneTable {
            key: Some(allreduce::tune::TableKey::new(gpu::DriverKind::Host, "any", (world, world), mode, r)),
            measured_on: "test".into(),
            entries: vec![allreduce::tune::TuneEntry { max_bytes: None, method: by(r).into() }],
        })
        .collect();
    let path = dir.join(format!("by-residency-{world}.json"));
    std::fs::write(&path, serde_json::to_string(&set).unwrap()).unwrap();
    path
}

/// Runs one allreduce of the inputs of `seed` from `input` into `output` (both of `count` elements at the given
/// offsets of `buf`) and checks it against the float64 reference, bitwise equal on every rank; returns its
/// fingerprint.
#[allow(clippy::too_many_arguments)]
fn checked_call(
    comm: &mut Communicator,
    seed: u64,
    stream: &gpu::Stream,
    buf: &gpu::DeviceBuffer,
    (input, output): (usize, usize),
    count: usize,
    dtype: DType,
    algo: Option<Algorithm>,
    what: &str,
) -> u64 {
    let (rank, world) = (comm.rank(), comm.world());
    stream.upload(buf, input, &dtype.encode(&input_values(seed, rank, count, dtype))).unwrap();
    if output != input {
        stream.upload(buf, output, &vec![0xFF; count * dtype.size()]).unwrap();
    }
    let (i, o) = (buf.ptr().offset(input), buf.ptr().offset(output));
    // SAFETY: ranges of our own buffer; every rank runs the same sequence.
    unsafe { all_reduce_with(comm, algo, i, o, count, dtype, stream.handle()).unwrap() };
    stream.sync().unwrap();
    let mut got = vec![0u8; count * dtype.size()];
    stream.download(buf, output, &mut got).unwrap();
    let want = reference(seed, world, count, dtype, 0, count);
    let verdict = agree_verdict(comm.rendezvous(), &got, dtype, &want, tolerance(dtype, world, false), true, what);
    assert_eq!(verdict.unwrap(), None, "{what}");
    fingerprint(&got)
}

#[test]
fn each_residency_follows_its_own_table() {
    as_job("each_residency_follows_its_own_table", ranks(3), |info| {
        let dir =
            std::env::temp_dir().join(format!("arx-residency-{}", info.job.shm_name("t").trim_start_matches('/')));
        std::fs::create_dir_all(&dir).unwrap();
        let capacity = 64 << 10;
        let path = tables_by_residency(&dir, info.world);
        let opts =
            Options { backend: backend(), capacity_bytes: capacity, tune_table: Some(path), ..Options::default() };
        let mut comm = Communicator::new(info, opts).unwrap();
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let own = gpu.alloc(2 * capacity, MemKind::Device).unwrap();
        let shared = gpu.alloc(2 * capacity, MemKind::Ipc { uncached: false }).unwrap();
        // SAFETY: our own allocation, alive as long as the communicator.
        unsafe { comm.register(shared.ptr(), 2 * capacity).unwrap() };
        let (dtype, count) = (DType::Bf16, 5000);
        let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
        let caller = checked_call(&mut comm, seed, &stream, &own, (0, capacity), count, dtype, None, "caller");
        assert_eq!(comm.last_algorithm(), Some(Algorithm::Car1Shot), "caller buffers take the caller table");
        let registered =
            checked_call(&mut comm, seed, &stream, &shared, (0, capacity), count, dtype, None, "registered");
        assert_eq!(comm.last_algorithm(), Some(Algorithm::SymmZc1Shot), "a registration takes its table");
        assert_eq!(caller, registered, "the same bits whatever the residency picks");
        // The communicator's registered input: its own table.
        let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
        let (rank, world) = (comm.rank(), comm.world());
        let (input, output) = (comm.registered_input().ptr(), comm.registered_output().ptr());
        stream.upload(comm.registered_input(), 0, &dtype.encode(&input_values(seed, rank, count, dtype))).unwrap();
        // SAFETY: the registered buffers, of `capacity` bytes.
        unsafe { comm.all_reduce(input, output, count, dtype, stream.handle()).unwrap() };
        stream.sync().unwrap();
        assert_eq!(comm.last_algorithm(), Some(Algorithm::SymmZc2Shot), "the registered buffers take theirs");
        let mut got = vec![0u8; count * dtype.size()];
        stream.download(comm.registered_output(), 0, &mut got).unwrap();
        let want = reference(seed, world, count, dtype, 0, count);
        let v = agree_verdict(comm.rendezvous(), &got, dtype, &want, tolerance(dtype, world, false), true, "reg");
        assert_eq!(v.unwrap(), None);
        std::fs::remove_dir_all(&dir).ok();
    });
}

/// A graph captured on the caller's own buffers between begin_graph_capture and end_graph_capture: every zero-copy
/// design reads and writes them in place at replay (no copy was captured: fresh inputs written to the caller's
/// buffers reach every peer), every replay exact and bitwise equal across ranks and to the eager call; a buffer
/// that cannot be shared keeps its copy and the notes say so.
#[test]
fn graph_capture_registers_the_callers_buffers() {
    as_job("graph_capture_registers_the_callers_buffers", ranks(3), |info| {
        let capacity = 256 << 10;
        let mut comm = comm_on(backend(), info, capacity);
        let (rank, world) = (comm.rank(), comm.world());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let dtype = DType::F32;
        let algos = [
            Algorithm::SymmZc1Shot,
            Algorithm::SymmZc2Shot,
            Algorithm::SymmZc2ShotPush,
            Algorithm::SymmZc2ShotPull,
            Algorithm::SymmZc2ShotLl,
            Algorithm::Car1Shot,
        ];
        let counts = [1usize, 4099, 20_000];
        // One shareable buffer per call (input, then output), and one private one whose call must copy.
        let calls: Vec<(Algorithm, usize)> = algos.iter().flat_map(|&a| counts.map(|n| (a, n))).collect();
        let slot = 2 * 20_000 * 4;
        let shared = gpu.alloc(calls.len() * slot, MemKind::Ipc { uncached: false }).unwrap();
        let private = gpu.alloc(slot, MemKind::Device).unwrap();
        comm.begin_graph_capture().unwrap();
        stream.begin_capture().unwrap();
        for (k, &(algo, count)) in calls.iter().enumerate() {
            let (i, o) = (shared.ptr().offset(k * slot), shared.ptr().offset(k * slot + slot / 2));
            // SAFETY: ranges of our own buffers, alive as long as the communicator.
            unsafe { all_reduce_with(&comm, Some(algo), i, o, count, dtype, stream.handle()).unwrap() };
        }
        let (pi, po) = (private.ptr(), private.ptr().offset(slot / 2));
        // SAFETY: as above.
        unsafe {
            all_reduce_with(&comm, Some(Algorithm::SymmZc2Shot), pi, po, 20_000, dtype, stream.handle()).unwrap()
        };
        // car copies its input in anyway: private memory costs it nothing and earns no note.
        // SAFETY: as above.
        unsafe { all_reduce_with(&comm, Some(Algorithm::Car1Shot), pi, po, 20_000, dtype, stream.handle()).unwrap() };
        let graph = stream.end_capture().unwrap();
        // SAFETY: the buffers live as long as the communicator; no replay before this returns.
        let deferred = unsafe { comm.end_graph_capture().unwrap() };
        let zero_copy = algos.len() - 1;
        assert_eq!(deferred, zero_copy * counts.len() + 1, "every zero-copy call was deferred, car's none");
        let notes = comm.notes().join("\n");
        assert!(notes.contains("cannot be shared") && notes.matches("graph capture").count() == 2, "{notes}");
        for what in ["input", "output"] {
            assert!(notes.contains(&format!("graph capture: 1 call(s) copy their {what} ")), "{notes}");
        }
        for replay in 0..3 {
            // Fresh inputs per replay, the same for every call of one size (so the designs can be compared).
            let by_count: Vec<u64> =
                counts.iter().map(|_| measure::check::agree_seed(comm.rendezvous()).unwrap()).collect();
            let mut seeds = Vec::new();
            for (k, &(_, count)) in calls.iter().enumerate() {
                let seed = by_count[counts.iter().position(|&n| n == count).expect("one of counts")];
                stream.upload(&shared, k * slot, &dtype.encode(&input_values(seed, rank, count, dtype))).unwrap();
                stream.upload(&shared, k * slot + slot / 2, &vec![0xFF; count * 4]).unwrap();
                seeds.push(seed);
            }
            let pseed = measure::check::agree_seed(comm.rendezvous()).unwrap();
            stream.upload(&private, 0, &dtype.encode(&input_values(pseed, rank, 20_000, dtype))).unwrap();
            stream.sync().unwrap();
            // Every rank's inputs are in place before any rank replays (the graph holds no host barrier).
            comm.rendezvous().barrier("inputs written").unwrap();
            stream.replay(&graph).unwrap();
            stream.sync().unwrap();
            let tol = tolerance(dtype, world, false);
            let mut prints = Vec::new();
            for (k, &(algo, count)) in calls.iter().enumerate() {
                let mut got = vec![0u8; count * 4];
                stream.download(&shared, k * slot + slot / 2, &mut got).unwrap();
                let want = reference(seeds[k], world, count, dtype, 0, count);
                let what = format!("replay {replay}: {algo} x {count}");
                assert_eq!(agree_verdict(comm.rendezvous(), &got, dtype, &want, tol, true, &what).unwrap(), None);
                prints.push((count, fingerprint(&got)));
            }
            for &(count, print) in &prints {
                assert!(prints.iter().filter(|p| p.0 == count).all(|p| p.1 == print), "designs differ at {count}");
            }
            let mut got = vec![0u8; 20_000 * 4];
            stream.download(&private, slot / 2, &mut got).unwrap();
            let want = reference(pseed, world, 20_000, dtype, 0, 20_000);
            let verdict = agree_verdict(comm.rendezvous(), &got, dtype, &want, tol, true, "private, copied");
            assert_eq!(verdict.unwrap(), None);
            // The eager call on the same inputs gives the graph's bits.
            let (k, seed) = (calls.len() - 1, seeds[calls.len() - 1]);
            let (count, graph_print) = prints[k];
            let out = (k * slot, slot / 2);
            let eager = checked_call(&mut comm, seed, &stream, &shared, out, count, dtype, None, "eager");
            assert_eq!(eager, graph_print, "eager and graph replay differ at {count}");
        }
        comm.rendezvous().barrier("done").unwrap();
    });
}

/// The communicator that ran a tune follows its tables at once, plain and norm calls', in every mode and residency;
/// one whose options named a table file keeps following that file.
#[test]
fn a_tune_is_followed_at_once_unless_the_tables_were_named() {
    as_job("a_tune_is_followed_at_once_unless_the_tables_were_named", ranks(2), |info| {
        let dir = std::env::temp_dir().join(format!("arx-tune-followed-{}", info.job.as_str()));
        let named = dir.join("named.json");
        if info.rank == 0 {
            std::fs::create_dir_all(&dir).unwrap();
            let one = r#"{"measured_on": "by hand", "entries": [{"max_bytes": null, "method": "car_2shot"}]}"#;
            std::fs::write(&named, one).unwrap();
        }
        while !named.exists() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for tune_table in [None, Some(named.clone())] {
            let opts = Options {
                backend: backend(),
                capacity_bytes: 1 << 20,
                tune_dir: Some(dir.join("cache")),
                tune_table: tune_table.clone(),
                ..Options::default()
            };
            let mut comm = Communicator::new(info.clone(), opts).unwrap();
            let mut req = allreduce::TuneRequest::new(DType::F32);
            req.counts = Some(vec![256, 1024]);
            req.norm_hidden = Some(256);
            req.timing = measure::timing::TimingOptions { iters: 2, warmup: 1, repeats: 1, graph: false };
            let none = allreduce::TuneRequest { residencies: Vec::new(), ..req.clone() };
            let refused = comm.tune_with(&none, &mut |_| panic!("measured with no residency"));
            assert!(
                matches!(refused, Err(Error::BadArgs(ref m)) if m.contains("at least one residency")),
                "{refused:?}"
            );
            let mut seen = Vec::new();
            let report = comm.tune_with(&req, &mut |m| seen.push(m.clone())).unwrap();
            // A near tie's two candidates are timed again and reported again, never one of them alone.
            let size = |m: &allreduce::Measured| (m.op, m.mode, m.residency, m.count);
            for m in &report.measured {
                let retimed = report.measured.iter().filter(|n| size(n) == size(m) && n.retimed).count();
                assert!(retimed == 0 || retimed == 2, "{retimed} re-timed at {:?}", size(m));
                let reported = seen.iter().filter(|n| (size(n), n.choice) == (size(m), m.choice)).count();
                assert_eq!(reported, 1 + usize::from(m.retimed), "{:?} {}", size(m), m.choice);
            }
            for (op, mode, residency, table) in comm.tables().iter() {
                let want = match &tune_table {
                    Some(file) => allreduce::TableSource::File(file.clone()),
                    None => {
                        let stored = report.tables.iter().find(|(t, _)| {
                            t.key.as_ref().is_some_and(|k| (k.op, k.mode, k.residency) == (op, mode, residency))
                        });
                        allreduce::TableSource::Cache(stored.expect("measured").1.clone())
                    }
                };
                assert_eq!(table.source, want, "{op:?} {mode:?} {residency:?}");
            }
            if tune_table.is_some() {
                // Every rank is done with the files.
                comm.rendezvous().barrier("tune test done").unwrap();
                if info.rank == 0 {
                    std::fs::remove_dir_all(&dir).unwrap();
                }
            }
        }
    });
}
