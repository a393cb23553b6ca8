//! Which device each rank opened, agreed by all ranks before anything else is built: two ranks on one device are
//! refused when there are devices enough for one each (a launcher that did not place ranks, such as mpirun without
//! a binding, would otherwise run them all on device 0), and allowed when there are not (8 ranks on one GPU under
//! MPS), in which case the launch caps divide each device among the ranks that share it.

use crate::Error;
use gpu::PeerLink;
use std::fmt;

/// One rank's device, as it reports it to its peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankDevice {
    pub rank: usize,
    pub local_rank: usize,
    pub host: String,
    pub ordinal: usize,
    /// The PCI bus id (`host` on the host driver).
    pub bus_id: String,
    /// Devices this rank's process sees.
    pub visible: usize,
}

impl RankDevice {
    /// The report as one line of text (fields are tab-separated; none contains a tab).
    pub fn encode(&self) -> Vec<u8> {
        let clean = |s: &str| s.replace(['\t', '\n'], " ");
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            self.rank,
            self.local_rank,
            clean(&self.host),
            self.ordinal,
            clean(&self.bus_id),
            self.visible
        )
        .into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<RankDevice, String> {
        let text = String::from_utf8_lossy(bytes);
        let f: Vec<&str> = text.split('\t').collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<usize>().ok()).ok_or(format!("malformed report {text:?}"));
        if f.len() != 6 {
            return Err(format!("malformed report {text:?}"));
        }
        Ok(RankDevice {
            rank: num(0)?,
            local_rank: num(1)?,
            host: f[2].into(),
            ordinal: num(3)?,
            bus_id: f[4].into(),
            visible: num(5)?,
        })
    }
}

/// Where every rank runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Rank by rank.
    pub ranks: Vec<RankDevice>,
    /// The most ranks any one device carries.
    pub ranks_per_device: usize,
    /// `links[r][s]`: how rank r's device reaches rank s's, as rank r's driver reports it (`None`: the same device,
    /// or one rank r's process cannot see).
    pub links: Vec<Vec<Option<PeerLink>>>,
}

/// One rank's row of the link matrix, as it travels: a letter per rank.
pub fn encode_links(row: &[Option<PeerLink>]) -> Vec<u8> {
    row.iter()
        .map(|l| match l {
            None => b'-',
            Some(PeerLink { access: true, native_atomics: true }) => b'A',
            Some(PeerLink { access: true, native_atomics: false }) => b'P',
            Some(PeerLink { access: false, .. }) => b'X',
        })
        .collect()
}

pub fn decode_links(bytes: &[u8]) -> Result<Vec<Option<PeerLink>>, String> {
    bytes
        .iter()
        .map(|b| match b {
            b'-' => Ok(None),
            b'A' => Ok(Some(PeerLink { access: true, native_atomics: true })),
            b'P' => Ok(Some(PeerLink { access: true, native_atomics: false })),
            b'X' => Ok(Some(PeerLink { access: false, native_atomics: false })),
            other => Err(format!("malformed link {:?}", *other as char)),
        })
        .collect()
}

impl Placement {
    /// Checks the reports of every rank (in rank order) and derives how many ranks share a device.
    pub fn agree(reports: Vec<RankDevice>) -> Result<Placement, Error> {
        for (r, d) in reports.iter().enumerate() {
            if d.rank != r {
                return Err(Error::Placement(format!("the report in slot {r} comes from rank {}", d.rank)));
            }
        }
        let mut ranks_per_device = 1;
        for d in &reports {
            let sharing: Vec<usize> =
                reports.iter().filter(|o| o.host == d.host && o.bus_id == d.bus_id).map(|o| o.rank).collect();
            let on_host = reports.iter().filter(|o| o.host == d.host).count();
            if sharing.len() > 1 && d.visible >= on_host && d.bus_id != "host" {
                return Err(Error::Placement(format!(
                    "ranks {sharing:?} all opened device {} on {} although {} devices are visible to each of the {on_host} \
                     ranks there: give each rank its own device (the launcher's local rank, or CUDA_VISIBLE_DEVICES / \
                     HIP_VISIBLE_DEVICES per rank)",
                    d.bus_id, d.host, d.visible
                )));
            }
            ranks_per_device = ranks_per_device.max(sharing.len());
        }
        Ok(Placement { ranks: reports, ranks_per_device, links: Vec::new() })
    }

    /// Takes every rank's link row (in rank order) and refuses devices that cannot reach each other.
    pub fn with_links(mut self, links: Vec<Vec<Option<PeerLink>>>) -> Result<Placement, Error> {
        let n = self.ranks.len();
        if links.len() != n || links.iter().any(|row| row.len() != n) {
            return Err(Error::Placement(format!("link rows of the wrong shape for {n} ranks")));
        }
        for (r, row) in links.iter().enumerate() {
            if let Some(s) = row.iter().position(|l| l.is_some_and(|l| !l.access)) {
                return Err(Error::Placement(format!(
                    "rank {r}'s device {} cannot access rank {s}'s device {} (no peer access between them)",
                    self.ranks[r].bus_id, self.ranks[s].bus_id
                )));
            }
        }
        self.links = links;
        Ok(self)
    }

    /// Why the compare-and-swap handshakes cannot run here: a pair of devices whose driver says their atomics on
    /// each other's memory are not native; `None` where none is known to lack them.
    pub fn missing_peer_atomics(&self) -> Option<String> {
        self.links.iter().enumerate().find_map(|(r, row)| {
            let s = row.iter().position(|l| l.is_some_and(|l| !l.native_atomics))?;
            Some(format!(
                "rank {r}'s device {} has no native atomics on rank {s}'s device {}",
                self.ranks[r].bus_id, self.ranks[s].bus_id
            ))
        })
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# placement: {} rank(s), at most {} per device", self.ranks.len(), self.ranks_per_device)?;
        for (r, d) in self.ranks.iter().enumerate() {
            let row =
                self.links.get(r).map_or(String::new(), |l| String::from_utf8_lossy(&encode_links(l)).into_owned());
            writeln!(
                f,
                "#   rank {} (local {}) on {}: device {} of {}, bus id {}{}",
                d.rank,
                d.local_rank,
                d.host,
                d.ordinal,
                d.visible,
                d.bus_id,
                if row.is_empty() { String::new() } else { format!(", links {row}") }
            )?;
        }
        if !self.links.is_empty() {
            writeln!(f, "#   (links to rank 0..: A peer access and native atomics, P access only, X none, - same device or not visible)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(rank: usize, ordinal: usize, bus: &str, visible: usize) -> RankDevice {
        RankDevice { rank, local_rank: rank, host: "n1".into(), ordinal, bus_id: bus.into(), visible }
    }

    #[test]
    fn one_rank_per_device_passes_and_reports_round_trip() {
        let reports: Vec<_> = (0..8).map(|r| dev(r, r, &format!("0000:{r:02x}:00.0"), 8)).collect();
        for r in &reports {
            assert_eq!(&RankDevice::decode(&r.encode()).unwrap(), r);
        }
        let p = Placement::agree(reports).unwrap();
        assert_eq!(p.ranks_per_device, 1);
        assert!(p.to_string().contains("rank 7 (local 7) on n1: device 7 of 8, bus id 0000:07:00.0"));
        assert!(RankDevice::decode(b"1\t2\tx").is_err());
    }

    #[test]
    fn ranks_on_one_device_are_refused_when_devices_suffice_and_counted_when_not() {
        // mpirun without a binding: every rank on device 0 of 8.
        let all_on_0: Vec<_> = (0..8).map(|r| dev(r, 0, "0000:1b:00.0", 8)).collect();
        let e = Placement::agree(all_on_0).unwrap_err().to_string();
        assert!(e.contains("ranks [0, 1, 2, 3, 4, 5, 6, 7] all opened device 0000:1b:00.0"), "{e}");
        // Eight ranks on one visible GPU (MPS): allowed, eight per device.
        let mps: Vec<_> = (0..8).map(|r| dev(r, 0, "0000:1b:00.0", 1)).collect();
        assert_eq!(Placement::agree(mps).unwrap().ranks_per_device, 8);
        // Four ranks on two GPUs: two per device, derived from the mapping.
        let two: Vec<_> = (0..4).map(|r| dev(r, r % 2, ["0000:01:00.0", "0000:02:00.0"][r % 2], 2)).collect();
        assert_eq!(Placement::agree(two).unwrap().ranks_per_device, 2);
        // The same bus id on two hosts is two devices.
        let mut hosts: Vec<_> = (0..2).map(|r| dev(r, 0, "0000:1b:00.0", 8)).collect();
        hosts[1].host = "n2".into();
        assert_eq!(Placement::agree(hosts).unwrap().ranks_per_device, 1);
        let swapped = vec![dev(1, 0, "a", 1), dev(0, 0, "a", 1)];
        assert!(Placement::agree(swapped).is_err());
    }

    #[test]
    fn links_travel_and_refuse_what_cannot_work() {
        let p = Placement::agree((0..3).map(|r| dev(r, r, &format!("0000:0{r}:00.0"), 3)).collect()).unwrap();
        let a = Some(PeerLink { access: true, native_atomics: true });
        let no_atomics = Some(PeerLink { access: true, native_atomics: false });
        let row = vec![None, a, no_atomics];
        assert_eq!(decode_links(&encode_links(&row)).unwrap(), row);
        assert!(decode_links(b"-Q").is_err());
        let good = p.clone().with_links(vec![vec![None, a, a], vec![a, None, a], vec![a, a, None]]).unwrap();
        assert_eq!(good.missing_peer_atomics(), None);
        assert!(good.to_string().contains("links -AA"), "{good}");
        let weak = p.clone().with_links(vec![vec![None, a, no_atomics], vec![a, None, a], vec![a, a, None]]).unwrap();
        assert!(weak
            .missing_peer_atomics()
            .unwrap()
            .contains("rank 0's device 0000:00:00.0 has no native atomics on rank 2"));
        let none = Some(PeerLink { access: false, native_atomics: false });
        let e = p.clone().with_links(vec![vec![None, a, a], vec![none, None, a], vec![a, a, None]]).unwrap_err();
        assert!(e.to_string().contains("rank 1's device 0000:01:00.0 cannot access rank 0's"), "{e}");
        assert!(p.with_links(vec![vec![None]]).is_err());
    }
}
