//! The kernels' shared headers (`kernels/include/arx/`), by the include names the `.cu` sources use: handed to
//! the run-time compilers with every kernel library, and part of the kernel cache's key.

/// (include name, text) of every header under `kernels/include`.
pub const KERNEL_HEADERS: &[(&str, &str)] = &[
    ("arx/portability.h", include_str!("../../../kernels/include/arx/portability.h")),
    ("arx/elements.h", include_str!("../../../kernels/include/arx/elements.h")),
    ("arx/partition.h", include_str!("../../../kernels/include/arx/partition.h")),
    ("arx/reduce.h", include_str!("../../../kernels/include/arx/reduce.h")),
    ("arx/norm.h", include_str!("../../../kernels/include/arx/norm.h")),
    ("arx/sync.h", include_str!("../../../kernels/include/arx/sync.h")),
    ("arx/packets.h", include_str!("../../../kernels/include/arx/packets.h")),
    ("arx/instantiate.h", include_str!("../../../kernels/include/arx/instantiate.h")),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_header_is_listed_under_its_include_name() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/include");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir.join("arx"))
            .unwrap()
            .map(|e| format!("arx/{}", e.unwrap().file_name().to_string_lossy()))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = KERNEL_HEADERS.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(listed, on_disk, "KERNEL_HEADERS lists every header of kernels/include/arx");
        for (name, text) in KERNEL_HEADERS {
            assert_eq!(*text, std::fs::read_to_string(dir.join(name)).unwrap(), "{name}");
        }
    }
}
