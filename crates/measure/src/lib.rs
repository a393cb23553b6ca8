//! How calls are measured and checked, one way for every measurement: the communicator's tune, comm-bench (its
//! sweep, soak and ceilings) and the criterion benches. [`timing`]: warm-up, a barrier per repeat, the slowest
//! rank's time; [`check`]: fresh inputs per check, the float64 reference, tolerances, the ranks' agreed verdict;
//! [`sizes`]: comm_bench.py's message sizes.

pub mod check;
pub mod sizes;
pub mod timing;
