//! The host-driver stress run: 100,000 back-to-back calls with random methods (car, symm, tuned, auto), sizes and
//! dtypes across 4 ranks, every result checked exactly by `comm-bench soak`.

use std::process::Command;

#[test]
fn hundred_thousand_random_calls_on_four_ranks() {
    let out = Command::new(env!("CARGO_BIN_EXE_comm-bench"))
        .args(["soak", "--backend", "host", "--num_ranks", "4", "--calls", "100000", "--max_count", "4096"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("soak: 100000 calls checked exactly") && text.contains("no wrong result"), "{text}");
}
