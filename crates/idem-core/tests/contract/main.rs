//! The store's contract: what every backend must do, written once and run on
//! each. A test here is `async fn name(db: TestDb)` over [`Store`]'s
//! operations only (and the tests' own SQL where a fact is only in a table);
//! [`on_every_backend!`] runs it on a fresh database of each backend, as
//! `<concern>::postgres::name`, `<concern>::sqlite::name` and
//! `<concern>::mariadb::name`. A new backend
//! is a line in that macro, and is done when this suite passes on it (then the
//! service's suite, `crates/idem/tests/it`, which runs whole requests).
//!
//! What is not a contract stays with the backend it belongs to: how a stuck
//! write ends (`it/store.rs`), the plans a batch's statements get (`it/batch.rs`).
//!
//! [`Store`]: idem_core::store::Store

mod charges;
mod keys;
mod merchants;
mod outbox;
mod refunds;
mod steps;
mod support;
mod webhooks;

/// Runs each named test on every backend, each on a database of its own:
/// `mod postgres`, `mod sqlite` and `mod mariadb`, one `#[tokio::test]` per
/// name in each.
#[macro_export]
macro_rules! on_every_backend {
    ($($test:ident),+ $(,)?) => {
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    let db = idem_testkit::db::TestDb::on(idem_core::store::Backend::Postgres).await;
                    super::$test(db).await
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    let db = idem_testkit::db::TestDb::on(idem_core::store::Backend::Sqlite).await;
                    super::$test(db).await
                }
            )+
        }
        mod mariadb {
            $(
                #[tokio::test]
                async fn $test() {
                    let db = idem_testkit::db::TestDb::on(idem_core::store::Backend::MariaDb).await;
                    super::$test(db).await
                }
            )+
        }
    };
}
