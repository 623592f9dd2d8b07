//! Presets mirroring the OpenMessaging Benchmark workload catalog
//! (<https://github.com/openmessaging/benchmark/tree/master/workloads>): each
//! fills partitions, record size and producer count unless flags override them.

use clap::ValueEnum;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    #[value(name = "1-topic-1-partition-1kb")]
    OnePartition1Kb,
    #[value(name = "1-topic-16-partitions-1kb")]
    SixteenPartitions1Kb,
    #[value(name = "1-topic-16-partitions-100b")]
    SixteenPartitions100B,
    #[value(name = "1-topic-3-partitions-100b-3producers")]
    ThreePartitions100BThreeProducers,
    #[value(name = "1-topic-100-partitions-1kb")]
    HundredPartitions1Kb,
}

/// What a preset fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub partitions: i32,
    pub record_size: usize,
    pub producers: usize,
}

impl Workload {
    pub fn preset(self) -> Preset {
        let (partitions, record_size, producers) = match self {
            Workload::OnePartition1Kb => (1, 1024, 1),
            Workload::SixteenPartitions1Kb => (16, 1024, 1),
            Workload::SixteenPartitions100B => (16, 100, 1),
            Workload::ThreePartitions100BThreeProducers => (3, 100, 3),
            Workload::HundredPartitions1Kb => (100, 1024, 1),
        };
        Preset {
            partitions,
            record_size,
            producers,
        }
    }

    /// The catalog name, as typed on the command line.
    pub fn name(self) -> String {
        self.to_possible_value()
            .expect("every workload has a name")
            .get_name()
            .to_owned()
    }

    /// The topic a workload uses when `--topic` is absent.
    pub fn default_topic(workload: Option<Workload>) -> String {
        workload.map_or_else(|| "bench".to_owned(), |w| format!("bench-{}", w.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_producer_preset_uses_small_records() {
        let preset = Workload::ThreePartitions100BThreeProducers.preset();
        assert_eq!(
            preset,
            Preset {
                partitions: 3,
                record_size: 100,
                producers: 3
            }
        );
    }

    #[test]
    fn default_topic_names_the_workload() {
        assert_eq!(
            Workload::default_topic(Some(Workload::SixteenPartitions1Kb)),
            "bench-1-topic-16-partitions-1kb"
        );
        assert_eq!(Workload::default_topic(None), "bench");
    }
}
