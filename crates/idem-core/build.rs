//! Rebuilds when a migration changes: `sqlx::migrate!` embeds the migration
//! files at compile time, and on stable Rust Cargo does not know it read them,
//! so an edited or added migration would otherwise leave the old set in an
//! incremental build (sqlx's documentation asks for this script).

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
