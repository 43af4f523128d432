//! `idem tenant`: manages merchants (tenants); `create` prints the new secret.

use anyhow::Context;
use clap::Subcommand;

use super::args::DbArgs;
use crate::domain::{parse_merchant_name, MerchantSecret};
use crate::store::Store;

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Add a merchant and print its new secret (once, alone on stdout).
    Create {
        /// The merchant's name, also sent to the acquirer: a slug, 1 to 100
        /// of a-z, 0-9, '.', '_' and '-' (it is a routing key on the broker).
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Create { name, db } => create(&name, &db).await,
    }
}

async fn create(name: &str, db: &DbArgs) -> anyhow::Result<()> {
    let name =
        parse_merchant_name(name).map_err(|rule| anyhow::anyhow!("refusing {name:?}: {rule}"))?;
    let store = Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")?;
    let secret = MerchantSecret::generate();
    let merchant = store.create_merchant(name, &secret.hash()).await?;
    tracing::info!(merchant = %merchant.name, "merchant created");
    println!("{}", secret.expose());
    Ok(())
}
