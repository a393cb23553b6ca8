//! Where every rank runs, as Python sees it: `Communicator.placement` and its entries.

use pyo3::prelude::*;

/// Where one rank runs (an entry of `Placement.ranks`).
#[pyclass(module = "allreduce_rs", name = "RankDevice", frozen, get_all)]
pub struct PyRankDevice {
    rank: usize,
    local_rank: usize,
    host: String,
    ordinal: usize,
    bus_id: String,
    visible: usize,
}

/// Where every rank runs, as the ranks agreed at construction.
#[pyclass(module = "allreduce_rs", name = "Placement", frozen)]
pub struct PyPlacement {
    pub(crate) inner: allreduce::Placement,
}

#[pymethods]
impl PyPlacement {
    /// The most ranks any one device carries (8 for 8 ranks on one GPU under MPS).
    #[getter]
    fn ranks_per_device(&self) -> usize {
        self.inner.ranks_per_device
    }
    /// Every rank's device, in rank order.
    #[getter]
    fn ranks(&self) -> Vec<PyRankDevice> {
        self.inner
            .ranks
            .iter()
            .map(|d| PyRankDevice {
                rank: d.rank,
                local_rank: d.local_rank,
                host: d.host.clone(),
                ordinal: d.ordinal,
                bus_id: d.bus_id.clone(),
                visible: d.visible,
            })
            .collect()
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
    fn __repr__(&self) -> String {
        format!(
            "<allreduce_rs.Placement {} rank(s), at most {} per device>",
            self.inner.ranks.len(),
            self.inner.ranks_per_device
        )
    }
}

#[pymethods]
impl PyRankDevice {
    fn __repr__(&self) -> String {
        format!(
            "RankDevice(rank={}, local_rank={}, host={:?}, ordinal={}, bus_id={:?}, visible={})",
            self.rank, self.local_rank, self.host, self.ordinal, self.bus_id, self.visible
        )
    }
}
