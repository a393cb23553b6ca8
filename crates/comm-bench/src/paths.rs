//! Output files: created and checked writable before any rank starts (a bad --output_dir or --tune path must not
//! cost a sweep), and every file error names its path.

use std::path::Path;

/// Creates `dir` if needed and checks a file can be written in it.
pub fn writable_dir(dir: &Path) -> Result<(), String> {
    let name = |e: std::io::Error| format!("{}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(name)?;
    let probe = dir.join(format!(".comm-bench-{}.probe", std::process::id()));
    std::fs::write(&probe, b"").map_err(name)?;
    std::fs::remove_file(&probe).map_err(name)
}

/// Creates `file`'s directory if needed and checks `file` can be written, leaving an existing one as it was.
pub fn writable_file(file: &Path) -> Result<(), String> {
    let name = |e: std::io::Error| format!("{}: {e}", file.display());
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let existed = file.exists();
    std::fs::OpenOptions::new().append(true).create(true).open(file).map_err(name)?;
    if !existed {
        std::fs::remove_file(file).map_err(name)?;
    }
    Ok(())
}

/// Writes `contents` to `file`; the error names it.
pub fn write(file: &Path, contents: impl AsRef<[u8]>) -> Result<(), String> {
    std::fs::write(file, contents).map_err(|e| format!("{}: {e}", file.display()))
}

/// Reads `file` as text; the error names it.
pub fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_and_checks_and_names_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        writable_dir(&dir).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the probe is removed");
        let file = tmp.path().join("c/table.json");
        writable_file(&file).unwrap();
        assert!(!file.exists() && file.parent().unwrap().is_dir());
        std::fs::write(tmp.path().join("plain"), "x").unwrap();
        let e = writable_dir(&tmp.path().join("plain/sub")).unwrap_err();
        assert!(e.contains("plain/sub"), "{e}");
        let e = read(&tmp.path().join("missing.json")).unwrap_err();
        assert!(e.contains("missing.json"), "{e}");
    }
}
