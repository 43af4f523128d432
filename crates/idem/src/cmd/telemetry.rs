//! Logs and traces, set up once per process (docs/operations.md, "Tracing").
//!
//! Logs go to stderr, text or JSON, filtered by `IDEM_LOG`. Traces are off
//! unless an OTLP endpoint is given (`--otlp-endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
//! then spans go over OTLP/HTTP (protobuf) in batches, named and sampled as
//! the standard variables say (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), context travels as W3C
//! `traceparent` ([`idem_core::trace`]), and every JSON log line written inside
//! a span carries its `trace_id` and `span_id`. Off, the subscriber is the
//! one idem always had: no OpenTelemetry layer, no propagation.

use std::fmt;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use super::LogFormat;
use crate::LOG_ENV;

/// The service name when neither `OTEL_SERVICE_NAME` nor
/// `OTEL_RESOURCE_ATTRIBUTES` names one.
const SERVICE_NAME: &str = "idem";
/// How long one export may take, unless `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`
/// or `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds) say otherwise.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The export timeout the standard variables set. The exporter applies it
/// to its own retries; the HTTP client must apply it to each request.
fn export_timeout() -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok()?.trim().parse().ok())
    .map_or(EXPORT_TIMEOUT, Duration::from_millis)
}

/// What the process must flush on its way out.
pub(super) struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered. Call it while the runtime that
    /// [`init`] ran on still exists: the exporter's requests run on it.
    pub(super) fn shutdown(self) {
        if let Some(provider) = self.traces {
            if let Err(e) = provider.shutdown() {
                eprintln!("idem: the last spans were not exported: {e}");
            }
        }
    }
}

/// Where spans go: `None` when tracing is off; else the URL to give the
/// exporter, or `Some(None)` to let it read the standard variables. As the
/// specification orders them, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (a full
/// URL) wins over `--otlp-endpoint`, which clap also fills from
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL: `/v1/traces` is added).
fn traces_endpoint(flag: Option<&str>) -> Option<Option<String>> {
    let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    if disabled {
        return None;
    }
    if var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() {
        return Some(None);
    }
    let base = flag
        .filter(|b| !b.is_empty())
        .map(str::to_owned)
        .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))?;
    Some(Some(format!("{}/v1/traces", base.trim_end_matches('/'))))
}

/// Sets up logs (and traces, if an endpoint is given) for this process.
/// Must run inside the Tokio runtime the process works on.
pub(super) fn init(
    format: LogFormat,
    default_filter: &str,
    otlp_endpoint: Option<&str>,
) -> anyhow::Result<Telemetry> {
    let filter =
        EnvFilter::try_from_env(LOG_ENV).unwrap_or_else(|_| EnvFilter::new(default_filter));
    let Some(endpoint) = traces_endpoint(otlp_endpoint) else {
        let logs = log_lines();
        let logs = match format {
            LogFormat::Text => logs.boxed(),
            LogFormat::Json => logs.json().boxed(),
        };
        tracing_subscriber::registry()
            .with(filter)
            .with(logs)
            .init();
        return Ok(Telemetry { traces: None });
    };
    let provider = tracer_provider(endpoint)?;
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(SERVICE_NAME))
        // No busy/idle times, source locations or thread names: attributes
        // the conventions do not name.
        .with_tracked_inactivity(false)
        .with_location(false)
        .with_threads(false)
        // idem's own spans and the events in them; IDEM_LOG does not thin
        // traces, and the libraries' spans stay out.
        .with_filter(
            Targets::new()
                .with_target("idem", LevelFilter::INFO)
                .with_target("idem_core", LevelFilter::INFO),
        );
    let logs = log_lines();
    let logs = match format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs
            .json()
            .event_format(WithTraceIds(format::format().json()))
            .with_filter(filter)
            .boxed(),
    };
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing_subscriber::registry().with(logs).with(spans).init();
    idem_core::trace::turn_on();
    Ok(Telemetry {
        traces: Some(provider),
    })
}

/// Log lines on stderr, for a subscriber of any shape.
fn log_lines<S>(
) -> tracing_subscriber::fmt::Layer<S, format::DefaultFields, format::Format, fn() -> std::io::Stderr>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    // Colours only for a person at a terminal: escape codes in a log file are
    // noise, and colouring every request's line cost a tenth of a replay's CPU.
    tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
}

fn tracer_provider(endpoint: Option<String>) -> anyhow::Result<SdkTracerProvider> {
    let client = OnRuntime {
        http: reqwest::Client::builder()
            .timeout(export_timeout())
            .build()
            .context("the OTLP exporter's HTTP client")?,
        runtime: tokio::runtime::Handle::current(),
    };
    let mut exporter = SpanExporter::builder().with_http().with_http_client(client);
    if let Some(endpoint) = endpoint {
        exporter = exporter.with_endpoint(endpoint);
    }
    let exporter = exporter.build().context("the OTLP span exporter")?;
    // The detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES;
    // "idem" only where neither names the service.
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut resource = Resource::builder();
    if !named {
        resource = resource.with_service_name(SERVICE_NAME);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The exporter's HTTP client: idem's own (reqwest, rustls) on the process's
/// runtime. The batch exporter runs on a thread of its own with no runtime,
/// so each request is spawned onto ours and awaited from there.
#[derive(Debug)]
struct OnRuntime {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let http = self.http.clone();
        let request = reqwest::Request::try_from(request)?;
        self.runtime
            .spawn(async move {
                let response = http.execute(request).await?;
                let mut answer = Response::builder().status(response.status());
                if let Some(headers) = answer.headers_mut() {
                    *headers = response.headers().clone();
                }
                Ok(answer.body(response.bytes().await?)?)
            })
            .await?
    }
}

/// JSON log lines with the OpenTelemetry `trace_id` and `span_id` of the span
/// they were written in, first, so that a log search finds a trace's lines.
struct WithTraceIds<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // The span's context is the thread's while the span is entered.
        let context = opentelemetry::Context::current();
        let span = context.span();
        let ids = span.span_context();
        if !ids.is_valid() {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(
                writer,
                "{{\"trace_id\":\"{}\",\"span_id\":\"{}\",{rest}",
                ids.trace_id(),
                ids.span_id()
            ),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// Log lines into memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn json_lines_in_a_span_carry_its_trace_and_span_ids_and_others_none() {
        let provider = SdkTracerProvider::builder().build();
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .event_format(WithTraceIds(format::format().json()))
                    .with_writer(lines.clone()),
            )
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let ids = tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside any span");
            let span = tracing::info_span!("request", charge_id = "ch_1");
            let context = span.context();
            let otel = context.span();
            let ids = otel.span_context().clone();
            span.in_scope(|| tracing::info!(answer = 201, "inside"));
            ids
        });
        let text = String::from_utf8(lines.0.lock().expect("lock").clone()).expect("UTF-8");
        let parsed: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect();
        assert_eq!(parsed.len(), 2, "{text}");
        assert!(parsed[0].get("trace_id").is_none(), "{text}");
        assert_eq!(parsed[0]["fields"]["message"], "outside any span");
        assert_eq!(parsed[1]["trace_id"], ids.trace_id().to_string(), "{text}");
        assert_eq!(parsed[1]["span_id"], ids.span_id().to_string(), "{text}");
        assert_eq!(parsed[1]["fields"]["answer"], 201);
        assert_eq!(parsed[1]["span"]["charge_id"], "ch_1");
    }

    #[test]
    fn the_flag_turns_tracing_on_with_its_signal_path() {
        assert_eq!(
            traces_endpoint(Some("http://collector:4318/")),
            Some(Some("http://collector:4318/v1/traces".to_owned()))
        );
    }
}
