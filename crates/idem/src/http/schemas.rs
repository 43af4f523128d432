//! Schemas the OpenAPI document needs that no Rust type of the API carries:
//! response headers, and a problem that always names its charge. A leaf: the
//! handlers name them in their `#[utoipa::path]` annotations, and the document
//! ([`super::openapi`]) collects them from there.

use utoipa::openapi::{AllOfBuilder, ObjectBuilder, Ref, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use idem_core::problem::Problem;

/// The header that carries a request's id, as the document spells it; the
/// server matches it in any case, as HTTP does.
pub const REQUEST_ID: &str = "X-Request-Id";

/// The `Retry-After` header: whole seconds, at least one (`error::retry_after_value`).
pub struct RetryAfter;

impl PartialSchema for RetryAfter {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1))
            .into()
    }
}
impl ToSchema for RetryAfter {}

/// The `Idempotent-Replayed` header: only ever `true`, and only on replays.
pub struct Replayed;

impl PartialSchema for Replayed {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["true"]))
            .into()
    }
}
impl ToSchema for Replayed {}

/// A problem that always carries its charge: the stored `402` and `502`.
pub struct ChargeProblem;

impl PartialSchema for ChargeProblem {
    fn schema() -> RefOr<Schema> {
        AllOfBuilder::new()
            .item(Ref::from_schema_name(Problem::name()))
            .item(ObjectBuilder::new().required("charge"))
            .into()
    }
}
impl ToSchema for ChargeProblem {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Problem::name().into(), Problem::schema()));
        Problem::schemas(schemas);
    }
}
