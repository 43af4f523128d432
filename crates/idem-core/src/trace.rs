//! W3C trace context (`traceparent`, `tracestate`) in and out of idem, when
//! tracing is on (docs/operations.md, "Tracing").
//!
//! The service turns tracing on at start-up ([`turn_on`], after it has set
//! OpenTelemetry's global propagator and a `tracing` layer that exports
//! spans); until then every function here returns at once, after one relaxed
//! load, and [`span!`](crate::span) makes no span at all: tracing off costs
//! nothing on the request path. This module knows `tracing` spans and the
//! propagator, never the exporter: that is the service's.
//!
//! What travels: a client's `traceparent` becomes the parent of its request's
//! span ([`continue_from`]); the current span's context goes out to the
//! acquirer and in every AMQP message ([`inject`]); and a charge keeps the
//! `traceparent` of the attempt that claimed it ([`current_traceparent`]), so
//! that a later reconciler pass links back to it ([`link_to`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::global;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use opentelemetry_http::{HeaderExtractor, HeaderInjector};

static ON: AtomicBool = AtomicBool::new(false);

/// The W3C header that carries a trace id and a parent span id.
pub const TRACEPARENT: &str = "traceparent";

/// Called once by the service when spans are exported.
pub fn turn_on() {
    ON.store(true, Ordering::Relaxed);
}

/// Whether spans are exported (`OTEL_EXPORTER_OTLP_ENDPOINT` or `--otlp-endpoint`).
pub fn is_on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// A `tracing` span at INFO when tracing is on, else `Span::none()` (made
/// without looking at any subscriber): for the spans that exist only for
/// traces. None either inside a trace the sampler left out: an unsampled
/// span is never exported, and building one costs about half of a sampled
/// one. The request's and a command's spans are always made: their fields
/// are in every log line, and the sampler decides at them.
#[macro_export]
macro_rules! span {
    ($($arg:tt)+) => {
        if $crate::trace::wanted() {
            ::tracing::info_span!($($arg)+)
        } else {
            ::tracing::Span::none()
        }
    };
}

/// Whether a span made here would be exported: tracing is on, and the
/// current trace, if any, is sampled.
#[doc(hidden)]
pub fn wanted() -> bool {
    if !is_on() {
        return false;
    }
    let context = opentelemetry::Context::current();
    let span = context.span();
    let current = span.span_context();
    !current.is_valid() || current.is_sampled()
}

/// Writes the current span's context into `carrier`: a request's headers,
/// an AMQP message's.
pub fn inject(carrier: &mut dyn Injector) {
    if !is_on() {
        return;
    }
    let context = tracing::Span::current().context();
    global::get_text_map_propagator(|p| p.inject_context(&context, carrier));
}

/// Makes the context `carrier` brings (a client's `traceparent`, a
/// message's) the parent of `span`, which must not have been entered yet.
/// A carrier without a valid context leaves `span` a root.
pub fn continue_from(span: &tracing::Span, carrier: &dyn Extractor) {
    if !is_on() {
        return;
    }
    let context = global::get_text_map_propagator(|p| p.extract(carrier));
    if context.span().span_context().is_valid() {
        // Fails only for a span already entered, which the callers never pass.
        let _ = span.set_parent(context);
    }
}

/// The current span's `traceparent`, to keep with what it writes (a charge,
/// a message in the outbox); `None` when tracing is off.
pub fn current_traceparent() -> Option<String> {
    if !is_on() {
        return None;
    }
    let mut fields = HashMap::new();
    inject(&mut fields);
    fields.remove(TRACEPARENT)
}

/// Adds to `span` a link to the span a stored `traceparent` names (a
/// reconciler's pass to the request that began the charge). A value that is
/// not a valid `traceparent` adds nothing.
pub fn link_to(span: &tracing::Span, traceparent: &str) {
    if !is_on() {
        return;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let context = global::get_text_map_propagator(|p| p.extract(&carrier));
    let linked = context.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}
