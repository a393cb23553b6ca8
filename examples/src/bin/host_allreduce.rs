//! The library on the host driver: run it under any launcher, e.g.
//! `comm-bench launch -n 4 -- target/release/host_allreduce` or `torchrun --nproc-per-node 4 ...`.
//! Each rank allreduces a vector of its own, in place and out of place, and checks the sums.

use allreduce::{Communicator, Mode, Options, Residency};
use half::bf16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let opts = Options { backend: allreduce::Backend::Host, capacity_bytes: 1 << 20, ..Options::default() };
    let comm = Communicator::from_env(opts)?;
    let (rank, world) = (comm.rank(), comm.world());
    if rank == 0 {
        print!("{}", comm.placement());
        println!("tune table: {}", comm.table_source(Mode::Eager, Residency::Caller));
    }
    // Rank r contributes r + i % 7 at element i, so every sum is exact in bf16 and known here.
    for count in [1, 1000, 65_536, 300_000] {
        let x: Vec<bf16> = (0..count).map(|i| bf16::from_f32((rank + i % 7) as f32)).collect();
        let mut y = vec![bf16::NAN; count];
        let algo = comm.all_reduce_host(&x, &mut y)?;
        let mut z = x.clone();
        comm.all_reduce_host_in_place(&mut z)?;
        for i in 0..count {
            let want = (0..world).map(|r| (r + i % 7) as f32).sum::<f32>();
            assert_eq!((y[i].to_f32(), z[i].to_f32()), (want, want), "rank {rank} element {i} of {count}");
        }
        if rank == 0 {
            println!("{count} elements: {algo}, checked");
        }
    }
    Ok(())
}
