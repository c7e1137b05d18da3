//! The request log: every request the emulator received, in order, so tests can assert what a
//! client sent (method, path, query, body, headers) and that a command sent nothing at all.

use std::sync::Mutex;

/// One request as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method, e.g. `PUT`.
    pub method: String,
    /// The URL path, e.g. `/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/web/start`.
    pub path: String,
    /// The raw query string ("" when there is none).
    pub query: String,
    /// Request headers (names lower-case), in the order received; `authorization` is left out.
    pub headers: Vec<(String, String)>,
    /// The body as sent (lossy UTF-8).
    pub body: String,
    /// The response status, once the handler answered (0 while it runs, e.g. an open watch
    /// or websocket answered 101 is recorded as 101).
    pub status: u16,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (None when it is not JSON).
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// The log itself, shared by every connection.
#[derive(Debug, Default)]
pub struct RequestLog {
    entries: Mutex<Vec<RecordedRequest>>,
}

impl RequestLog {
    /// Records a request; returns its index for [`RequestLog::set_status`].
    pub fn record(&self, parts: &http::request::Parts, body: &[u8]) -> usize {
        let headers = parts
            .headers
            .iter()
            .filter(|(name, _)| *name != http::header::AUTHORIZATION)
            .map(|(name, value)| {
                (
                    name.as_str().to_string(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        let entry = RecordedRequest {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            headers,
            body: String::from_utf8_lossy(body).into_owned(),
            status: 0,
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.push(entry);
        entries.len() - 1
    }

    /// Records the response status of entry `index`.
    pub fn set_status(&self, index: usize, status: u16) {
        if let Some(e) = self
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(index)
        {
            e.status = status;
        }
    }

    /// A copy of every request so far.
    pub fn all(&self) -> Vec<RecordedRequest> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets every request so far.
    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
