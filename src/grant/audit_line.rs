//! Decisions' audit lines: a let-through decision's, kept for the counters'
//! writer to log (see [`super::audit`]): formatting and writing a log line on
//! the container-start path cost the first container of a pod about as much as
//! the rest of its admission's user-space work, with caches cold; and those
//! logged at once (refusals, repeats at debug).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use super::audit::{Decision, Outcome};

/// Most lines waiting for the writer; past it a line is logged at once, so a
/// burst of pods never grows the plugin's memory.
pub(super) const MAX_PENDING: usize = 256;

/// A decision's line as it will be logged, with the time it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingLine {
    pod: String,
    uid: String,
    container: String,
    devices: String,
    outcome: Outcome,
    reason: String,
    decided: SystemTime,
}

impl PendingLine {
    pub(super) fn new(d: &Decision<'_>) -> PendingLine {
        PendingLine {
            pod: d.pod.to_string(),
            uid: d.uid.to_string(),
            container: d.container.to_string(),
            devices: d.devices.to_string(),
            outcome: d.outcome,
            reason: d.reason.to_string(),
            decided: SystemTime::now(),
        }
    }

    /// Its line, which the writer's own timestamp follows by up to its interval.
    pub(super) fn log(&self) {
        let d = Decision {
            pod: &self.pod,
            uid: &self.uid,
            container: &self.container,
            devices: &self.devices,
            outcome: self.outcome,
            reason: &self.reason,
        };
        log(&d, self.decided);
    }
}

/// The record of a decision that lets a container through, at info;
/// `decided` is when it was made.
pub(super) fn log(d: &Decision<'_>, decided: SystemTime) {
    tracing::info!(
        target: "devgate::audit", pod = %d.pod, uid = %d.uid,
        container = %d.container, devices = %d.devices,
        outcome = outcome_name(d.outcome), reason = %d.reason,
        decided = %Rfc3339(decided), "device grant"
    );
}

/// A time as RFC 3339 UTC with microseconds, the form of the log's own
/// timestamps (`2026-12-02T10:01:12.324948Z`).
pub(super) struct Rfc3339(pub SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = self.0.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        let (year, month, day) = civil_from_days((secs / 86_400) as i64);
        let rem = secs % 86_400;
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60,
            since.subsec_micros()
        )
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, http://howardhinnant.github.io/date_algorithms.html).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// How a decision is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Line {
    /// At info (warn for a refusal): the record of the decision, now.
    Logged,
    /// At info, by the writer: the record of a decision that let the container through.
    Deferred,
}

/// Logs a decision's line that is not left to the writer.
pub(super) fn log_now(d: &Decision<'_>, line: Line) {
    match (d.outcome, line) {
        (Outcome::Refused(kind), _) => tracing::warn!(
            target: "devgate::audit", pod = %d.pod, uid = %d.uid, container = %d.container,
            devices = %d.devices, outcome = "refused", rule = kind.as_str(), reason = %d.reason,
            "device grant refused"
        ),
        (_, Line::Logged) => log(d, SystemTime::now()),
        (_, Line::Deferred) => {}
    }
}

pub(super) fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Granted => "granted",
        Outcome::Unchecked => "unchecked",
        Outcome::Unverified => "unverified",
        Outcome::Refused(_) => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_format_as_the_logs_own_timestamps() {
        let at = |secs, micros: u32| {
            Rfc3339(UNIX_EPOCH + Duration::new(secs, micros * 1000)).to_string()
        };
        for (secs, micros, text) in [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, 1, "2000-02-29T00:00:00.000001Z"),
            (951_868_799, 999_999, "2000-02-29T23:59:59.999999Z"),
            (1_709_251_199, 0, "2024-02-29T23:59:59.000000Z"),
            (1_735_689_600, 0, "2025-01-01T00:00:00.000000Z"),
            (1_796_205_672, 324_948, "2026-12-02T10:01:12.324948Z"),
            (4_102_444_800, 0, "2100-01-01T00:00:00.000000Z"),
        ] {
            assert_eq!(at(secs, micros), text, "{secs}");
        }
    }

    #[test]
    fn every_day_follows_the_one_before() {
        let mut prev = civil_from_days(-1);
        assert_eq!(prev, (1969, 12, 31));
        for days in 0..200_000 {
            let (y, m, d) = civil_from_days(days);
            let next_day = (y, m, d) == (prev.0, prev.1, prev.2 + 1);
            let next_month = d == 1 && (y, m) == (prev.0, prev.1 + 1);
            let next_year = (m, d) == (1, 1) && y == prev.0 + 1 && prev.1 == 12;
            assert!(
                next_day || next_month || next_year,
                "{prev:?} then {y}-{m}-{d}"
            );
            prev = (y, m, d);
        }
    }
}
