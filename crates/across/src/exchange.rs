//! How the ranks of a job over several nodes exchange their set-up blobs (NCCL's ids, whether each can go on)
//! before anything else connects them: over TCP at `MASTER_ADDR:MASTER_PORT` (`bootstrap`), or through a key-value
//! store the program already has (torch.distributed's, from Python).

use crate::Error;
use launch::RankInfo;
use std::time::Duration;

/// Every rank's blob, in rank order, on every rank. Collective: every rank of the job makes the same calls, in the
/// same order; a call that cannot complete ends within the set-up deadline with an error that names the ranks that
/// never came, where the exchange can tell.
pub trait Exchange {
    fn all_gather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Error>;
}

/// The exchange over TCP: rank 0 listens at `MASTER_ADDR:MASTER_PORT` (or `ALLREDUCE_BOOTSTRAP_PORT`), as torchrun
/// and our launcher set them.
pub struct TcpExchange {
    opts: bootstrap::BootstrapOptions,
    rank: usize,
    world: usize,
    job: String,
}

impl TcpExchange {
    /// Rank `info.rank`'s side of the job's exchange, each call waiting at most `timeout`.
    pub fn from_env(info: &RankInfo, timeout: Duration) -> Result<TcpExchange, Error> {
        let opts = bootstrap::BootstrapOptions::from_env(timeout)?;
        Ok(TcpExchange { opts, rank: info.rank, world: info.world, job: info.job.as_str().to_string() })
    }
}

impl Exchange for TcpExchange {
    fn all_gather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        Ok(bootstrap::all_gather(&self.opts, self.rank, self.world, &self.job, blob)?)
    }
}
