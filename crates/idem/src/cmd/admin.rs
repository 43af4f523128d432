//! `idem admin`: access to the operator console (`idem serve --admin-listen`).

use anyhow::Context;
use clap::Subcommand;

use super::args::{ActorArgs, DbArgs};
use idem_core::domain::MerchantSecret;
use idem_core::store::{Audit, Store};

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Make a console token and print it (once, alone on stdout). The
    /// console's actions signed in with it are audited under `--name`.
    Token {
        /// The token's name, the actor in the audit trail: by default the actor.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        actor: ActorArgs,
        #[command(flatten)]
        db: DbArgs,
    },
}

pub(crate) async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Token { name, actor, db } => {
            let actor = actor.actor()?;
            let name = name.map_or_else(|| actor.clone(), |n| n.trim().to_owned());
            anyhow::ensure!(
                (1..=100).contains(&name.chars().count()),
                "--name {name:?}: write 1 to 100 characters"
            );
            let store = Store::connect(&db.url(), 1)
                .await
                .context("connecting to the database")?;
            let token = MerchantSecret::admin_token();
            let audit = Audit {
                actor: &actor,
                reason: None,
            };
            store
                .create_admin_token(&name, &token.hash(), &audit)
                .await?;
            eprintln!(
                "console token {name:?} made; sign in with it at `idem serve --admin-listen`"
            );
            println!("{}", token.expose());
            Ok(())
        }
    }
}
