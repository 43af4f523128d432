//! The charge domain: the values a charge is made of, each a type that can only
//! hold a valid value (parse, don't validate), and the charge itself as clients see it.
//!
//! Nothing here knows about HTTP, SQL or the acquirer; those layers convert to and
//! from these types at their edge.

mod charge;
mod event;
mod ids;
mod merchant;

pub use charge::{
    AmountCents, Charge, ChargeRequest, ChargeStatus, Currency, Description, FieldError, OrderId,
};
pub use event::{ChargeEvent, EventType};
pub use ids::{AcquirerReference, ChargeId, MessageId};
pub use merchant::{parse_merchant_name, Merchant, MerchantSecret, SecretHash};
