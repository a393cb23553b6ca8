//! The calls whose blocks own whole rows, as multi-process jobs (see `communicator.rs`): the allreduce with the
//! residual add and RMSNorm on every algorithm, and the reduce-scatter split along the last dimension. On the host
//! driver by default; `ARX_TEST_BACKEND=cuda` (or hip) and `ARX_TEST_RANKS=8` run them on a GPU node.

use allreduce::tune::{TableKey, TableOp};
use allreduce::{AddRmsNorm, Algorithm, CallError, Choice, Communicator, DType, Mode, Op, Options, Residency};
use gpu::MemKind;
use measure::check::{
    add_rms_norm_tolerance, agree_verdict, fingerprint, input_values, reference, tolerance, NormCase,
};

mod common;
use common::{as_job, as_job_with, backend, comm_on, host_comm, ranks, tuned_on};

/// The residual add and RMSNorm after the sum: fused in car's one-shot and two-shot, the packets (`symm_ll`, car's
/// fused one-shot where the rows do not fit the packets), the epoch one-shot, the zero-copy one- and two-shot and
/// the pushed two-shot (where its slots fit), unfused (the design's allreduce, then the norm kernel) after the packet
/// two-shot, and unfused after every design when asked. Rows that do not
/// divide among the ranks, fewer rows than ranks, odd row lengths; fresh inputs every run, a poisoned output, out of
/// place and in place; r and y within the float64 bound and the same bits on every rank and from every choice.
#[test]
fn every_algorithm_carries_the_residual_add_and_rms_norm_with_the_same_bits() {
    as_job("every_algorithm_carries_the_residual_add_and_rms_norm_with_the_same_bits", ranks(3), |info| {
        let capacity = 1 << 20;
        let comm = comm_on(backend(), info, capacity);
        let (rank, world) = (comm.rank(), comm.world());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let [input, output, residual, weight] = [0; 4].map(|_| gpu.alloc(capacity, MemKind::Device).unwrap());
        // (191, 257): as many bytes as the packet area holds, but a packet more per row than that (odd rows of 2-byte
        // elements start packets of their own), so the fused packets hand bf16 and fp16 over to car's one-shot.
        let shapes = [(1, 8), (2, 4096), (5, 300), (7, 257), (13, 1000), (191, 257), (64, 4096)];
        for (dtype, (rows, hidden)) in DType::ALL.into_iter().flat_map(|d| shapes.map(|s| (d, s))) {
            let count = rows * hidden;
            if count * dtype.size() > capacity {
                continue;
            }
            let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
            let x = dtype.encode(&input_values(seed, rank, count, dtype));
            // The residual and the weights near 1: every rank the same, as a model's are.
            let case = NormCase::new(seed, world, count, hidden, dtype, 1e-5);
            let (res, w, want_r, want_y) = (&case.residual, &case.weight, &case.want_r, &case.want_y);
            stream.upload(&weight, 0, &dtype.encode(w)).unwrap();
            let tol = add_rms_norm_tolerance(dtype, world);
            let norm = AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden, eps: 1e-5 };
            // Every algorithm fused (where it carries the norm) and unfused, and auto; out of place and in place.
            let runs: Vec<(Option<Choice>, bool)> = Algorithm::CANDIDATES
                .into_iter()
                .flat_map(|a| [Some(Choice::of(a)), Some(Choice::unfused(a))])
                .chain([None])
                .flat_map(|c| [(c, false), (c, true)])
                .collect();
            let mut prints = Vec::new();
            for (choice, in_place) in runs {
                stream.upload(&input, 0, &x).unwrap();
                stream.upload(&residual, 0, &dtype.encode(res)).unwrap();
                stream.fill(&output, 0xFF).unwrap();
                let out = if in_place { &input } else { &output };
                // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
                let norms_before = norm_kernels_launched(&gpu);
                let ran = unsafe {
                    let call = comm.call(Op::AllReduce, dtype, input.ptr(), out.ptr(), count).unwrap();
                    let call = call.with_add_rms_norm(norm).unwrap();
                    match choice {
                        Some(c) => comm.issue_as(call, c, stream.handle()).unwrap(),
                        None => {
                            comm.issue(call, None, stream.handle()).unwrap();
                            comm.last_choice().unwrap()
                        }
                    }
                };
                stream.sync().unwrap();
                if let Some(c) = choice.filter(|c| c.unfused) {
                    assert!(ran.unfused, "{c} ran {ran}");
                }
                // What it says it ran is what ran: the norm kernel after the allreduce exactly when unfused.
                if let (Some(before), Some(after)) = (norms_before, norm_kernels_launched(&gpu)) {
                    assert_eq!(after - before, u64::from(ran.unfused), "{choice:?} ran {ran}");
                }
                let how = format!(
                    "{}{}",
                    if choice.is_none() { " (auto)" } else { "" },
                    if in_place { " in place" } else { "" }
                );
                let what = format!("{dtype} {rows}x{hidden}, {ran}{how}");
                let (mut got_y, mut got_r) = (vec![0u8; count * dtype.size()], vec![0u8; count * dtype.size()]);
                stream.download(out, 0, &mut got_y).unwrap();
                stream.download(&residual, 0, &mut got_r).unwrap();
                for (part, got, want) in [("r", &got_r, want_r), ("y", &got_y, want_y)] {
                    let when = format!("{what}: {part}");
                    let verdict = agree_verdict(comm.rendezvous(), got, dtype, want, tol, true, &when);
                    assert_eq!(verdict.unwrap(), None);
                }
                // The canonical order's bits, on every driver: the host twin's.
                assert_eq!(case.twin_difference(dtype, &got_r, &got_y), None, "{what}");
                prints.push((what, fingerprint(&got_r), fingerprint(&got_y)));
            }
            for p in &prints[1..] {
                assert_eq!((p.1, p.2), (prints[0].1, prints[0].2), "{} and {} differ bitwise", p.0, prints[0].0);
            }
        }
    });
}

/// How many launches of the unfused sequence's norm kernel `gpu` has enqueued, where its driver counts them (the host
/// driver's).
fn norm_kernels_launched(gpu: &gpu::Gpu) -> Option<u64> {
    kernels_launched(gpu, "car_add_rms_norm")
}

/// How many launches of the kernels whose names start with `stem` `gpu` has enqueued, where its driver counts them.
fn kernels_launched(gpu: &gpu::Gpu, stem: &str) -> Option<u64> {
    let launches = gpu.launches()?;
    Some(launches.iter().filter(|(name, _)| name.starts_with(stem)).map(|(_, n)| n).sum())
}

/// The zero-copy one- and two-shot with the norm, each copying a caller's input in inside its kernel (`CopyIn::Fused`,
/// reached through the symm crate's options; the two-shot copies only the peers' shares and sums its own from the
/// caller's input): fresh inputs every call, a poisoned output, out of place and in place, odd rows and rows that do
/// not divide among the ranks; r and y within the float64 bound, the same on every rank, and the host twin's bits.
#[test]
fn the_fused_copy_in_carries_the_norm_with_the_twins_bits() {
    as_job("the_fused_copy_in_carries_the_norm_with_the_twins_bits", ranks(3), |info| {
        use symm::tuned::{CopyIn, Design, PeerBuffers, TunedOptions};
        let capacity = 256 << 10;
        let comm = comm_on(backend(), info, 4096);
        let (rank, world) = (comm.rank(), comm.world());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let opts = TunedOptions { copy_in: CopyIn::Fused, ..TunedOptions::new(capacity) };
        let tuned = tuned_on(&comm, Design::ZeroCopyTwoShot, opts);
        let [input, output, residual, weight] = [0; 4].map(|_| gpu.alloc(capacity, MemKind::Device).unwrap());
        let designs =
            [(Design::ZeroCopyOneShot, "symm_zc_1shot_norm_"), (Design::ZeroCopyTwoShot, "symm_zc_2shot_norm_")];
        let shapes = [(1, 8), (2, 4096), (5, 300), (7, 257), (13, 1000)];
        for (design, kernel) in designs {
            for (dtype, (rows, hidden)) in DType::ALL.into_iter().flat_map(|d| shapes.map(|s| (d, s))) {
                for in_place in [false, true] {
                    let count = rows * hidden;
                    let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
                    let case = NormCase::new(seed, world, count, hidden, dtype, 1e-5);
                    stream.upload(&input, 0, &dtype.encode(&input_values(seed, rank, count, dtype))).unwrap();
                    stream.upload(&residual, 0, &dtype.encode(&case.residual)).unwrap();
                    stream.upload(&weight, 0, &dtype.encode(&case.weight)).unwrap();
                    stream.fill(&output, 0xFF).unwrap();
                    let out = if in_place { &input } else { &output };
                    let norm = AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden, eps: 1e-5 };
                    let call =
                        allreduce::Call::new(Op::AllReduce, dtype, input.ptr(), out.ptr(), count, world, capacity)
                            .and_then(|c| c.with_add_rms_norm(norm))
                            .unwrap();
                    assert!(tuned.carries_norm(design, &call), "{design:?} {rows}x{hidden}");
                    let kernel = format!("{kernel}{dtype}");
                    let before = kernels_launched(&gpu, &kernel);
                    // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
                    unsafe { tuned.run_design(design, &call, &PeerBuffers::default(), &stream).unwrap() };
                    stream.sync().unwrap();
                    let how = if in_place { " in place" } else { "" };
                    let what = format!("{design:?} fused copy-in, {dtype} {rows}x{hidden}{how}");
                    if let (Some(before), Some(after)) = (before, kernels_launched(&gpu, &kernel)) {
                        assert_eq!(after - before, 1, "{what}: {kernel} ran once");
                    }
                    let (mut y, mut r) = (vec![0u8; count * dtype.size()], vec![0u8; count * dtype.size()]);
                    stream.download(out, 0, &mut y).unwrap();
                    stream.download(&residual, 0, &mut r).unwrap();
                    let tol = add_rms_norm_tolerance(dtype, world);
                    for (part, got, want) in [("r", &r, &case.want_r), ("y", &y, &case.want_y)] {
                        let verdict =
                            agree_verdict(comm.rendezvous(), got, dtype, want, tol, true, &format!("{what}: {part}"));
                        assert_eq!(verdict.unwrap(), None);
                    }
                    assert_eq!(case.twin_difference(dtype, &r, &y), None, "{what}");
                }
            }
        }
    });
}

/// Norm calls follow the tables of their own calls, plain calls theirs: files whose plain tables name car's one-shot
/// and whose norm tables name the zero-copy one-shot, fused or unfused (the norm kernel after it); the norm call's
/// results are checked as every other's. Without norm tables the engine's rule runs, and the notes say so.
#[test]
fn norm_calls_follow_their_own_tables() {
    as_job("norm_calls_follow_their_own_tables", ranks(3), |info| {
        let (capacity, hidden, rows) = (1 << 20, 256, 5);
        let world = info.world;
        let dir = std::env::temp_dir().join(format!("arx-norm-tables-{}", info.job.as_str()));
        std::fs::create_dir_all(&dir).unwrap();
        // A file of plain tables naming car's one-shot and, with `norm`, norm tables naming it.
        let file = |name: &str, norm: Option<Choice>| {
            let ops = [Some(TableOp::AllReduce), norm.map(|_| TableOp::AddRmsNorm)];
            let set: Vec<allreduce::TuneTable> = ops
                .into_iter()
                .flatten()
                .flat_map(|op| Mode::ALL.into_iter().flat_map(move |m| Residency::ALL.map(move |r| (op, m, r))))
                .map(|(op, mode, r)| allreduce::TuneTable {
                    key: Some(TableKey::new(gpu::DriverKind::Host, "any", (world, world), mode, r).for_op(op)),
                    measured_on: "test".into(),
                    entries: vec![allreduce::tune::TuneEntry {
                        max_bytes: None,
                        method: match op {
                            TableOp::AddRmsNorm => norm.expect("norm tables only with a choice").to_string(),
                            TableOp::AllReduce => "car_1shot".into(),
                        },
                    }],
                })
                .collect();
            let path = dir.join(name);
            if info.rank == 0 {
                std::fs::write(&path, serde_json::to_string(&set).unwrap()).unwrap();
            }
            (path, norm.is_none())
        };
        let (fused, unfused) = (Choice::of(Algorithm::SymmZc1Shot), Choice::unfused(Algorithm::SymmZc1Shot));
        // Without norm tables, the rule: car's fused one-shot for a few rows.
        for ((file, plain_only), want) in [
            (file("fused.json", Some(fused)), fused),
            (file("unfused.json", Some(unfused)), unfused),
            (file("plain.json", None), Choice::of(Algorithm::Car1Shot)),
        ] {
            // Rank 0 wrote the files before the communicator's set-up, which every rank passes together.
            while !file.exists() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let opts = Options {
                backend: backend(),
                capacity_bytes: capacity,
                tune_table: Some(file.clone()),
                ..Options::default()
            };
            let comm = Communicator::new(info.clone(), opts).unwrap();
            let gpu = comm.gpu().clone();
            let stream = gpu.stream().unwrap();
            let [input, output, residual, weight] = [0; 4].map(|_| gpu.alloc(capacity, MemKind::Device).unwrap());
            let (dtype, count) = (DType::Bf16, rows * hidden);
            let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
            let case = NormCase::new(seed, world, count, hidden, dtype, 1e-5);
            stream.upload(&input, 0, &dtype.encode(&input_values(seed, comm.rank(), count, dtype))).unwrap();
            stream.upload(&residual, 0, &dtype.encode(&case.residual)).unwrap();
            stream.upload(&weight, 0, &dtype.encode(&case.weight)).unwrap();
            let norm = AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden, eps: 1e-5 };
            // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
            let norms_before = norm_kernels_launched(&gpu);
            let (ran, plain) = unsafe {
                let call = comm.call(Op::AllReduce, dtype, input.ptr(), output.ptr(), count).unwrap();
                comm.issue(call.with_add_rms_norm(norm).unwrap(), None, stream.handle()).unwrap();
                let ran = comm.last_choice().unwrap();
                let plain = comm.call(Op::AllReduce, dtype, output.ptr(), input.ptr(), count).unwrap();
                comm.issue(plain, None, stream.handle()).unwrap();
                (ran, comm.last_choice().unwrap())
            };
            stream.sync().unwrap();
            assert_eq!((ran, plain), (want, Choice::of(Algorithm::Car1Shot)), "{}", file.display());
            if let (Some(before), Some(after)) = (norms_before, norm_kernels_launched(&gpu)) {
                assert_eq!(after - before, u64::from(want.unfused), "the norm kernel ran as {want}");
            }
            let said = comm.notes().iter().any(|n| n.contains("residual add and RMSNorm"));
            assert_eq!(said, plain_only, "{:?}", comm.notes());
            let (mut y, mut r) = (vec![0u8; count * 2], vec![0u8; count * 2]);
            let tol = add_rms_norm_tolerance(dtype, world);
            // The plain call only read y (its input): y and r are what the norm call wrote.
            stream.download(&output, 0, &mut y).unwrap();
            stream.download(&residual, 0, &mut r).unwrap();
            for (part, got, want) in [("r", &r, &case.want_r), ("y", &y, &case.want_y)] {
                let verdict = agree_verdict(comm.rendezvous(), got, dtype, want, tol, true, part);
                assert_eq!(verdict.unwrap(), None, "{part} after {ran}");
            }
            assert_eq!(case.twin_difference(dtype, &r, &y), None, "after {ran}");
        }
        if info.rank == 0 {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    });
}

/// A reduce-scatter split along the last dimension: rank r's columns of every row, densely, within the float64 bound
/// and bitwise the allreduce's columns; rows of any count, row lengths of any multiple of the world size.
#[test]
fn reduce_scatter_along_the_last_dimension_gives_each_rank_its_columns() {
    as_job("reduce_scatter_along_the_last_dimension_gives_each_rank_its_columns", ranks(3), |info| {
        let capacity = 1 << 20;
        let comm = comm_on(backend(), info, capacity);
        let (rank, world) = (comm.rank(), comm.world());
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let [input, output, sum] = [0; 3].map(|_| gpu.alloc(capacity, MemKind::Device).unwrap());
        for dtype in DType::ALL {
            for (rows, row_len) in [(1, world), (5, world * 4), (7, world * 100), (64, world * 512)] {
                let count = rows * row_len;
                if count * dtype.size() > capacity {
                    continue;
                }
                let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
                stream.upload(&input, 0, &dtype.encode(&input_values(seed, rank, count, dtype))).unwrap();
                stream.fill(&output, 0xFF).unwrap();
                // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
                unsafe {
                    let s = stream.handle();
                    comm.reduce_scatter_last_dim(input.ptr(), output.ptr(), count, row_len, dtype, s).unwrap();
                    comm.all_reduce(input.ptr(), sum.ptr(), count, dtype, s).unwrap();
                }
                let cols = row_len / world;
                let (mut got, mut all) = (vec![0u8; count / world * dtype.size()], vec![0u8; count * dtype.size()]);
                stream.download(&output, 0, &mut got).unwrap();
                stream.download(&sum, 0, &mut all).unwrap();
                let want = reference(seed, world, count, dtype, 0, count);
                let (es, mine) = (dtype.size(), rank * cols);
                let mut want_cols = Vec::new();
                for row in 0..rows {
                    let at = row * row_len + mine;
                    want_cols.extend_from_slice(&want[at..at + cols]);
                    let theirs = &all[at * es..(at + cols) * es];
                    assert_eq!(
                        &got[row * cols * es..(row + 1) * cols * es],
                        theirs,
                        "{dtype} {rows}x{row_len} row {row}"
                    );
                }
                let v = measure::check::compare(&dtype.decode(&got), &want_cols, tolerance(dtype, world, false));
                assert_eq!(v.wrong, 0, "{dtype} {rows}x{row_len}: {v:?}");
            }
        }
        let e = comm.call(Op::ReduceScatter, DType::F32, input.ptr(), output.ptr(), world * 6).unwrap();
        assert!(matches!(e.with_split_last_dim(world * 6 + 1), Err(CallError::SplitLastDim { .. })));
    });
}

/// A device that fits not even one block of some kernels (the host driver told so, as a GPU says of a kernel with
/// too many registers): set-up drops them and says so, instead of failing; a design that needs one runs car's of
/// its shape, a norm call on a design whose fused kernel was dropped runs unfused, and every run still gives the
/// reference's sums, the same bits as the others.
#[test]
fn kernels_that_fit_no_block_are_dropped_and_their_calls_run_another_way() {
    let unfit = "symm_zc_2shot,symm_zc_1shot_norm,car_1shot_norm";
    let env = [(gpu::UNFIT_KERNELS_VAR, unfit)];
    as_job_with("kernels_that_fit_no_block_are_dropped_and_their_calls_run_another_way", ranks(3), &env, |info| {
        let (capacity, hidden, rows) = (1 << 20, 1000, 13);
        let comm = host_comm(info, capacity);
        let (rank, world) = (comm.rank(), comm.world());
        for dropped in unfit.split(',') {
            assert!(comm.notes().iter().any(|n| n.starts_with(&format!("{dropped}:"))), "{:?}", comm.notes());
        }
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let [input, output, residual, weight] = [0; 4].map(|_| gpu.alloc(capacity, MemKind::Device).unwrap());
        let (dtype, count) = (DType::Bf16, rows * hidden);
        let seed = measure::check::agree_seed(comm.rendezvous()).unwrap();
        let x = dtype.encode(&input_values(seed, rank, count, dtype));
        let want = reference(seed, world, count, dtype, 0, count);
        let case = NormCase::new(seed, world, count, hidden, dtype, 1e-5);
        stream.upload(&weight, 0, &dtype.encode(&case.weight)).unwrap();
        let norm = AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden, eps: 1e-5 };
        use Algorithm::*;
        // (asked, with the norm, what runs)
        let runs = [
            (Choice::of(SymmZc2Shot), false, Choice::of(Car2Shot)),
            (Choice::of(SymmZc2ShotLl), false, Choice::of(SymmZc2ShotLl)),
            (Choice::of(SymmZc2ShotPush), false, Choice::of(SymmZc2ShotPush)),
            (Choice::of(SymmZc1Shot), false, Choice::of(SymmZc1Shot)),
            (Choice::of(SymmZc2Shot), true, Choice::of(Car2Shot)),
            (Choice::of(SymmZc1Shot), true, Choice::unfused(SymmZc1Shot)),
            (Choice::of(Car1Shot), true, Choice::unfused(Car1Shot)),
            (Choice::of(SymmEpoch1Shot), true, Choice::of(SymmEpoch1Shot)),
        ];
        let (mut plain_prints, mut norm_prints) = (Vec::new(), Vec::new());
        for (asked, with_norm, want_ran) in runs {
            stream.upload(&input, 0, &x).unwrap();
            stream.upload(&residual, 0, &dtype.encode(&case.residual)).unwrap();
            stream.fill(&output, 0xFF).unwrap();
            // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
            let ran = unsafe {
                let call = comm.call(Op::AllReduce, dtype, input.ptr(), output.ptr(), count).unwrap();
                let call = if with_norm { call.with_add_rms_norm(norm).unwrap() } else { call };
                comm.issue_as(call, asked, stream.handle()).unwrap()
            };
            stream.sync().unwrap();
            assert_eq!(ran, want_ran, "{asked} (norm: {with_norm})");
            let mut y = vec![0u8; count * dtype.size()];
            stream.download(&output, 0, &mut y).unwrap();
            let what = format!("{asked} ran as {ran}");
            if with_norm {
                let mut r = vec![0u8; count * dtype.size()];
                stream.download(&residual, 0, &mut r).unwrap();
                let tol = add_rms_norm_tolerance(dtype, world);
                for (part, got, want) in [("r", &r, &case.want_r), ("y", &y, &case.want_y)] {
                    let verdict = agree_verdict(comm.rendezvous(), got, dtype, want, tol, true, &what);
                    assert_eq!(verdict.unwrap(), None, "{part}: {what}");
                }
                assert_eq!(case.twin_difference(dtype, &r, &y), None, "{what}");
                norm_prints.push((what, fingerprint(&r), fingerprint(&y)));
            } else {
                let tol = tolerance(dtype, world, false);
                assert_eq!(agree_verdict(comm.rendezvous(), &y, dtype, &want, tol, true, &what).unwrap(), None);
                plain_prints.push((what, fingerprint(&y), 0));
            }
        }
        for prints in [plain_prints, norm_prints] {
            for p in &prints[1..] {
                assert_eq!((p.1, p.2), (prints[0].1, prints[0].2), "{} and {} differ bitwise", p.0, prints[0].0);
            }
        }
    });
}
