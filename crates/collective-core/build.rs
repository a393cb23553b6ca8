// `--cfg loom` (see tests/loom_protocols.rs) is a known cfg, not a typo.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
