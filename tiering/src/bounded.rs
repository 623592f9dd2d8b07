//! The catalog with a bound on every call. A catalog that stops answering
//! without closing its connection (a database host gone mid-commit, a row
//! lock held elsewhere, a REST server that hangs) would otherwise hold a
//! topic's archiving for good: the call never returns, the partition's
//! archiving registration keeps being renewed, and no other gateway can
//! take over while Redis fills. Past the bound a call fails (a commit's
//! outcome is then unknown, which a reload and the table's summaries
//! resolve, as for any failed commit).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{Catalog, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent};

/// How long one catalog call may take.
pub const CATALOG_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a table's purge (which deletes its files) may take.
const PURGE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug)]
pub struct Bounded(pub Arc<dyn Catalog>);

async fn bounded<T>(
    what: &str,
    limit: Duration,
    call: impl Future<Output = iceberg::Result<T>>,
) -> iceberg::Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(answer) => answer,
        Err(_) => Err(iceberg::Error::new(
            iceberg::ErrorKind::Unexpected,
            format!("the catalog did not answer {what} within {limit:?}"),
        )),
    }
}

#[async_trait]
impl Catalog for Bounded {
    async fn list_namespaces(&self, parent: Option<&NamespaceIdent>) -> iceberg::Result<Vec<NamespaceIdent>> {
        bounded(
            "a namespace listing",
            CATALOG_CALL_TIMEOUT,
            self.0.list_namespaces(parent),
        )
        .await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        bounded(
            "a namespace's creation",
            CATALOG_CALL_TIMEOUT,
            self.0.create_namespace(namespace, properties),
        )
        .await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        bounded(
            "a namespace's read",
            CATALOG_CALL_TIMEOUT,
            self.0.get_namespace(namespace),
        )
        .await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        bounded(
            "a namespace's lookup",
            CATALOG_CALL_TIMEOUT,
            self.0.namespace_exists(namespace),
        )
        .await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        bounded(
            "a namespace's update",
            CATALOG_CALL_TIMEOUT,
            self.0.update_namespace(namespace, properties),
        )
        .await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        bounded(
            "a namespace's drop",
            CATALOG_CALL_TIMEOUT,
            self.0.drop_namespace(namespace),
        )
        .await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        bounded(
            "a table listing",
            CATALOG_CALL_TIMEOUT,
            self.0.list_tables(namespace),
        )
        .await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        bounded(
            "a table's creation",
            CATALOG_CALL_TIMEOUT,
            self.0.create_table(namespace, creation),
        )
        .await
    }

    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        bounded("a table's load", CATALOG_CALL_TIMEOUT, self.0.load_table(table)).await
    }

    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        bounded("a table's drop", CATALOG_CALL_TIMEOUT, self.0.drop_table(table)).await
    }

    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        bounded("a table's purge", PURGE_TIMEOUT, self.0.purge_table(table)).await
    }

    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        bounded(
            "a table's lookup",
            CATALOG_CALL_TIMEOUT,
            self.0.table_exists(table),
        )
        .await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        bounded(
            "a table's rename",
            CATALOG_CALL_TIMEOUT,
            self.0.rename_table(src, dest),
        )
        .await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> iceberg::Result<Table> {
        bounded(
            "a table's registration",
            CATALOG_CALL_TIMEOUT,
            self.0.register_table(table, metadata_location),
        )
        .await
    }

    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        bounded("a commit", CATALOG_CALL_TIMEOUT, self.0.update_table(commit)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalog that never answers.
    #[derive(Debug)]
    struct Hung;

    #[async_trait]
    impl Catalog for Hung {
        async fn list_namespaces(&self, _: Option<&NamespaceIdent>) -> iceberg::Result<Vec<NamespaceIdent>> {
            std::future::pending().await
        }
        async fn create_namespace(
            &self,
            _: &NamespaceIdent,
            _: HashMap<String, String>,
        ) -> iceberg::Result<Namespace> {
            std::future::pending().await
        }
        async fn get_namespace(&self, _: &NamespaceIdent) -> iceberg::Result<Namespace> {
            std::future::pending().await
        }
        async fn namespace_exists(&self, _: &NamespaceIdent) -> iceberg::Result<bool> {
            std::future::pending().await
        }
        async fn update_namespace(
            &self,
            _: &NamespaceIdent,
            _: HashMap<String, String>,
        ) -> iceberg::Result<()> {
            std::future::pending().await
        }
        async fn drop_namespace(&self, _: &NamespaceIdent) -> iceberg::Result<()> {
            std::future::pending().await
        }
        async fn list_tables(&self, _: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
            std::future::pending().await
        }
        async fn create_table(&self, _: &NamespaceIdent, _: TableCreation) -> iceberg::Result<Table> {
            std::future::pending().await
        }
        async fn load_table(&self, _: &TableIdent) -> iceberg::Result<Table> {
            std::future::pending().await
        }
        async fn drop_table(&self, _: &TableIdent) -> iceberg::Result<()> {
            std::future::pending().await
        }
        async fn purge_table(&self, _: &TableIdent) -> iceberg::Result<()> {
            std::future::pending().await
        }
        async fn table_exists(&self, _: &TableIdent) -> iceberg::Result<bool> {
            std::future::pending().await
        }
        async fn rename_table(&self, _: &TableIdent, _: &TableIdent) -> iceberg::Result<()> {
            std::future::pending().await
        }
        async fn register_table(&self, _: &TableIdent, _: String) -> iceberg::Result<Table> {
            std::future::pending().await
        }
        async fn update_table(&self, _: TableCommit) -> iceberg::Result<Table> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_catalog_that_never_answers_fails_past_the_bound() {
        let catalog = Bounded(Arc::new(Hung));
        let table = TableIdent::from_strs(["ketch", "t"]).unwrap();
        let started = tokio::time::Instant::now();
        let error = catalog.load_table(&table).await.unwrap_err();
        assert!(
            error.to_string().contains("did not answer a table's load"),
            "{error}"
        );
        assert_eq!(started.elapsed(), CATALOG_CALL_TIMEOUT);
        let error = catalog.purge_table(&table).await.unwrap_err();
        assert!(error.to_string().contains("purge"), "{error}");
    }
}
