//! What the plugin logs.

use nri::Plugin as _;

use super::*;
use crate::logging::capture::Captured;

/// A log line about a failed step carries its causes: "write runtime record"
/// alone would not say why.
#[test]
fn a_logged_failure_names_its_cause() {
    let (p, _state) = plugin(Config::default(), false);
    // A directory, not empty, where the record is renamed to.
    let record = features::RuntimeRecord::path(&p.options.state_dir);
    std::fs::create_dir_all(record.join("in-the-way")).unwrap();
    let runtime = RuntimeInfo {
        name: "containerd".to_string(),
        version: "1.7.24".to_string(),
        ..Default::default()
    };
    let log = Captured::default();
    log.run(|| p.configure(&runtime)).unwrap();
    let lines = log.lines("runtime record not saved");
    let line = lines.first().expect("logged");
    let cause = std::io::Error::from_raw_os_error(libc::EISDIR).to_string();
    assert!(
        line.contains(&format!("write runtime record {}", record.display())),
        "{line}"
    );
    assert!(line.contains(&cause), "{line}");
}
