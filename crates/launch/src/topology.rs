//! A job's ranks as nodes × local ranks, for a design that works within each node and across nodes apart: the
//! ranks of this rank's node (its node group) and the ranks of its local rank on every node (its rail).

use std::fmt;

use crate::{Launcher, RankInfo};

/// Where a rank sits in a job of `nodes` nodes of `local_world` ranks each, placed node-major:
/// `rank = node * local_world + local_rank`. Only such a job can be built, so every method's answer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    world: usize,
    nodes: usize,
    local_world: usize,
    node: usize,
    local_rank: usize,
}

/// Why a rank's place is not one of a node-major job of equal nodes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The launcher did not say (or its placement does not show) something a topology needs.
    #[error("{launcher} does not say {what} (read from {from})")]
    Unknown { launcher: Launcher, what: &'static str, from: &'static str },
    #[error("{world} ranks on {nodes} nodes{}: every node must run the same number of ranks", local_note(*local_world))]
    NotUniform { world: usize, nodes: usize, local_world: Option<usize> },
    #[error("{what} {value} is out of range: {limit}")]
    OutOfRange { what: &'static str, value: usize, limit: String },
    #[error(
        "rank {rank} is local rank {local_rank} on node {node}, but ranks placed node-major, {local_world} per node, \
         put rank {} there: start the job with each node's ranks consecutive (torchrun does; srun \
         --distribution=block, mpirun --map-by slot)",
        node * local_world + local_rank
    )]
    NotNodeMajor { rank: usize, node: usize, local_rank: usize, local_world: usize },
}

fn local_note(local_world: Option<usize>) -> String {
    local_world.map_or(String::new(), |l| format!(" ({l} on this one)"))
}

impl Topology {
    /// The topology of rank `rank` of `world`, on node `node` of `nodes` as local rank `local_rank`; refused unless
    /// every node runs `world / nodes` ranks and the rank is where node-major placement puts it (refused rather
    /// than guessed: a rank elsewhere would be grouped with ranks of another node).
    pub fn new(rank: usize, world: usize, nodes: usize, node: usize, local_rank: usize) -> Result<Self, TopologyError> {
        let range = |what, value, bound, of: &str| {
            let limit = format!("{of} {bound}");
            (value >= bound).then_some(TopologyError::OutOfRange { what, value, limit })
        };
        let out = range("rank", rank, world, "the job's ranks number")
            .or_else(|| range("node", node, nodes, "its nodes number"));
        if let Some(e) = out {
            return Err(e);
        }
        if !world.is_multiple_of(nodes) {
            return Err(TopologyError::NotUniform { world, nodes, local_world: None });
        }
        let local_world = world / nodes;
        if let Some(e) = range("local rank", local_rank, local_world, "each node's ranks number") {
            return Err(e);
        }
        if rank != node * local_world + local_rank {
            return Err(TopologyError::NotNodeMajor { rank, node, local_rank, local_world });
        }
        Ok(Topology { world, nodes, local_world, node, local_rank })
    }

    /// The topology of a rank as its launcher placed it ([`crate::detect`]).
    pub fn of(info: &RankInfo) -> Result<Self, TopologyError> {
        let unknown = |what| TopologyError::Unknown { launcher: info.launcher, what, from: node_source(info.launcher) };
        let nodes = info.nodes.ok_or_else(|| unknown("the number of nodes"))?;
        let node = info.node.ok_or_else(|| unknown("this rank's node"))?;
        let local_world = info.local_world.ok_or_else(|| unknown("the ranks on this node"))?;
        if local_world.checked_mul(nodes) != Some(info.world) {
            return Err(TopologyError::NotUniform { world: info.world, nodes, local_world: Some(local_world) });
        }
        Topology::new(info.rank, info.world, nodes, node, info.local_rank)
    }

    pub fn rank(&self) -> usize {
        self.node * self.local_world + self.local_rank
    }
    pub fn world(&self) -> usize {
        self.world
    }
    pub fn nodes(&self) -> usize {
        self.nodes
    }
    pub fn local_world(&self) -> usize {
        self.local_world
    }
    pub fn node(&self) -> usize {
        self.node
    }
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The global ranks of this rank's node, in local-rank order: the group a design reduces within first.
    pub fn node_group(&self) -> Vec<usize> {
        let first = self.node * self.local_world;
        (first..first + self.local_world).collect()
    }

    /// The global ranks with this rank's local rank, one on each node, in node order: the group that goes across
    /// nodes (one rail of the network per local rank).
    pub fn rail(&self) -> Vec<usize> {
        (0..self.nodes).map(|node| node * self.local_world + self.local_rank).collect()
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} of {}: local rank {} of {} on node {} of {}",
            self.rank(),
            self.world,
            self.local_rank,
            self.local_world,
            self.node,
            self.nodes
        )
    }
}

/// Where [`crate::detect_from`] reads a launcher's nodes, for an error that says what was missing.
fn node_source(launcher: Launcher) -> &'static str {
    match launcher {
        Launcher::Ours => {
            "our launcher, one node, or ALLREDUCE_NODE_ID and ALLREDUCE_NODES where a test emulates several"
        }
        Launcher::Torchrun => "GROUP_RANK, and WORLD_SIZE / LOCAL_WORLD_SIZE",
        Launcher::Srun => "SLURM_NODEID and SLURM_STEP_TASKS_PER_NODE",
        Launcher::Mpirun => {
            "OMPI_COMM_WORLD_LOCAL_SIZE: OpenMPI exports no node index, so it is rank / local size, only where that \
             divides the world and each node's ranks are consecutive"
        }
        Launcher::Mpich => {
            "MPI_LOCALNRANKS: Hydra exports no node index, so it is rank / local size, only where that divides the \
             world and each node's ranks are consecutive"
        }
        Launcher::Explicit => "nowhere: an explicit place names no node",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's node group and rail, as (groups by node, rails by local rank), for `nodes` × `local_world`.
    fn groups_and_rails(nodes: usize, local_world: usize) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
        let world = nodes * local_world;
        let topos: Vec<Topology> =
            (0..world).map(|r| Topology::new(r, world, nodes, r / local_world, r % local_world).unwrap()).collect();
        for (rank, t) in topos.iter().enumerate() {
            assert_eq!((t.rank(), t.world(), t.nodes(), t.local_world()), (rank, world, nodes, local_world));
            let (group, rail) = (t.node_group(), t.rail());
            // Ordered by local rank and by node: this rank stands at its local rank in the group, at its node in the rail.
            assert_eq!((group[t.local_rank()], rail[t.node()]), (rank, rank));
            // Its group's ranks share its group, its rail's share its rail: each is a partition of the world.
            assert!(group.iter().all(|&r| topos[r].node_group() == group));
            assert!(rail.iter().all(|&r| topos[r].rail() == rail));
        }
        let groups = (0..nodes).map(|n| topos[n * local_world].node_group()).collect();
        let rails = (0..local_world).map(|l| topos[l].rail()).collect();
        (groups, rails)
    }

    #[test]
    fn node_groups_and_rails() {
        assert_eq!(
            groups_and_rails(2, 4),
            (vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]], vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]])
        );
        assert_eq!(
            groups_and_rails(4, 2),
            (vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]], vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]])
        );
        assert_eq!(groups_and_rails(1, 8), (vec![(0..8).collect()], (0..8).map(|r| vec![r]).collect()));
        assert_eq!(groups_and_rails(3, 1), (vec![vec![0], vec![1], vec![2]], vec![vec![0, 1, 2]]));
    }
}
