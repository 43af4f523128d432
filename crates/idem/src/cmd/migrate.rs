//! `idem migrate`: creates the database if it is missing (PostgreSQL), and
//! creates or upgrades the schema.

use anyhow::Context;
use sqlx::migrate::MigrateDatabase;

use super::args::DbArgs;
use idem_core::store::{Backend, Store};

pub(crate) async fn run(db: &DbArgs) -> anyhow::Result<()> {
    let url = db.url();
    // SQLite creates its file on connect; PostgreSQL needs the database made.
    if Backend::of_url(&url)? == Backend::Postgres
        && !sqlx::Postgres::database_exists(&url)
            .await
            .context("checking the database")?
    {
        sqlx::Postgres::create_database(&url)
            .await
            .context("creating the database")?;
        tracing::info!("created the database");
    }
    let store = Store::connect(&url, 1)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating the schema")?;
    tracing::info!("schema is up to date");
    Ok(())
}
