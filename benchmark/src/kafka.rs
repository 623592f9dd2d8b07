//! Talking to the broker outside the hot path: client configuration, topic
//! creation (CreateTopics), and the partition list from metadata.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::args::{KafkaArgs, Properties};
use crate::workload::Workload;

/// How long metadata may take to show a topic (a new one can lag its creation).
const METADATA_WAIT: Duration = Duration::from_secs(15);

/// The topic a run uses, and how it was chosen.
#[derive(Debug, Clone)]
pub struct TopicPlan {
    pub name: String,
    pub create_with_partitions: Option<i32>,
}

impl TopicPlan {
    pub fn of(kafka: &KafkaArgs) -> Self {
        let name = kafka
            .topic
            .clone()
            .unwrap_or_else(|| Workload::default_topic(kafka.workload));
        let partitions = kafka
            .partitions
            .or(kafka.workload.map(|w| w.preset().partitions))
            .unwrap_or(1);
        TopicPlan {
            name,
            create_with_partitions: kafka.create_topic.then_some(partitions),
        }
    }
}

/// `bootstrap.servers` plus `settings`, then the `--command-config` properties over them.
pub fn client_config(kafka: &KafkaArgs, settings: &[(&str, String)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &kafka.bootstrap_server);
    for (key, value) in settings {
        config.set(*key, value);
    }
    if let Some(Properties(pairs)) = &kafka.command_config {
        for (key, value) in pairs {
            config.set(key, value);
        }
    }
    config
}

/// Creates the topic if asked to (an existing one is fine), then lists its partitions.
pub fn prepare_topic(kafka: &KafkaArgs, topic: &TopicPlan) -> anyhow::Result<Vec<i32>> {
    if let Some(partitions) = topic.create_with_partitions {
        create_topic(&client_config(kafka, &[]), &topic.name, partitions)?;
    }
    partitions_of(&client_config(kafka, &[]), &topic.name)
}

fn create_topic(config: &ClientConfig, name: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = config.create().context("creating the admin client")?;
    let new_topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = futures::executor::block_on(admin.create_topics([&new_topic], &options))
        .with_context(|| format!("creating topic {name}"))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => bail!("creating topic {topic}: {code}"),
        }
    }
    Ok(())
}

/// Partition ids of `topic`, waiting briefly for metadata to show it.
///
/// A metadata request that fails is tried again until the deadline: for
/// up to a heartbeat after gateways start together, one may not list the
/// others yet, and librdkafka, told of fewer brokers, fails the requests it
/// had in flight to the others (`DestroyBroker`, `UnknownPartition`).
pub fn partitions_of(config: &ClientConfig, topic: &str) -> anyhow::Result<Vec<i32>> {
    let consumer: BaseConsumer = config.create().context("creating a metadata client")?;
    let deadline = Instant::now() + METADATA_WAIT;
    loop {
        let found = match consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) {
            Ok(metadata) => metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
                .map(|t| t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>()),
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => None,
        };
        if let Some(partitions) = found {
            return Ok(partitions);
        }
        if Instant::now() >= deadline {
            bail!("topic {topic} not found in metadata (use --create-topic to create it)");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
