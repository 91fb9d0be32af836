//! What the plugin logs.

use std::sync::{Arc, Mutex};

use nri::Plugin as _;

use super::*;

/// A log line about a failed step carries its causes: "write runtime record"
/// alone would not say why.
#[test]
fn a_logged_failure_names_its_cause() {
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (p, _state) = plugin(Config::default(), false);
    // A directory, not empty, where the record is renamed to.
    let record = features::RuntimeRecord::path(&p.options.state_dir);
    std::fs::create_dir_all(record.join("in-the-way")).unwrap();
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let runtime = RuntimeInfo {
        name: "containerd".to_string(),
        version: "1.7.24".to_string(),
        ..Default::default()
    };
    tracing::subscriber::with_default(subscriber, || p.configure(&runtime)).unwrap();
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("runtime record not saved"))
        .unwrap_or_else(|| panic!("{text}"));
    let cause = std::io::Error::from_raw_os_error(libc::EISDIR).to_string();
    assert!(
        line.contains(&format!("write runtime record {}", record.display())),
        "{line}"
    );
    assert!(line.contains(&cause), "{line}");
}
