//! sync.h's epoch-flag barrier on the host (kernels/check/sync_sim.cpp: a process per rank, a thread per thread of
//! its block): ranks that run the same kernels call after call pass, however their tags change from call to call; a
//! rank that runs another kernel on one call makes every rank fail there, each naming a peer of the other kernel and
//! both kernels; a rank that leaves is named by every other, which gives up at the deadline.

use crate::output;
use collective_core::flag_tags::{flag_tag, flag_word};
use collective_core::status::describe;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The tag that tells a simulated rank to leave before that call (`LEAVES` in sync_sim.cpp).
const LEAVES: u32 = u32::MAX;

/// One rank's end: the calls it completed and its status words, how long its failed wait lasted and what it read
/// (the word, where, the word it waited for) apart.
#[derive(Debug, PartialEq)]
struct End {
    completed: u32,
    status: [u64; 4],
    waited_ns: u64,
    seen: [u64; 3],
}

impl End {
    fn clean(completed: usize) -> End {
        End { completed: completed as u32, status: [0; 4], waited_ns: 0, seen: [0; 3] }
    }

    /// Whether this end is `completed` calls and the record `status` of a wait that lasted at least `timeout` for the
    /// next call's epoch, on a flag that said an earlier one.
    fn timed_out(&self, completed: usize, status: [u64; 4], timeout: Duration) -> bool {
        let [word, _, want] = self.seen;
        let next = completed as u64 + 1;
        (self.completed, self.status) == (completed as u32, status)
            && self.waited_ns >= timeout.as_nanos() as u64
            && want == next
            && word >> 8 < next
    }
}

fn tag(kernel: &str) -> u32 {
    flag_tag(kernel).expect("a kernel that stores epoch flags")
}

/// Runs `tags[rank][call]`, each call `phases` barriers, with `timeout` per wait, rank 0 finding `presets` (peer,
/// flag) in its slots first; every rank's end, and how long the run took.
fn run(
    sim: &Path,
    out: &Path,
    tags: &[Vec<u32>],
    phases: u32,
    timeout: Duration,
    presets: &[(u32, u64)],
) -> Result<(Vec<End>, Duration), String> {
    let (world, calls) = (tags.len() as u32, tags[0].len() as u32);
    let mut plan: Vec<u8> = [world, calls, phases].into_iter().flat_map(u32::to_le_bytes).collect();
    plan.extend((timeout.as_nanos() as u64).to_le_bytes());
    plan.extend(tags.iter().flatten().flat_map(|t| t.to_le_bytes()));
    plan.extend((presets.len() as u32).to_le_bytes());
    presets.iter().for_each(|&(peer, word)| plan.extend(peer.to_le_bytes().into_iter().chain(word.to_le_bytes())));
    let path = out.join("sync_sim.plan");
    std::fs::write(&path, plan).map_err(|e| format!("{}: {e}", path.display()))?;
    let started = Instant::now();
    let text = output(Command::new(sim).arg(&path))?;
    let took = started.elapsed();
    let ends = text
        .lines()
        .map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .map(|w| w.parse().map_err(|_| format!("sync_sim said {l:?}")))
                .collect::<Result<_, _>>()?;
            match f[..] {
                [_, completed, s0, s1, s2, s3, waited_ns, word, at, want] => {
                    Ok(End { completed: completed as u32, status: [s0, s1, s2, s3], waited_ns, seen: [word, at, want] })
                }
                _ => Err(format!("sync_sim said {l:?}")),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    if ends.len() != world as usize {
        return Err(format!("sync_sim reported {} ranks of {world}", ends.len()));
    }
    Ok((ends, took))
}

pub fn check(sim: &Path, out: &Path) -> Result<(), String> {
    let kernels = ["car_1shot", "symm_zc_2shot", "symm_ll", "car_2shot_norm", "symm_epoch_1shot"].map(tag);
    let calls = 6;
    for world in [3, 8] {
        let fail = |what: String| Err(format!("the device barrier on the host, {world} ranks: {what}"));
        // Every rank the same kernel on each call, another kernel from call to call; with one barrier per call a rank
        // may read a peer's flag of the next call, which is not judged.
        let alike = |calls: usize| -> Vec<Vec<u32>> {
            (0..world).map(|_| (0..calls).map(|c| kernels[c % kernels.len()]).collect()).collect()
        };
        for (phases, calls) in [(3, calls), (1, 10 * calls)] {
            let (ends, _) = run(sim, out, &alike(calls), phases, Duration::from_secs(30), &[])?;
            let clean = End::clean(calls);
            if let Some((r, e)) = ends.iter().enumerate().find(|(_, e)| **e != clean) {
                return fail(format!("ranks of one kernel per call, {phases} barrier(s) each: rank {r} ended {e:?}"));
            }
        }
        let alike = alike(calls);
        // The last rank runs the epoch one-shot where the others run the zero-copy two-shot, at call 2.
        let (odd, at) = (world - 1, 2);
        let mut mixed = alike.clone();
        mixed.iter_mut().for_each(|t| t[at] = tag("symm_zc_2shot"));
        mixed[odd][at] = tag("symm_epoch_1shot");
        let (ends, _) = run(sim, out, &mixed, 3, Duration::from_secs(30), &[])?;
        for (r, e) in ends.iter().enumerate() {
            let [abort, recorded, peer, what] = e.status;
            let (ours, theirs) =
                if r == odd { ("symm_epoch_1shot", "symm_zc_2shot") } else { ("symm_zc_2shot", "symm_epoch_1shot") };
            let named_right = if r == odd { peer as usize != odd } else { peer as usize == odd };
            let said = describe(what);
            let both = said.contains(&format!("ran {theirs} where this rank ran {ours}"));
            // A peer met in another kernel is judged at once: no wait, so no time waited.
            if (e.completed, abort, recorded, e.waited_ns) != (at as u32, 1, 1, 0) || !named_right || !both {
                return fail(format!("rank {r} of {ours} among ranks of {theirs} ended {e:?}: {said}"));
            }
        }
        // The last rank leaves before call 2: every other names it, at the deadline.
        let timeout = Duration::from_millis(300);
        let mut left = alike;
        left[odd][at] = LEAVES;
        let (ends, took) = run(sim, out, &left, 3, timeout, &[])?;
        for (r, e) in ends.iter().enumerate() {
            let right = match r == odd {
                true => *e == End::clean(at),
                false => e.timed_out(at, [1, 1, odd as u64, 0x100], timeout),
            };
            if !right {
                return fail(format!("rank {r} with rank {odd} gone ended {e:?}: {}", describe(e.status[3])));
            }
        }
        if took > timeout + Duration::from_secs(10) {
            return fail(format!("the survivors of a dead rank took {took:?} with a deadline of {timeout:?}"));
        }
    }
    // Rank 0 alone, its peers' flags set before: one of the next call (from another kernel) passes, not judged;
    // one of this call from another kernel fails naming that peer and both kernels; one of the last call times out.
    let (ours, theirs) = (tag("symm_zc_2shot"), tag("symm_ll"));
    let alone = vec![vec![ours], vec![LEAVES], vec![LEAVES]];
    let timeout = Duration::from_millis(100);
    let mismatch = End {
        completed: 0,
        status: [1, 1, 2, u64::from(ours) << 16 | 0x500 | u64::from(theirs)],
        waited_ns: 0,
        // The flag it met, and this call's epoch.
        seen: [flag_word(1, theirs), 0, 1],
    };
    // Rank 2's preset flag, and whether rank 0's end is the right one for it.
    type Case<'a> = (u64, &'a dyn Fn(&End) -> bool);
    let cases: [Case; 3] = [
        (flag_word(2, theirs), &|e| *e == End::clean(1)),
        (flag_word(1, theirs), &|e| *e == mismatch),
        (flag_word(0, ours), &|e| e.timed_out(0, [1, 1, 2, 0x100], timeout)),
    ];
    for (word, right) in cases {
        let (ends, _) = run(sim, out, &alone, 1, timeout, &[(1, flag_word(1, ours)), (2, word)])?;
        if !right(&ends[0]) {
            let said = describe(ends[0].status[3]);
            return Err(format!(
                "the device barrier on the host, rank 2's flag {word:#x}: rank 0 ended {:?} ({said})",
                ends[0]
            ));
        }
    }
    // Two peers of two other kernels at once: one record, whose peer ran the kernel it names.
    let other = tag("car_1shot");
    let presets = [(1, flag_word(1, theirs)), (2, flag_word(1, other))];
    for _ in 0..20 {
        let (ends, _) = run(sim, out, &alone, 1, timeout, &presets)?;
        let [abort, recorded, peer, what] = ends[0].status;
        let named = presets.iter().any(|&(p, w)| u64::from(p) == peer && w & 0xff == what & 0xff);
        if (abort, recorded, what >> 8 & 0xff) != (1, 1, 5) || !named {
            return Err(format!(
                "the device barrier on the host, two peers of other kernels: rank 0 ended {:?}",
                ends[0]
            ));
        }
    }
    println!(
        "sync: the device barrier passes ranks of one kernel per call, fails every rank naming the other kernel's \
         where one rank's differs, and names a rank that left at its deadline (3 and 8 ranks); a peer's flag of the next call is not judged"
    );
    Ok(())
}
