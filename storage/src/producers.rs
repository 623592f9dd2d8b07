//! Producer ids for idempotent producers (InitProducerId): a counter,
//! `ketch:producer-ids`, shared by every gateway. The state each partition
//! keeps per producer is checked by the append script.

use redis::AsyncCommands;

use crate::{Result, Store};

impl Store {
    /// A producer id no other producer of this Redis has had.
    pub async fn new_producer_id(&self) -> Result<i64> {
        let key = format!("{}:producer-ids", self.keys.namespace());
        // Ids start at 1000, clear of the small ids tests like to hard-code.
        let id: i64 = self.conn().incr(key, 1).await?;
        Ok(id + 999)
    }
}
