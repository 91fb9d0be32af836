//! `devgate nri`'s log: the format named by the runtime's config takes over
//! from the one logging started with (a runtime-launched plugin gets its config
//! only in Configure). A process of its own: the subscriber is global.
use std::io::Write;
use std::sync::{Arc, Mutex};

use devgate::config::LogFormat;
use tracing_subscriber::filter::Targets;

/// Everything written, shared with the test.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_format_switches_after_start_and_each_event_is_written_once() {
    let buf = Buffer::default();
    let out = buf.clone();
    let filter = Targets::new().with_default(tracing::Level::INFO);
    devgate::logging::init_with(LogFormat::Text, filter, move || out.clone(), false)
        .expect("install the subscriber");
    tracing::info!(answer = 42, "before configure");
    devgate::logging::set_format(LogFormat::Json);
    tracing::info!(answer = 43, "after configure");
    tracing::debug!("below the filter");

    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(!lines[0].starts_with('{'), "{text}");
    assert!(lines[0].contains(" INFO "), "{text}");
    assert!(lines[0].ends_with("before configure answer=42"), "{text}");
    let json: serde_json::Value = serde_json::from_str(lines[1]).expect("a json line");
    assert_eq!(json["level"], "INFO");
    assert_eq!(json["fields"]["message"], "after configure");
    assert_eq!(json["fields"]["answer"], 43);
}
