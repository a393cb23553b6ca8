//! Every handle the core made or adopted, so a stale or foreign handle is refused before it reaches the driver.

use crate::{EventHandle, GpuError, GraphHandle, Handle, KernelHandle, ModuleHandle, Result, StreamHandle};
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
    pub streams: HashSet<StreamHandle>,
    /// Adopted streams (the caller's, or ours borrowed again) -> adoptions not yet forgotten; never destroyed here.
    pub adopted: HashMap<StreamHandle, usize>,
    pub events: HashSet<EventHandle>,
    pub modules: HashSet<ModuleHandle>,
    /// Function -> its module.
    pub kernels: HashMap<KernelHandle, ModuleHandle>,
    /// Executable graph -> the graph it was instantiated from (the driver's).
    pub graphs: HashMap<GraphHandle, u64>,
}

fn unknown<K>(what: &str, h: Handle<K>) -> GpuError {
    GpuError::BadArgs(format!("unknown {what} {h:?}"))
}

impl Live {
    /// `h` if it is a stream created or adopted here.
    pub fn stream(&self, h: StreamHandle) -> Result<StreamHandle> {
        if self.streams.contains(&h) || self.adopted.contains_key(&h) {
            Ok(h)
        } else {
            Err(unknown("stream", h))
        }
    }

    pub fn event(&self, h: EventHandle) -> Result<EventHandle> {
        self.events.contains(&h).then_some(h).ok_or_else(|| unknown("event", h))
    }

    pub fn function(&self, h: KernelHandle) -> Result<KernelHandle> {
        self.kernels.contains_key(&h).then_some(h).ok_or_else(|| unknown("kernel", h))
    }

    pub fn module(&self, h: ModuleHandle) -> Result<ModuleHandle> {
        self.modules.contains(&h).then_some(h).ok_or_else(|| unknown("module", h))
    }

    pub fn graph(&self, h: GraphHandle) -> Result<GraphHandle> {
        self.graphs.contains_key(&h).then_some(h).ok_or_else(|| unknown("graph", h))
    }
}
