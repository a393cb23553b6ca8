//! The host example runs as a user would run it: under the project's launcher, 3 ranks.

#[test]
fn host_example_runs_under_the_launcher_and_checks_its_sums() {
    launch::run(&launch::LaunchOptions::new(3, env!("CARGO_BIN_EXE_host_allreduce")))
        .expect("every rank of the example checks its sums and exits 0");
}
