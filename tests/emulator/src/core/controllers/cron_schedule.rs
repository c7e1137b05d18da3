//! When a DataImportCron's schedule fires, on a clock tests can move.
//!
//! CDI runs each cron's poller as a CronJob with the cron's `spec.schedule`
//! (`dataimportcron-controller.go` `initCronJob`: `Schedule: cron.Spec.Schedule`), i.e. the
//! standard five-field schedule Kubernetes' CronJob controller evaluates (`robfig/cron`
//! `ParseStandard`): minute, hour, day of month, month, day of week (0–7, 0 and 7 Sunday);
//! `*`, numbers, ranges `A-B`, lists `A,B`, steps `/N`; when both day fields are restricted a
//! day matching either runs (Vixie cron's rule). Each run polls the registry: the poller writes
//! the source's digest and the run's time on the cron (`AnnSourceDesiredDigest`,
//! `AnnLastCronTime`), which the controller turns into a new import when the digest changed.
//!
//! The emulator has no registry and no CronJobs: [`CronWorld`] holds the digests tests give
//! references (else the stand-in of [`super::import_cron::digest_of`]) and an offset added to
//! the wall clock, so a test moves time past a schedule instead of sleeping.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

/// The registry digests and the clock the cron controller sees.
#[derive(Debug, Default)]
pub struct CronWorld {
    offset: AtomicI64,
    digests: Mutex<HashMap<String, String>>,
}

impl CronWorld {
    /// Now on the crons' clock (Unix seconds).
    pub fn now(&self) -> i64 {
        crate::core::util::now_unix() + self.offset.load(Ordering::SeqCst)
    }

    /// Moves the crons' clock forward by `secs`.
    pub fn advance(&self, secs: i64) {
        self.offset.fetch_add(secs, Ordering::SeqCst);
    }

    /// The registry now serves `digest` for `url` (`docker://…`, as in the cron's source).
    pub fn set_digest(&self, url: &str, digest: &str) {
        self.digests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(url.to_owned(), digest.to_owned());
    }

    /// The digest the registry serves for `url`.
    pub fn digest(&self, url: &str) -> String {
        self.digests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(url)
            .cloned()
            .unwrap_or_else(|| super::import_cron::digest_of(url))
    }
}

/// One field's allowed values in `lo..=hi`, or `None` if it does not parse.
fn field(text: &str, lo: u32, hi: u32) -> Option<Vec<bool>> {
    let mut allowed = vec![false; hi as usize + 1];
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0)?),
            None => (part, 1),
        };
        let (a, b) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (a.parse().ok()?, b.parse().ok()?)
        } else {
            let a: u32 = range.parse().ok()?;
            // `A/N` runs from A to the end of the range.
            (a, if part.contains('/') { hi } else { a })
        };
        if a < lo || b > hi || a > b {
            return None;
        }
        for v in (a..=b).step_by(step as usize) {
            allowed[v as usize] = true;
        }
    }
    Some(allowed)
}

/// A parsed five-field schedule.
pub struct Schedule {
    minute: Vec<bool>,
    hour: Vec<bool>,
    dom: Vec<bool>,
    month: Vec<bool>,
    dow: Vec<bool>,
    dom_any: bool,
    dow_any: bool,
}

impl Schedule {
    /// Parses `spec` (five fields), `None` if it is not one.
    pub fn parse(spec: &str) -> Option<Schedule> {
        let f: Vec<&str> = spec.split_whitespace().collect();
        if f.len() != 5 {
            return None;
        }
        let mut dow = field(f[4], 0, 7)?;
        if dow[7] {
            dow[0] = true;
        }
        Some(Schedule {
            minute: field(f[0], 0, 59)?,
            hour: field(f[1], 0, 23)?,
            dom: field(f[2], 1, 31)?,
            month: field(f[3], 1, 12)?,
            dow,
            dom_any: f[2].starts_with('*'),
            dow_any: f[4].starts_with('*'),
        })
    }

    /// Whether the schedule runs in the minute starting at Unix second `t` (UTC).
    fn runs_at(&self, t: i64) -> bool {
        let days = t.div_euclid(86_400);
        let secs = t.rem_euclid(86_400);
        let (_, month, day) = crate::core::util::civil_from_days(days);
        // 1970-01-01 was a Thursday.
        let weekday = (days + 4).rem_euclid(7) as usize;
        let day_ok = match (self.dom_any, self.dow_any) {
            (false, false) => self.dom[day as usize] || self.dow[weekday],
            _ => self.dom[day as usize] && self.dow[weekday],
        };
        self.minute[(secs / 60 % 60) as usize]
            && self.hour[(secs / 3600) as usize]
            && self.month[month as usize]
            && day_ok
    }

    /// The last time the schedule ran after `after` and up to `until` (Unix seconds), if it did.
    pub fn last_run(&self, after: i64, until: i64) -> Option<i64> {
        // Minute by minute, newest first, over at most a year and a day.
        let first = (after.div_euclid(60) + 1) * 60;
        let mut t = until.div_euclid(60) * 60;
        let stop = first.max(t - 366 * 86_400);
        while t >= stop {
            if self.runs_at(t) {
                return Some(t);
            }
            t -= 60;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::util::parse_rfc3339;

    fn at(s: &str) -> i64 {
        parse_rfc3339(s).unwrap()
    }

    #[test]
    fn daily_at_three_runs_once_a_day() {
        let s = Schedule::parse("0 3 * * *").unwrap();
        assert_eq!(
            s.last_run(at("2026-12-05T03:00:00Z"), at("2026-12-06T02:59:59Z")),
            None
        );
        assert_eq!(
            s.last_run(at("2026-12-05T03:00:00Z"), at("2026-12-06T03:00:00Z")),
            Some(at("2026-12-06T03:00:00Z"))
        );
        assert_eq!(
            s.last_run(at("2026-12-05T03:00:00Z"), at("2026-12-08T10:00:00Z")),
            Some(at("2026-12-08T03:00:00Z"))
        );
    }

    /// Checked against `date -d 2026-12-05 +%a` (Sat) and the cron(5) rules.
    #[test]
    fn weekdays_steps_lists_and_the_day_fields_rule() {
        // Mondays at 04:30 (7 and 0 are Sunday).
        let s = Schedule::parse("30 4 * * 1").unwrap();
        assert_eq!(
            s.last_run(at("2026-12-05T00:00:00Z"), at("2026-12-09T00:00:00Z")),
            Some(at("2026-12-07T04:30:00Z"))
        );
        let sunday = Schedule::parse("0 0 * * 7").unwrap();
        assert_eq!(
            sunday.last_run(at("2026-12-05T00:00:00Z"), at("2026-12-07T00:00:00Z")),
            Some(at("2026-12-06T00:00:00Z"))
        );
        // Every 15 minutes: the last run before 10:14 is 10:00.
        let s = Schedule::parse("*/15 * * * *").unwrap();
        assert_eq!(
            s.last_run(at("2026-12-05T09:50:00Z"), at("2026-12-05T10:14:59Z")),
            Some(at("2026-12-05T10:00:00Z"))
        );
        // Both day fields restricted: the 1st of the month OR a Saturday.
        let s = Schedule::parse("0 12 1 * 6").unwrap();
        assert_eq!(
            s.last_run(at("2026-12-02T00:00:00Z"), at("2026-12-05T23:00:00Z")),
            Some(at("2026-12-05T12:00:00Z"))
        );
        for bad in [
            "0 3 * *",
            "60 3 * * *",
            "0 3 * * 8",
            "*/0 * * * *",
            "5-1 * * * *",
        ] {
            assert!(Schedule::parse(bad).is_none(), "{bad}");
        }
    }
}
