//! The HIP driver's entry. This version probes for the ROCm runtime and says so plainly: it has no HIP code
//! path yet, so it never pretends to open one.

use crate::{Driver, DriverOptions, GpuError, Result};
use std::sync::Arc;

const HIP_LIBRARY: &str = "libamdhip64.so";

pub(crate) fn open(_opts: &DriverOptions) -> Result<Arc<dyn Driver>> {
    // SAFETY: loading the ROCm runtime runs its initialisers, which is what using it requires anyway.
    match unsafe { libloading::Library::new(HIP_LIBRARY) } {
        Err(e) => Err(GpuError::NotAvailable { backend: "hip", reason: format!("cannot load {HIP_LIBRARY}: {e}") }),
        Ok(_) => Err(GpuError::NotAvailable {
            backend: "hip",
            reason: format!("{HIP_LIBRARY} loads, but this build has no hip driver yet"),
        }),
    }
}
