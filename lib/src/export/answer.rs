//! How the download's request loop reads the server's answer to a (ranged) GET or HEAD:
//! whether the data already on disk is still the source's, where the body continues it, and
//! when to try again. No I/O: [`super::download`] acts on the verdicts.

use std::time::Duration;

use http::{HeaderName, StatusCode, header};
use serde::{Deserialize, Serialize};

use super::http::HttpError;

/// Validators of a partial download, kept next to it in `FILE.partial.meta`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialMeta {
    /// The server's ETag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// The server's Last-Modified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
    /// The complete size.
    pub size: u64,
    /// The URL's volume and format, so a different export of the same data still resumes.
    pub format: String,
}

impl PartialMeta {
    /// What `If-Range` carries: a strong ETag, else Last-Modified.
    fn validator(&self) -> Option<&str> {
        self.etag
            .as_deref()
            .filter(|e| !e.starts_with("W/"))
            .or(self.last_modified.as_deref())
    }

    /// Whether the answer's validators say it is the data this partial download was of.
    fn same_source(&self, answer: &Answer) -> bool {
        (self.etag.is_some() && self.etag == answer.etag)
            || (self.etag.is_none()
                && self.last_modified.is_some()
                && self.last_modified == answer.last_modified)
    }
}

/// Whether everything is on disk already (`offset` is the whole size): then only a HEAD asks
/// whether it is still the source's.
pub(crate) fn complete(meta: Option<&PartialMeta>, offset: u64) -> bool {
    meta.is_some_and(|m| offset == m.size && m.size > 0)
}

/// The headers of the next request: a range from `offset` (with `If-Range`, so a changed
/// source answers with all of it) when the stream can continue from an offset (`ranged`).
pub(crate) fn request_headers(
    ranged: bool,
    offset: u64,
    meta: Option<&PartialMeta>,
) -> Vec<(HeaderName, String)> {
    let mut headers: Vec<(HeaderName, String)> = vec![];
    if ranged && offset > 0 {
        headers.push((header::RANGE, format!("bytes={offset}-")));
        if let Some(v) = meta.and_then(PartialMeta::validator) {
            headers.push((header::IF_RANGE, v.to_string()));
        }
    }
    headers
}

/// The parts of an answer that say what its body is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    /// `Content-Length`.
    pub length: Option<u64>,
    /// `Content-Range`, as sent.
    pub content_range: Option<String>,
}

impl Answer {
    /// Reads them from a response.
    pub fn of<B>(response: &http::Response<B>) -> Answer {
        let text = |name: HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        Answer {
            status: response.status(),
            etag: text(header::ETAG),
            last_modified: text(header::LAST_MODIFIED),
            length: text(header::CONTENT_LENGTH).and_then(|v| v.parse().ok()),
            content_range: text(header::CONTENT_RANGE),
        }
    }
}

/// `Content-Range: bytes START-END/SIZE` → (START, SIZE).
pub(crate) fn content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.strip_prefix("bytes ")?;
    let (range, size) = rest.split_once('/')?;
    let (start, _) = range.split_once('-')?;
    Some((start.parse().ok()?, size.parse().ok()))
}

/// What an answer means for the data on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Everything is on disk already and still the source's: done.
    Complete,
    /// The body continues the data on disk (or starts it); the whole size, when known.
    Continue { total: Option<u64> },
    /// The data on disk is not what the answer continues: start over (the whole size, when
    /// known, is `total`).
    StartOver { total: Option<u64> },
}

/// Judges `answer` to a request made at `offset` with `meta` kept from before; `gzip`: the
/// stream cannot continue from an offset and its size is unknown.
pub(crate) fn judge(
    answer: &Answer,
    meta: Option<&PartialMeta>,
    offset: u64,
    gzip: bool,
) -> Verdict {
    let total = meta.map(|m| m.size);
    if complete(meta, offset) {
        // Everything is on disk already: only check it is still the same data.
        if answer.status == StatusCode::OK
            && meta.is_some_and(|m| m.same_source(answer) && Some(m.size) == answer.length)
        {
            return Verdict::Complete;
        }
        return Verdict::StartOver { total };
    }
    if answer.status == StatusCode::PARTIAL_CONTENT {
        let range = answer.content_range.as_deref().and_then(content_range);
        return match range {
            Some((start, size)) if start == offset && size == total => Verdict::Continue { total },
            _ => Verdict::StartOver { total },
        };
    }
    if answer.status == StatusCode::OK {
        let total = if gzip { None } else { answer.length };
        return if offset > 0 {
            Verdict::StartOver { total }
        } else {
            Verdict::Continue { total }
        };
    }
    // 416 and anything unexpected: the data is not what we have.
    Verdict::StartOver { total }
}

/// After `failures` failed attempts in a row ending in `error`: the delay before the next
/// (doubling from `retry_delay`, at most 8 s), or `None` when the error is final or the
/// `max_retries` are spent.
pub(crate) fn backoff(
    error: &HttpError,
    failures: u32,
    max_retries: u32,
    retry_delay: Duration,
) -> Option<Duration> {
    if !error.retryable() || failures > max_retries {
        return None;
    }
    Some(
        retry_delay
            .saturating_mul(1 << (failures - 1).min(4))
            .min(Duration::from_secs(8)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(etag: Option<&str>, size: u64) -> PartialMeta {
        PartialMeta {
            etag: etag.map(String::from),
            last_modified: Some("Sat, 05 Dec 2026 10:00:00 GMT".into()),
            size,
            format: "raw".into(),
        }
    }

    fn answer(status: u16, etag: Option<&str>, length: Option<u64>, range: Option<&str>) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            etag: etag.map(String::from),
            last_modified: None,
            length,
            content_range: range.map(String::from),
        }
    }

    #[test]
    fn content_range_parses() {
        assert_eq!(content_range("bytes 100-199/1000"), Some((100, Some(1000))));
        assert_eq!(content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(content_range("items 1-2/3"), None);
    }

    /// RFC 9110 §13.1.5: a weak ETag cannot validate a range; Last-Modified then does.
    #[test]
    fn ranges_carry_a_strong_validator() {
        let m = meta(Some("\"abc\""), 1000);
        assert_eq!(
            request_headers(true, 100, Some(&m)),
            vec![
                (header::RANGE, "bytes=100-".to_string()),
                (header::IF_RANGE, "\"abc\"".to_string())
            ]
        );
        let weak = meta(Some("W/\"abc\""), 1000);
        assert_eq!(
            request_headers(true, 100, Some(&weak))[1].1,
            "Sat, 05 Dec 2026 10:00:00 GMT"
        );
        assert!(request_headers(false, 100, Some(&m)).is_empty());
        assert!(request_headers(true, 0, Some(&m)).is_empty());
    }

    #[test]
    fn answers_are_judged_against_what_is_on_disk() {
        let m = meta(Some("\"abc\""), 1000);
        let on_disk = Some(&m);
        // A 206 for the range asked continues; for another range, starts over.
        let partial = answer(206, Some("\"abc\""), Some(900), Some("bytes 100-999/1000"));
        assert_eq!(
            judge(&partial, on_disk, 100, false),
            Verdict::Continue { total: Some(1000) }
        );
        let elsewhere = answer(206, Some("\"abc\""), Some(900), Some("bytes 0-999/1000"));
        assert_eq!(
            judge(&elsewhere, on_disk, 100, false),
            Verdict::StartOver { total: Some(1000) }
        );
        // A 200 to a range request is the whole (changed) source.
        let whole = answer(200, Some("\"def\""), Some(2000), None);
        assert_eq!(
            judge(&whole, on_disk, 100, false),
            Verdict::StartOver { total: Some(2000) }
        );
        assert_eq!(
            judge(&whole, None, 0, false),
            Verdict::Continue { total: Some(2000) }
        );
        assert_eq!(
            judge(&whole, None, 0, true),
            Verdict::Continue { total: None }
        );
        // All on disk: the same source and size is done; anything else starts over.
        let same = answer(200, Some("\"abc\""), Some(1000), None);
        assert_eq!(judge(&same, on_disk, 1000, false), Verdict::Complete);
        let changed = answer(200, Some("\"xyz\""), Some(1000), None);
        assert_eq!(
            judge(&changed, on_disk, 1000, false),
            Verdict::StartOver { total: Some(1000) }
        );
        let refused = answer(416, None, None, None);
        assert_eq!(
            judge(&refused, on_disk, 100, false),
            Verdict::StartOver { total: Some(1000) }
        );
    }

    #[test]
    fn retries_double_up_to_eight_seconds_and_stop() {
        let body = HttpError::Body("reset".into());
        let delays: Vec<_> = (1..=6)
            .map(|n| backoff(&body, n, 6, Duration::from_secs(1)))
            .collect();
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(
            delays,
            [secs(1), secs(2), secs(4), secs(8), secs(8), secs(8)]
        );
        assert_eq!(backoff(&body, 7, 6, Duration::from_secs(1)), None);
        let not_found = HttpError::Status {
            code: 404,
            message: "not found".into(),
        };
        assert_eq!(backoff(&not_found, 1, 6, Duration::from_secs(1)), None);
    }
}
