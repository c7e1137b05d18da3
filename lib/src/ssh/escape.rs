//! OpenSSH's escape sequences (ssh(1), ESCAPE CHARACTERS) for interactive sessions: the
//! escape character (default `~`) is a command only right after a newline or at the very
//! start; `~.` disconnects, `~^Z` suspends, `~?` lists the escapes, `~~` sends one `~`, and a
//! `~` followed by anything else sends both. This is the pure state machine: bytes in, data
//! and commands out, in order; the terminal actions belong to the caller.
//!
//! Facts from openssh-portable: `process_escapes` in clientloop.c (the state machine,
//! `last_was_cr` set at the start of the session and after `\r` or `\n`, commands leave it
//! unchanged), the `-e` parsing in ssh.c's option loop.

use std::fmt;
use std::str::FromStr;

/// The escape character of `-e`: a byte, or none (escapes off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscapeChar {
    /// No escape character: every byte is sent as typed.
    None,
    /// This byte starts an escape.
    Char(u8),
}

impl Default for EscapeChar {
    fn default() -> Self {
        EscapeChar::Char(b'~')
    }
}

impl FromStr for EscapeChar {
    type Err = String;

    /// As OpenSSH's `-e`: `^X` (a caret and a character from `@` to DEL-1) is that control
    /// character, one single byte is itself, `none` turns escapes off.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let b = s.as_bytes();
        if b.len() == 2 && b[0] == b'^' && (64..128).contains(&b[1]) {
            Ok(EscapeChar::Char(b[1] & 31))
        } else if b.len() == 1 {
            Ok(EscapeChar::Char(b[0]))
        } else if s == "none" {
            Ok(EscapeChar::None)
        } else {
            Err(format!("Bad escape character '{s}'."))
        }
    }
}

impl fmt::Display for EscapeChar {
    /// How to show it to a user: `~`, `^]`, `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EscapeChar::None => f.write_str("none"),
            EscapeChar::Char(c) if *c < 32 => write!(f, "^{}", char::from(c + 64)),
            EscapeChar::Char(127) => f.write_str("^?"),
            EscapeChar::Char(c) => write!(f, "{}", char::from(*c)),
        }
    }
}

/// What one stretch of input means, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EscapeEvent {
    /// Bytes to send to the remote side.
    Data(Vec<u8>),
    /// `~.`: end the connection now. Input after it is dropped.
    Disconnect,
    /// `~^Z`: suspend the client.
    Suspend,
    /// `~?`: list the escapes.
    Help,
}

/// The escapes a session understands, for `~?`: the key after the escape character and
/// what it does.
pub const ESCAPES: &[(&str, &str)] = &[
    (".", "disconnect"),
    ("^Z", "suspend kubectl-vm (resume with fg)"),
    ("?", "list these escapes"),
];

/// The escape state of one session's input.
#[derive(Debug, Clone)]
pub struct EscapeFilter {
    escape: EscapeChar,
    /// The last byte sent was a newline, or nothing was sent yet.
    at_line_start: bool,
    /// The escape character was seen at a line start and waits for its command.
    pending: bool,
    /// `~.` was seen: nothing more is passed on.
    done: bool,
}

impl EscapeFilter {
    /// A filter for a new session.
    pub fn new(escape: EscapeChar) -> EscapeFilter {
        EscapeFilter {
            escape,
            at_line_start: true,
            pending: false,
            done: false,
        }
    }

    /// Run `input` through the state machine. State carries over to the next call, so an
    /// escape split across reads works.
    pub fn feed(&mut self, input: &[u8]) -> Vec<EscapeEvent> {
        let mut events = Vec::new();
        let mut data = Vec::with_capacity(input.len());
        let EscapeChar::Char(esc) = self.escape else {
            if !self.done && !input.is_empty() {
                events.push(EscapeEvent::Data(input.to_vec()));
            }
            return events;
        };
        for &ch in input {
            if self.done {
                break;
            }
            if self.pending {
                self.pending = false;
                let command = match ch {
                    b'.' => Some(EscapeEvent::Disconnect),
                    0x1a => Some(EscapeEvent::Suspend),
                    b'?' => Some(EscapeEvent::Help),
                    _ => None,
                };
                if let Some(command) = command {
                    if !data.is_empty() {
                        events.push(EscapeEvent::Data(std::mem::take(&mut data)));
                    }
                    self.done = command == EscapeEvent::Disconnect;
                    events.push(command);
                    // A command leaves the line start as it was: another escape may follow.
                    continue;
                }
                if ch != esc {
                    data.push(esc);
                }
            } else if self.at_line_start && ch == esc {
                self.pending = true;
                continue;
            }
            self.at_line_start = ch == b'\r' || ch == b'\n';
            data.push(ch);
        }
        if !data.is_empty() {
            events.push(EscapeEvent::Data(data));
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EscapeEvent::*;

    fn data(s: &[u8]) -> EscapeEvent {
        Data(s.to_vec())
    }

    /// Feed each chunk in turn, and join adjacent data for comparison.
    fn run(escape: EscapeChar, chunks: &[&[u8]]) -> Vec<EscapeEvent> {
        let mut f = EscapeFilter::new(escape);
        let mut out: Vec<EscapeEvent> = Vec::new();
        for c in chunks {
            for e in f.feed(c) {
                match (out.last_mut(), e) {
                    (Some(Data(prev)), Data(next)) => prev.extend(next),
                    (_, e) => out.push(e),
                }
            }
        }
        out
    }

    fn tilde(chunks: &[&[u8]]) -> Vec<EscapeEvent> {
        run(EscapeChar::default(), chunks)
    }

    /// Every split of `input` into two reads, and one byte per read, give `expected`.
    fn every_split(input: &[u8], expected: &[EscapeEvent]) {
        assert_eq!(tilde(&[input]), expected, "whole {input:?}");
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert_eq!(tilde(&[a, b]), expected, "split at {i} of {input:?}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(tilde(&bytes), expected, "byte by byte {input:?}");
    }

    #[test]
    fn disconnect_at_the_start_and_after_newlines() {
        every_split(b"~.", &[Disconnect]);
        every_split(b"ls\r~.rest", &[data(b"ls\r"), Disconnect]);
        every_split(b"ls\n~.", &[data(b"ls\n"), Disconnect]);
    }

    #[test]
    fn not_an_escape_in_the_middle_of_a_line() {
        every_split(b"a~.b", &[data(b"a~.b")]);
        every_split(b"sleep 600 ~.", &[data(b"sleep 600 ~.")]);
    }

    #[test]
    fn double_escape_sends_one_and_ends_the_line_start() {
        every_split(b"~~", &[data(b"~")]);
        // After `~~` the line is no longer at its start, so `~.` is plain text.
        every_split(b"~~~.", &[data(b"~~.")]);
        every_split(b"\r~~x", &[data(b"\r~x")]);
    }

    #[test]
    fn other_characters_send_both() {
        every_split(b"~x", &[data(b"~x")]);
        every_split(b"~B", &[data(b"~B")]);
        // `~` then a newline sends both, and the newline starts a line again.
        every_split(b"~\r~.", &[data(b"~\r"), Disconnect]);
    }

    #[test]
    fn help_and_suspend_keep_the_line_start() {
        every_split(b"~?~.", &[Help, Disconnect]);
        every_split(b"x\r~\x1a~?y", &[data(b"x\r"), Suspend, Help, data(b"y")]);
    }

    #[test]
    fn nothing_passes_after_disconnect() {
        let mut f = EscapeFilter::new(EscapeChar::default());
        assert_eq!(f.feed(b"~.abc"), vec![Disconnect]);
        assert_eq!(f.feed(b"more"), vec![]);
    }

    #[test]
    fn a_lone_escape_at_the_end_of_a_read_waits() {
        let mut f = EscapeFilter::new(EscapeChar::default());
        assert_eq!(f.feed(b"ok\r~"), vec![data(b"ok\r")]);
        assert_eq!(f.feed(b"."), vec![Disconnect]);
    }

    #[test]
    fn other_escape_characters() {
        let ctrl = "^]".parse::<EscapeChar>().unwrap();
        assert_eq!(ctrl, EscapeChar::Char(0x1d));
        assert_eq!(run(ctrl, &[b"~.\x1d."]), vec![data(b"~.\x1d.")]);
        assert_eq!(run(ctrl, &[b"\r\x1d."]), vec![data(b"\r"), Disconnect]);
        assert_eq!(run(ctrl, &[b"\x1d\x1d"]), vec![data(b"\x1d")]);
        let none = "none".parse::<EscapeChar>().unwrap();
        assert_eq!(run(none, &[b"~.", b"~?"]), vec![data(b"~.~?")]);
    }

    #[test]
    fn parses_like_openssh() {
        assert_eq!("~".parse(), Ok(EscapeChar::Char(b'~')));
        assert_eq!("#".parse(), Ok(EscapeChar::Char(b'#')));
        assert_eq!("^A".parse(), Ok(EscapeChar::Char(1)));
        assert_eq!("^@".parse(), Ok(EscapeChar::Char(0)));
        assert_eq!("^a".parse(), Ok(EscapeChar::Char(1)));
        assert!("^?".parse::<EscapeChar>().is_err(), "below @");
        assert_eq!("none".parse(), Ok(EscapeChar::None));
        assert_eq!(
            "ab".parse::<EscapeChar>(),
            Err("Bad escape character 'ab'.".to_owned())
        );
        assert!("".parse::<EscapeChar>().is_err());
        assert!("^".parse::<EscapeChar>().is_ok(), "one byte is itself");
        assert_eq!(EscapeChar::Char(0x1d).to_string(), "^]");
        assert_eq!(EscapeChar::default().to_string(), "~");
    }
}

/// Properties of the escape state machine (issue 37): `PROPTEST_CASES=100000 cargo test -p
/// kubevm --lib ssh::escape::properties` for a long run.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// The events of `input` fed in the given chunk sizes, adjacent data merged.
    fn run(escape: EscapeChar, input: &[u8], chunks: &[usize]) -> Vec<EscapeEvent> {
        let mut filter = EscapeFilter::new(escape);
        let mut events: Vec<EscapeEvent> = Vec::new();
        let mut rest = input;
        let mut sizes = chunks.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap_or(&1)).clamp(1, rest.len());
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            for event in filter.feed(chunk) {
                match (events.last_mut(), event) {
                    (Some(EscapeEvent::Data(d)), EscapeEvent::Data(more)) => d.extend(more),
                    (_, event) => events.push(event),
                }
            }
        }
        events
    }

    /// Bytes rich in newlines, carriage returns and escape characters.
    fn keystrokes() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![
                3 => Just(b'~'),
                2 => Just(b'\n'),
                1 => Just(b'\r'),
                1 => Just(b'.'),
                1 => Just(b'?'),
                1 => Just(0x1a),
                4 => any::<u8>(),
            ],
            0..64,
        )
    }

    proptest! {
        /// How the input is split into reads changes nothing: an escape split across reads
        /// acts as one typed at once.
        #[test]
        fn reads_do_not_matter(input in keystrokes(), chunks in prop::collection::vec(1usize..8, 1..8)) {
            let whole = run(EscapeChar::default(), &input, &[input.len().max(1)]);
            prop_assert_eq!(run(EscapeChar::default(), &input, &chunks), whole);
        }

        /// Input without the escape character, or with escapes off, passes through unchanged.
        #[test]
        fn plain_input_passes_through(input in keystrokes(), chunks in prop::collection::vec(1usize..8, 1..4)) {
            let expected = if input.is_empty() { vec![] } else { vec![EscapeEvent::Data(input.clone())] };
            prop_assert_eq!(run(EscapeChar::None, &input, &chunks), expected.clone());
            let plain: Vec<u8> = input.iter().copied().filter(|&b| b != b'~').collect();
            let expected = if plain.is_empty() { vec![] } else { vec![EscapeEvent::Data(plain.clone())] };
            prop_assert_eq!(run(EscapeChar::default(), &plain, &chunks), expected);
        }

        /// ssh(1): "~~ sends the escape character". Any payload typed with each escape
        /// character at a line start doubled arrives exactly, with no command.
        #[test]
        fn doubled_escapes_send_the_payload(payload in keystrokes()) {
            let mut typed = Vec::new();
            let mut line_start = true;
            for &b in &payload {
                if line_start && b == b'~' {
                    typed.push(b'~');
                }
                typed.push(b);
                line_start = b == b'\n' || b == b'\r';
            }
            let expected = if payload.is_empty() { vec![] } else { vec![EscapeEvent::Data(payload.clone())] };
            prop_assert_eq!(run(EscapeChar::default(), &typed, &[3]), expected);
        }

        /// Nothing follows a disconnect, and data never holds a byte that was not typed.
        #[test]
        fn nothing_after_disconnect(input in keystrokes()) {
            let events = run(EscapeChar::default(), &input, &[5]);
            if let Some(at) = events.iter().position(|e| *e == EscapeEvent::Disconnect) {
                prop_assert_eq!(at, events.len() - 1);
            }
            let sent: usize = events.iter().map(|e| match e { EscapeEvent::Data(d) => d.len(), _ => 0 }).sum();
            prop_assert!(sent <= input.len());
        }

        /// `-e` takes what it shows: `^X` forms and printable characters parse back to
        /// themselves.
        #[test]
        fn shown_escape_characters_parse_back(b in 0u8..127) {
            let shown = EscapeChar::Char(b).to_string();
            prop_assert_eq!(shown.parse::<EscapeChar>(), Ok(EscapeChar::Char(b)));
        }
    }
}
