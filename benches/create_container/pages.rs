//! The pages of the plugin's memory each CreateContainer touches
//! (`DEVGATE_BENCH_PAGES=1`): the accessed bits of the process's page tables
//! are cleared before the call (`/proc/PID/clear_refs`, `1`) and counted after it
//! (`Referenced:` of each mapping in `/proc/PID/smaps`), by kind of mapping. Each
//! page is at least one TLB entry to refill when the request finds the TLB cold.
//! Clearing the bits flushes the process's TLB and makes the hardware set them
//! again, so the CPU figures of a run in this mode are not comparable with others.

/// Kinds of mapping, in the order printed.
const KINDS: [&str; 5] = ["program code", "program data", "heap", "libraries", "other"];

/// Pages touched over the calls counted, by kind.
#[derive(Default)]
pub struct Touched {
    pages: [u64; KINDS.len()],
    calls: u64,
}

impl Touched {
    /// Clears the accessed bits of `pid`'s pages.
    pub fn clear(pid: u32) {
        std::fs::write(format!("/proc/{pid}/clear_refs"), "1").expect("clear_refs");
    }

    /// Adds the pages `pid` touched since `clear`.
    pub fn count(&mut self, pid: u32) {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the plugin's program");
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
        let mut kind = KINDS.len() - 1;
        for line in smaps.lines() {
            if let Some(kb) = line.strip_prefix("Referenced:") {
                let kib: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                self.pages[kind] += kib / 4;
            } else if let Some(k) = mapping_kind(line, &exe) {
                kind = k;
            }
        }
        self.calls += 1;
    }

    /// "N pages: X program code, ..." per call, or `None` when none was counted.
    pub fn report(&self) -> Option<String> {
        let calls = self.calls.max(1) as f64;
        let total: u64 = self.pages.iter().sum();
        let parts: Vec<String> = KINDS
            .iter()
            .zip(self.pages)
            .map(|(name, n)| format!("{:.1} {name}", n as f64 / calls))
            .collect();
        (self.calls > 0).then(|| format!("{:.1} pages: {}", total as f64 / calls, parts.join(", ")))
    }
}

/// The kind of the mapping a header line of smaps opens (`START-END PERMS
/// OFFSET DEV INODE [PATH]`), or `None` for the other lines.
fn mapping_kind(line: &str, exe: &std::path::Path) -> Option<usize> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(start) || !hex(end) {
        return None;
    }
    let perms = fields.next()?;
    let path = fields.nth(3).unwrap_or("");
    Some(if std::path::Path::new(path) == exe {
        if perms.contains('x') {
            0
        } else {
            1
        }
    } else if path == "[heap]" {
        2
    } else if path.starts_with('/') {
        3
    } else {
        4
    })
}
