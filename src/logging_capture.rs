//! Tests' view of the log: a writer that keeps what a subscriber writes.

use std::sync::{Arc, Mutex};

/// The log, as a subscriber of the test's own writes it.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl tracing_subscriber::fmt::MakeWriter<'_> for Captured {
    type Writer = Captured;
    fn make_writer(&self) -> Captured {
        self.clone()
    }
}

impl Captured {
    /// The lines written so far that contain `needle`.
    pub(crate) fn lines(&self, needle: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Runs `f` with this thread's events at info and above written here as
    /// plain text.
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        self.run_at(tracing::Level::INFO, f)
    }

    /// Runs `f` with this thread's events at `level` and above written here.
    pub(crate) fn run_at<T>(&self, level: tracing::Level, f: impl FnOnce() -> T) -> T {
        let dispatch = tracing::Dispatch::new(
            tracing_subscriber::fmt()
                .with_max_level(level)
                .with_writer(self.clone())
                .with_ansi(false)
                .finish(),
        );
        // With one dispatcher registered, tracing-core takes it for the global
        // default and asks the registering thread's own default whether a
        // callsite is enabled (`has_just_one`): other tests' threads, logging
        // nowhere, would then switch this test's lines off. A second one makes
        // it ask both.
        let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::callsite::rebuild_interest_cache();
            f()
        })
    }
}
