//! Every handle the core made or adopted, so a stale or foreign handle is refused before it reaches the driver.

use crate::{GpuError, Handle, Result};
use std::collections::{HashMap, HashSet};

/// What a token's memory is, so release undoes the right thing.
#[derive(Clone, Copy)]
pub(crate) enum Mem {
    /// The vendor's plain allocation; `ipc` says whether it may be exported.
    Alloc { ipc: bool },
    /// A peer's allocation, opened from its IPC handle.
    IpcMapped,
    /// A VMM allocation, created or imported, mapped at the entry's address for `mapped` bytes.
    Vmm { handle: u64, mapped: usize },
}

pub(crate) struct MemEntry {
    pub ptr: u64,
    pub mem: Mem,
}

/// Everything alive, by handle.
#[derive(Default)]
pub(crate) struct Live {
    pub mems: HashMap<u64, MemEntry>,
    pub streams: HashSet<Handle>,
    /// Adopted streams (the caller's, or ours borrowed again) -> adoptions not yet forgotten; never destroyed here.
    pub adopted: HashMap<Handle, usize>,
    pub events: HashSet<Handle>,
    pub modules: HashSet<Handle>,
    /// Function -> its module.
    pub kernels: HashMap<Handle, Handle>,
    /// Executable graph -> the graph it was instantiated from.
    pub graphs: HashMap<Handle, Handle>,
}

fn unknown(what: &str, h: Handle) -> GpuError {
    GpuError::BadArgs(format!("unknown {what} {h:#x}"))
}

impl Live {
    /// `h` if it is a stream created or adopted here.
    pub fn stream(&self, h: Handle) -> Result<Handle> {
        if self.streams.contains(&h) || self.adopted.contains_key(&h) {
            Ok(h)
        } else {
            Err(unknown("stream", h))
        }
    }

    pub fn event(&self, h: Handle) -> Result<Handle> {
        self.events.contains(&h).then_some(h).ok_or_else(|| unknown("event", h))
    }

    pub fn function(&self, h: Handle) -> Result<Handle> {
        self.kernels.contains_key(&h).then_some(h).ok_or_else(|| unknown("kernel", h))
    }

    pub fn module(&self, h: Handle) -> Result<Handle> {
        self.modules.contains(&h).then_some(h).ok_or_else(|| unknown("module", h))
    }

    pub fn graph(&self, h: Handle) -> Result<Handle> {
        self.graphs.contains_key(&h).then_some(h).ok_or_else(|| unknown("graph", h))
    }
}
