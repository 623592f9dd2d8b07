//! Where a partition's keys live in a Redis Cluster.
//!
//! Every key of a partition shares one hash tag, so the tag alone decides
//! the partition's slot and so its master. Tags hashed from
//! `<topic-id>:<partition>` alone land unevenly (12 partitions on 3
//! masters were seen to land 4/6/2), so in cluster mode each new partition
//! is given to the master holding the fewest of the topic's partitions,
//! and its tag is the first of `<topic-id>:<partition>`,
//! `<topic-id>:<partition>:1`, `…:2`, … whose slot that master serves (a
//! few tries: each lands on a given master with probability 1/masters).
//! The tag is stored in the topic record, so later readers need no slot
//! map. What a reshard moves afterwards stays where Redis put it: placement
//! is chosen at creation (and at CreatePartitions) only.

use std::collections::BTreeMap;

use uuid::Uuid;

use crate::connection::Mode;
use crate::durable::slot_of;
use crate::keys::default_tag;
use crate::{Result, Store};

/// Tags tried per partition before the default tag is kept.
const MAX_TAG_TRIES: u32 = 100_000;

/// The masters of a Redis Cluster by slot range ([`Store::masters`]).
#[derive(Debug, Clone, Default)]
pub struct Masters {
    ranges: Vec<(u16, u16, String)>,
    cluster: bool,
}

impl Masters {
    /// The master serving `tag`'s slot: its address; `single` in single
    /// mode. With no master known for the slot (no map read yet) the tag
    /// itself, as if the partition had a master of its own, so that no
    /// partition is taken for another's.
    pub fn of(&self, tag: &str) -> String {
        if !self.cluster {
            return "single".to_owned();
        }
        master_of_tag(&self.ranges, tag).unwrap_or_else(|| format!("{{{tag}}}"))
    }
}

impl Store {
    /// Tags for partitions `existing.len()..total` of topic `id`, whose
    /// partitions so far have the tags `existing`.
    pub(crate) async fn place(&self, id: &Uuid, existing: &[String], total: i32) -> Result<Vec<String>> {
        let from = existing.len() as i32;
        if self.mode() == Mode::Single || total <= from {
            return Ok((from..total).map(|p| default_tag(id, p)).collect());
        }
        let ranges = self.conn().slot_ranges().await?;
        Ok(place_tags(id, existing, total, &ranges))
    }

    /// Which master holds each partition's keys, as the data path's slot
    /// map last said (no round trip: a `CLUSTER SLOTS` could go to the
    /// very master that stopped answering); single mode: one master.
    pub async fn masters(&self) -> Masters {
        let cluster = self.mode() == Mode::Cluster;
        let mut ranges = self.durable.slot_map().await;
        // Not read yet (no append or read went through this gateway): read
        // now, from every known node at once.
        if cluster && ranges.is_empty() && self.durable.refresh().await.is_ok() {
            ranges = self.durable.slot_map().await;
        }
        Masters { ranges, cluster }
    }

    /// How many partitions of each topic every cluster master holds, by
    /// master address (single mode: one entry, `single`).
    pub async fn placement(&self) -> Result<BTreeMap<String, BTreeMap<String, usize>>> {
        let topics = self.all_topics().await?;
        let ranges = match self.mode() {
            Mode::Single => Vec::new(),
            Mode::Cluster => self.conn().slot_ranges().await?,
        };
        let mut out: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for topic in topics {
            for tag in &topic.tags {
                let master = master_of_tag(&ranges, tag).unwrap_or_else(|| "single".to_owned());
                *out.entry(master)
                    .or_default()
                    .entry(topic.name.clone())
                    .or_default() += 1;
            }
        }
        Ok(out)
    }
}

fn master_of_tag(ranges: &[(u16, u16, String)], tag: &str) -> Option<String> {
    let slot = slot_of(&format!("{{{tag}}}"));
    ranges
        .iter()
        .find(|(first, last, _)| (*first..=*last).contains(&slot))
        .map(|(_, _, master)| master.clone())
}

/// The placement itself (see the module docs); `ranges` is the slot map.
fn place_tags(id: &Uuid, existing: &[String], total: i32, ranges: &[(u16, u16, String)]) -> Vec<String> {
    let mut masters: Vec<&str> = ranges.iter().map(|(_, _, m)| m.as_str()).collect();
    masters.sort_unstable();
    masters.dedup();
    let from = existing.len() as i32;
    if masters.is_empty() {
        return (from..total).map(|p| default_tag(id, p)).collect();
    }
    let mut held = vec![0usize; masters.len()];
    for tag in existing {
        if let Some(master) = master_of_tag(ranges, tag)
            && let Some(i) = masters.iter().position(|m| *m == master)
        {
            held[i] += 1;
        }
    }
    // Topics start on different masters, so many small topics spread too.
    let start = (id.as_u128() % masters.len() as u128) as usize;
    let mut tags = Vec::new();
    for p in from..total {
        let target = (0..masters.len())
            .map(|k| (start + k) % masters.len())
            .min_by_key(|i| held[*i])
            .expect("at least one master");
        let base = default_tag(id, p);
        let tag = (0..MAX_TAG_TRIES)
            .map(|n| {
                if n == 0 {
                    base.clone()
                } else {
                    format!("{base}:{n}")
                }
            })
            .find(|tag| master_of_tag(ranges, tag).as_deref() == Some(masters[target]))
            .unwrap_or(base);
        if let Some(i) = master_of_tag(ranges, &tag).and_then(|m| masters.iter().position(|x| *x == m)) {
            held[i] += 1;
        }
        tags.push(tag);
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_grouped_by_master_and_never_together_when_unknown() {
        let single = Masters::default();
        assert_eq!(
            (single.of("a"), single.of("b")),
            ("single".to_owned(), "single".to_owned())
        );
        let unread = Masters {
            ranges: Vec::new(),
            cluster: true,
        };
        assert_ne!(unread.of("a"), unread.of("b"));
        let cluster = Masters {
            ranges: three_masters(),
            cluster: true,
        };
        let master = cluster.of("a");
        assert!(master.starts_with("10.0.0."), "{master}");
        assert_eq!(Some(master), master_of_tag(&three_masters(), "a"));
    }

    fn three_masters() -> Vec<(u16, u16, String)> {
        vec![
            (0, 5460, "10.0.0.1:7000".to_owned()),
            (5461, 10922, "10.0.0.2:7000".to_owned()),
            (10923, 16383, "10.0.0.3:7000".to_owned()),
        ]
    }

    fn counts(tags: &[String], ranges: &[(u16, u16, String)]) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for tag in tags {
            *out.entry(master_of_tag(ranges, tag).unwrap()).or_default() += 1;
        }
        out
    }

    #[test]
    fn partitions_spread_evenly_over_the_masters() {
        let ranges = three_masters();
        for _ in 0..20 {
            let id = Uuid::new_v4();
            let tags = place_tags(&id, &[], 12, &ranges);
            assert_eq!(tags.len(), 12);
            let counts = counts(&tags, &ranges);
            assert!(counts.values().all(|n| *n == 4), "{counts:?}");
            // Tags are distinct, so partitions never share keys.
            let mut unique = tags.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), 12);
        }
    }

    #[test]
    fn added_partitions_even_out_what_the_topic_holds() {
        let ranges = three_masters();
        let id = Uuid::new_v4();
        let first = place_tags(&id, &[], 4, &ranges);
        let more = place_tags(&id, &first, 9, &ranges);
        assert_eq!(more.len(), 5);
        let all: Vec<String> = first.into_iter().chain(more).collect();
        assert!(counts(&all, &ranges).values().all(|n| *n == 3));
    }
}
