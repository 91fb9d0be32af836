//! Keeps the long-running plugin's resident set to the code it runs.
//!
//! Start-up (flag and config parsing, logging set-up, the first inventory,
//! the NRI handshake) touches code that never runs again, and the kernel's
//! fault-around maps 64 KiB of file pages around every page touched
//! (`mm/filemap.c` `filemap_map_pages`, `fault_around_bytes`), so a node
//! agent that started once keeps megabytes of cold text mapped for its whole
//! life. After the handshake the plugin drops its read-only file mappings'
//! pages with `madvise(MADV_DONTNEED)`: for a private file mapping that is
//! never written, later accesses fault the same bytes back in from the page
//! cache (madvise(2)), so only the code the plugin still runs returns.
//!
//! Only mappings that hold no written page qualify: a writable mapping would
//! lose data, and so would a read-only one the loader wrote before sealing it
//! (RELRO: relocated pointers, `mprotect`ed read-only afterwards). Those show
//! as `Anonymous:` pages in `/proc/self/smaps` (proc(5)) and are skipped. And
//! only files mapped before the plugin started anything qualify (the program,
//! its loader and the libraries it was linked with, all relocated before
//! `main`): a library opened later (NVML, loaded on demand) could be in the
//! middle of its relocation on another thread, and a page dropped then would
//! lose what the loader wrote.
//!
//! The kernel drops such clean file pages on its own under memory pressure;
//! this only does it early, for pages the plugin is done with.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error("read {path}")]
    Maps {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A `[start, end)` address range from `/proc/<pid>/maps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: usize,
    pub end: usize,
}

/// The files this process mapped before it started anything: the only ones
/// whose pages [`shed_file_pages`] drops.
#[derive(Debug, Clone, Default)]
pub struct StartupFiles(HashSet<String>);

impl StartupFiles {
    /// The files mapped now, from `<proc_root>/self/maps`; none if it cannot
    /// be read (then nothing is ever shed).
    pub fn capture(proc_root: &Path) -> StartupFiles {
        let maps = std::fs::read_to_string(proc_root.join("self/maps")).unwrap_or_default();
        StartupFiles::from_maps(&maps)
    }

    pub fn from_maps(maps: &str) -> StartupFiles {
        let paths = maps
            .lines()
            .filter_map(|l| l.split_ascii_whitespace().nth(5))
            .filter(|p| p.starts_with('/'))
            .map(str::to_string)
            .collect();
        StartupFiles(paths)
    }

    fn contains(&self, path: &str) -> bool {
        self.0.contains(path)
    }
}

/// The ranges of `smaps` (the text of `/proc/<pid>/smaps`) that map a file
/// privately and read-only and hold no copied-on-write page: program text,
/// read-only data and shared libraries. Anonymous, writable, shared, written
/// (RELRO, resident or swapped out) and special (`[vdso]`, `[vvar]`) mappings
/// are left out, as is a mapping whose lines do not parse.
pub fn clean_read_only_file_ranges(smaps: &str) -> Vec<(Range, &str)> {
    let mut out = Vec::new();
    // The current mapping, while it still qualifies.
    let mut current: Option<(Range, &str)> = None;
    let mut anonymous_seen = false;
    for line in smaps.lines() {
        if let Some((key, value)) = line.split_once(':').filter(|(k, _)| !k.contains(' ')) {
            let zero = value.split_ascii_whitespace().next() == Some("0");
            if key == "Anonymous" {
                anonymous_seen = true;
                if !zero {
                    current = None;
                }
            }
            // A copied-on-write page that was swapped out counts under
            // `Swap:`, not `Anonymous:` (smaps_pte_entry): dropping it would
            // bring back the file's bytes in place of the relocated ones.
            if key == "Swap" && !zero {
                current = None;
            }
            continue;
        }
        // A mapping's header line: the previous mapping is complete.
        if let (Some(r), true) = (current.take(), anonymous_seen) {
            out.push(r);
        }
        current = read_only_file_range(line);
        anonymous_seen = false;
    }
    if let (Some(r), true) = (current, anonymous_seen) {
        out.push(r);
    }
    out
}

/// The range and file of one mapping header line, if it maps a file privately
/// and read-only.
fn read_only_file_range(line: &str) -> Option<(Range, &str)> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next()?;
    let private_read_only =
        perms.len() == 4 && perms[0] == b'r' && perms[1] == b'-' && perms[3] == b'p';
    if !private_read_only || inode == "0" || !path.starts_with('/') {
        return None;
    }
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (start < end).then_some((Range { start, end }, path))
}

/// Drops the resident pages of this process's clean private read-only
/// mappings of `startup` files, as listed in `<proc_root>/self/smaps`; returns
/// the bytes advised. A range the kernel refuses is skipped: this only ever
/// saves memory.
pub fn shed_file_pages(proc_root: &Path, startup: &StartupFiles) -> Result<usize, ResidencyError> {
    let path = proc_root.join("self/smaps");
    let smaps = std::fs::read_to_string(&path).map_err(|source| ResidencyError::Maps {
        path: path.clone(),
        source,
    })?;
    let mut advised = 0;
    for (r, path) in clean_read_only_file_ranges(&smaps) {
        if !startup.contains(path) {
            continue;
        }
        let len = r.end - r.start;
        // SAFETY: the range is a whole private read-only file mapping of this
        // process; MADV_DONTNEED there changes no byte a reader sees, only
        // when it is read from the page cache again.
        let rc = unsafe { libc::madvise(r.start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if rc == 0 {
            advised += len;
        }
    }
    Ok(advised)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn only_clean_private_read_only_file_mappings_are_chosen() {
        let smaps = "\
55d0c0a00000-55d0c0b00000 r--p 00000000 08:01 131 /usr/local/bin/devgate
Rss:                 400 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
55d0c0b00000-55d0c1100000 r-xp 00100000 08:01 131 /usr/local/bin/devgate
Anonymous:             0 kB
55d0c1100000-55d0c1110000 r--p 00700000 08:01 131 /usr/local/bin/devgate
Anonymous:            64 kB
55d0c1110000-55d0c1120000 rw-p 00710000 08:01 131 /usr/local/bin/devgate
Anonymous:            12 kB
55d0c2000000-55d0c2100000 rw-p 00000000 00:00 0                          [heap]
Anonymous:            80 kB
7f0000000000-7f0000001000 r--s 00000000 00:05 9 /dev/shm/x
Anonymous:             0 kB
7f0000100000-7f0000200000 r-xp 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f0000300000-7f0000400000 r--p 00000000 00:00 0
Anonymous:             0 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
7ffd00010000-7ffd00020000 r-xp 00000000 08:01 99 /old/devgate (deleted)
Anonymous:             0 kB
zzzz-7ffd00030000 r-xp 00000000 08:01 5 /bad
Anonymous:             0 kB
7ffd00040000-7ffd00040000 r-xp 00000000 08:01 5 /empty
Anonymous:             0 kB
7ffd00050000-7ffd00060000 r-xp 00000000 08:01 5 /no-anonymous-line
Rss:                   4 kB
7ffd00060000-7ffd00070000 r--p 00000000 08:01 5 /relro-swapped-out
Anonymous:             0 kB
Swap:                  8 kB
7ffd00070000-7ffd00080000 r-xp 00000000 08:01 5 /last
Anonymous:             0 kB
";
        let got: Vec<(usize, usize)> = clean_read_only_file_ranges(smaps)
            .into_iter()
            .map(|(r, _)| (r.start, r.end))
            .collect();
        assert_eq!(
            got,
            [
                (0x55d0c0a00000, 0x55d0c0b00000),
                (0x55d0c0b00000, 0x55d0c1100000),
                (0x7f0000100000, 0x7f0000200000),
                (0x7ffd00010000, 0x7ffd00020000),
                (0x7ffd00070000, 0x7ffd00080000),
            ]
        );
    }

    #[test]
    fn shedding_keeps_code_and_data_working() {
        // Writable data survives (it is never advised), and the code that runs
        // after the advice is faulted back in.
        static COUNTER: AtomicU64 = AtomicU64::new(41);
        COUNTER.fetch_add(1, Ordering::Relaxed);
        let heap = vec![7u8; 1 << 20];
        let startup = StartupFiles::capture(Path::new("/proc"));
        let advised = shed_file_pages(Path::new("/proc"), &startup).unwrap();
        assert!(advised > 0);
        assert_eq!(
            shed_file_pages(Path::new("/proc"), &StartupFiles::default()).unwrap(),
            0,
            "files mapped later are never shed"
        );
        assert_eq!(COUNTER.load(Ordering::Relaxed), 42);
        assert!(heap.iter().all(|b| *b == 7));
        assert_eq!(format!("{}", 6 * 7), "42");
    }

    #[test]
    fn startup_files_are_the_mapped_files() {
        let maps = "\
55d0c0a00000-55d0c0b00000 r--p 00000000 08:01 131 /usr/local/bin/devgate
55d0c2000000-55d0c2100000 rw-p 00000000 00:00 0 [heap]
7f0000100000-7f0000200000 r-xp 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000300000-7f0000400000 r--p 00000000 00:00 0
";
        let files = StartupFiles::from_maps(maps);
        assert!(files.contains("/usr/local/bin/devgate"));
        assert!(files.contains("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!files.contains("[heap]"));
        assert_eq!(files.0.len(), 2);
    }
}
