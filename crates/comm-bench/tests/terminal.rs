//! comm-bench at a terminal (a pseudo-terminal here): rank 0 draws its progress bar there through the launcher;
//! with stderr a pipe, as in CI logs, there is none.

use std::io::Read;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_comm-bench");
const SWEEP: &[&str] =
    &["--backend", "host", "--num_ranks", "2", "--counts", "1024,4096,16384", "-n", "200", "--repeats", "3"];

/// The bar's counter as indicatif draws it: `pos/len` of the 3 sizes x 2 methods.
fn has_bar(stderr: &str) -> bool {
    (1..=6).any(|i| stderr.contains(&format!("{i}/6 ")))
}

#[test]
fn progress_shows_on_a_terminal_only() {
    let pty = nix::pty::openpty(None, None).unwrap();
    let child = Command::new(BIN)
        .args(SWEEP)
        .args(["--methods", "car_1shot,symm_1shot"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave))
        .spawn()
        .unwrap();
    // Read until every writer closed the terminal (EIO on Linux), or the child is done.
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let status = child.wait_with_output().unwrap().status;
    let seen = reader.join().unwrap();
    assert!(status.success(), "{seen}");
    assert!(has_bar(&seen), "no progress bar on the terminal:\n{seen}");

    let o = Command::new(BIN).args(SWEEP).args(["--methods", "car_1shot,symm_1shot"]).output().unwrap();
    assert!(o.status.success());
    assert!(!has_bar(&String::from_utf8_lossy(&o.stderr)), "a bar in a log");
}
