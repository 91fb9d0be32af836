//! The fields devgate reads from a `/proc/<pid>/stat` line (proc(5)): state
//! (field 3), num_threads (20) and starttime (22, clock ticks after boot).
//! One parser for the hook's liveness checks and GPU teardown's pid checks,
//! which then apply their own rules to what it found.

/// The fields of a stat line that identify a process and say whether it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatLine {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: u8,
    /// Field 4: the parent's pid, as the pid namespace of the reader's
    /// `/proc` numbers it (0 for a parent outside it).
    pub ppid: u32,
    /// Field 20.
    pub num_threads: u64,
    /// Field 22: with the pid, the process's identity (a pid is reused).
    pub start_ticks: u64,
}

impl StatLine {
    /// Fields 3.. follow the `)` that ends `comm`; comm may hold spaces and
    /// parentheses, so the line is split at its last `)`.
    pub fn parse(text: &str) -> Option<StatLine> {
        let (_, rest) = text.rsplit_once(')')?;
        let mut fields = rest.split_ascii_whitespace();
        let state = match fields.next()?.as_bytes() {
            [state] => *state,
            _ => return None,
        };
        let ppid = fields.next()?.parse().ok()?;
        // After field 4, num_threads is the 16th field on, starttime the 18th.
        let num_threads = fields.nth(20 - 5)?.parse().ok()?;
        let start_ticks = fields.nth(22 - 21)?.parse().ok()?;
        Some(StatLine {
            state,
            ppid,
            num_threads,
            start_ticks,
        })
    }

    /// Exited: dead, or a zombie with no thread left. A zombie main thread
    /// whose process still has other threads is alive (a thread of a killed
    /// CUDA process stuck in the driver keeps its files open after the main
    /// thread exits).
    pub fn exited(&self) -> bool {
        match self.state {
            b'X' | b'x' => true,
            b'Z' => self.num_threads <= 1,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(comm: &str, state: &str, threads: &str, start: &str) -> String {
        with_parent(comm, state, "1", threads, start)
    }

    fn with_parent(comm: &str, state: &str, ppid: &str, threads: &str, start: &str) -> String {
        format!("42 ({comm}) {state} {ppid} 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 {threads} 0 {start} 1000 10 18446744073709551615 1 1 0 0 0 17 0 0\n")
    }

    #[test]
    fn fields_3_4_20_22_whatever_the_command_name() {
        let at = |state: u8, ppid: u32, num_threads: u64, start_ticks: u64| StatLine {
            state,
            ppid,
            num_threads,
            start_ticks,
        };
        let table: &[(String, Option<StatLine>)] = &[
            (
                line("sleep", "S", "1", "98765"),
                Some(at(b'S', 1, 1, 98765)),
            ),
            (line("a b) S 9 (x", "R", "4", "7"), Some(at(b'R', 1, 4, 7))),
            (line("", "D", "2", "0"), Some(at(b'D', 1, 2, 0))),
            (
                with_parent("x", "S", "0", "1", "7"),
                Some(at(b'S', 0, 1, 7)),
            ),
            (
                with_parent("x", "S", "4194304", "3", "7"),
                Some(at(b'S', 4194304, 3, 7)),
            ),
            (with_parent("x", "S", "-1", "1", "7"), None),
            (line("x", "SS", "1", "7"), None),
            (line("x", "S", "many", "7"), None),
            (line("x", "S", "1", "-7"), None),
            ("42 (x) S 1\n".into(), None),
            ("garbage".into(), None),
            (String::new(), None),
        ];
        for (text, want) in table {
            assert_eq!(StatLine::parse(text), *want, "{text:?}");
        }
    }

    #[test]
    fn exited_is_dead_or_a_zombie_without_threads() {
        let table = [
            ("S", "1", false),
            ("Z", "1", true),
            ("Z", "0", true),
            // The main thread exited, two others are still in the driver.
            ("Z", "3", false),
            ("X", "3", true),
            ("x", "1", true),
            ("D", "1", false),
        ];
        for (state, threads, exited) in table {
            let stat = StatLine::parse(&line("cuda", state, threads, "777")).unwrap();
            assert_eq!(stat.exited(), exited, "{state} {threads}");
        }
    }
}
