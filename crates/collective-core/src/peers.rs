//! The peers' processes a rank can see, so that a watchdog names a peer that died within its period rather than
//! leave it to a deadline (the communicator's kernels' waits, NCCL's steps).

use crate::CollectiveError;
use ipc::Rendezvous;
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// Of every rank's process: those on this rank's host that are visible from here, by (rank, pid).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerProcesses {
    watched: Vec<(usize, i32)>,
    /// Peers on this host whose pid is not visible from here (another pid namespace, say).
    hidden: Vec<usize>,
}

impl PeerProcesses {
    /// Every rank's pid and host name, all-gathered; then [`PeerProcesses::visible`]. Collective.
    pub fn gather(rdv: &Rendezvous) -> Result<PeerProcesses, CollectiveError> {
        let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
        let mut mine = (std::process::id() as i32).to_le_bytes().to_vec();
        mine.extend_from_slice(host.as_bytes());
        let all = rdv.all_gather("peer processes", &mine)?;
        let mut pids = Vec::with_capacity(all.len());
        let mut hosts = Vec::with_capacity(all.len());
        for (r, blob) in all.iter().enumerate() {
            let (pid, host) = blob
                .split_first_chunk::<4>()
                .ok_or_else(|| CollectiveError::Mismatch(format!("rank {r} sent {} bytes for its pid", blob.len())))?;
            pids.push(i32::from_le_bytes(*pid));
            hosts.push(String::from_utf8_lossy(host).into_owned());
        }
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        Ok(PeerProcesses::visible(&pids, &hosts, rdv.rank()))
    }

    /// The other ranks on this rank's host (`hosts[rank]`) whose pid is alive from here now; a pid of another pid
    /// namespace would look dead, so those are set apart ([`PeerProcesses::hidden`]) rather than watched.
    pub fn visible(pids: &[i32], hosts: &[&str], rank: usize) -> PeerProcesses {
        let (mut watched, mut hidden) = (Vec::new(), Vec::new());
        for r in (0..pids.len()).filter(|&r| r != rank && hosts[r] == hosts[rank]) {
            match kill(Pid::from_raw(pids[r]), None) {
                Ok(()) => watched.push((r, pids[r])),
                Err(_) => hidden.push(r),
            }
        }
        PeerProcesses { watched, hidden }
    }

    /// The watched ranks, ascending.
    pub fn ranks(&self) -> Vec<usize> {
        self.watched.iter().map(|&(r, _)| r).collect()
    }

    /// Peers on this host that cannot be watched from here: their death is found by a deadline only.
    pub fn hidden(&self) -> &[usize] {
        &self.hidden
    }

    /// The watched ranks whose process no longer exists.
    pub fn gone(&self) -> Vec<usize> {
        self.watched
            .iter()
            .filter(|&&(_, pid)| kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH))
            .map(|&(r, _)| r)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_visible_peers_of_this_host_are_watched_and_a_gone_one_is_named() {
        let me = std::process::id() as i32;
        // A pid far above any pid_max: no such process, as a peer in another pid namespace looks.
        let pids = [me, me, i32::MAX, me];
        let hosts = ["a", "a", "a", "b"];
        let p = PeerProcesses::visible(&pids, &hosts, 0);
        assert_eq!((p.ranks(), p.hidden()), (vec![1], &[2][..]));
        assert_eq!(p.gone(), Vec::<usize>::new());
        // A child that has exited and been reaped: its pid is gone.
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id() as i32;
        let pids = [me, pid, me];
        let p = PeerProcesses::visible(&pids, &["a", "a", "a"], 0);
        assert_eq!(p.ranks(), vec![1, 2], "the child is alive (a zombie at worst) until reaped");
        child.wait().expect("reap");
        assert_eq!(p.gone(), vec![1]);
    }
}
