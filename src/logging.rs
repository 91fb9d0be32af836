//! `devgate nri`'s log on stderr: one subscriber, set up once, whose format
//! (`log_format`, text or JSON) can change after start. A plugin the runtime
//! launches gets its config only in Configure, after logging began.
//!
//! Both formatters are installed, each behind a per-layer filter reading one
//! flag, so an event is written once, in the format in force.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::{
    filter::{filter_fn, Targets},
    fmt::MakeWriter,
    layer::SubscriberExt,
    util::{SubscriberInitExt, TryInitError},
    Layer,
};

use crate::config::LogFormat;

/// Set while the log is JSON.
static JSON: AtomicBool = AtomicBool::new(false);

/// Installs the subscriber on stderr: `filter` picks the events, `format`
/// their form.
pub fn init_stderr(format: LogFormat, filter: Targets) -> Result<(), TryInitError> {
    // Colour only for a person at a terminal: the journal and log files would
    // keep the escape sequences.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    init_with(format, filter, std::io::stderr, ansi)
}

/// [`init_stderr`] with any writer.
pub fn init_with<W>(
    format: LogFormat,
    filter: Targets,
    writer: W,
    ansi: bool,
) -> Result<(), TryInitError>
where
    W: for<'w> MakeWriter<'w> + Clone + Send + Sync + 'static,
{
    set_format(format);
    let text = tracing_subscriber::fmt::layer()
        .with_writer(writer.clone())
        .with_ansi(ansi)
        .with_filter(filter_fn(|_| !JSON.load(Ordering::Relaxed)));
    let json = tracing_subscriber::fmt::layer()
        .json()
        .with_writer(writer)
        .with_filter(filter_fn(|_| JSON.load(Ordering::Relaxed)));
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .try_init()
}

/// Switches the format of every event from now on.
pub fn set_format(format: LogFormat) {
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
}

#[cfg(test)]
#[path = "logging_capture.rs"]
pub(crate) mod capture;
