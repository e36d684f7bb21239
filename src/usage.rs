//! Reading a request's cost (an LLM API's token count) from its response body, as the body
//! streams by, in a few bytes of state whatever the body holds: inbound for a policy that
//! settles from the body ([`Policy::settle_from_body`](crate::rate_limit::Policy::settle_from_body)),
//! outbound for a call settled once its body is read
//! ([`Unsettled`](crate::outbound::quota::Unsettled)); and the one rule for a user's function
//! that reads a cost, both ways.

use std::fmt;
use std::sync::Arc;

/// What `read`, a user's function reading a cost from an answer, returns; `None` (the cost asked
/// for stands) where it panics, with an `error` line naming the `limit` it settles. The one
/// rule for every settle function, inbound and outbound: a panic in it reaches no caller.
pub(crate) fn read_cost(limit: &str, read: impl FnOnce() -> Option<u32>) -> Option<u32> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|_| {
        tracing::error!(
            limit,
            "the settle function panicked; the cost asked for stands"
        );
        None
    })
}

/// At most this many keys in a path.
const MAX_KEYS: usize = 8;
/// At most this many bytes in a key (so a key's progress fits a `u8`).
const MAX_KEY_LEN: usize = 64;
/// Containers nested deeper than this stop the scan: one bit each in `Json::arrays`.
const MAX_DEPTH: u8 = 64;

/// Where in a response body the cost of a request is read, as the body streams by.
///
/// One path reads both shapes of an answer: where the crate reads a response itself (a policy's
/// [`settle_from_body`](crate::rate_limit::Policy::settle_from_body)), a `Content-Type` of
/// `text/event-stream` is read as events ([`sse`](Self::sse)) and a JSON one
/// (`application/json`, or any `+json`) as one document ([`json`](Self::json)), whichever of
/// the two made the `BodyUsage`: that constructor names the shape of answers whose type says
/// neither. So one policy settles a route that answers `"stream": true` with events and the
/// rest with JSON. [`scan`](Self::scan) reads the constructor's shape. A body in a content
/// coding (a `Content-Encoding` other than `identity`: gzip, br, ...) is not read, its usage
/// unseen, so the estimate stands (and an error answer costs nothing): place the rate limit
/// inside any compression layer, and let an outbound client decompress (reqwest's `gzip`
/// feature does, and drops the header). Keys are matched as written, byte for byte: a key
/// written with an escape (`"tot\u0061l_tokens"`, or `"a\/b"`) never matches; and a JSON body
/// is read from its first byte, so one that starts with a byte order mark is not read (an
/// event stream may start with one).
///
/// The body is never held: whatever its size and however it is split into chunks, reading it
/// takes a few dozen bytes of state, and a long string in it (a prompt echoed back) costs
/// nothing but the time to skip it.
#[derive(Clone, Debug)]
pub struct BodyUsage {
    path: Arc<[Box<str>]>,
    sse: bool,
}

impl BodyUsage {
    /// A JSON body: the non-negative integer at `path` (object keys from the top), e.g.
    /// `BodyUsage::json(["usage", "total_tokens"])` for OpenAI's chat completions.
    ///
    /// Only a plain integer literal counts (`12`, not `-1`, `1.5`, `1e3` or `"12"`), reached
    /// through objects alone (an array on the way means no value), and the first one found wins.
    /// A body that stops being JSON is read no further, and what was found before it is kept.
    ///
    /// # Errors
    ///
    /// [`UsagePathError`] for an empty path, one of more than 8 keys, or a key that is empty or
    /// longer than 64 bytes.
    pub fn json<I, S>(path: I) -> Result<Self, UsagePathError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        check(path).map(|path| Self { path, sse: false })
    }

    /// A server-sent-event stream (`text/event-stream`): each event's `data:` is read as a JSON
    /// document as [`json`](Self::json) reads a body, and the value at `path` in the last event
    /// that has one wins (OpenAI's streams put `usage` in the final chunk, before
    /// `data: [DONE]`). Other fields, comments and data that is not JSON change nothing.
    ///
    /// # Errors
    ///
    /// [`UsagePathError`] for a path that [`json`](Self::json) refuses.
    pub fn sse<I, S>(path: I) -> Result<Self, UsagePathError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        check(path).map(|path| Self { path, sse: true })
    }

    /// A reader for one response body, in the shape its constructor names.
    pub fn scan(&self) -> UsageScan {
        self.scan_as(self.sse)
    }

    /// The crate's reader for the body of an answer of `status` with these `headers`: in the
    /// shape its `Content-Type` names, else in the constructor's (see [`BodyUsage`]).
    pub(crate) fn scan_answer(
        &self,
        status: http::StatusCode,
        headers: &http::HeaderMap,
    ) -> AnswerScan {
        let essence = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()?.split(';').next())
            .map(str::trim)
            .unwrap_or_default();
        let is = |name: &str| essence.eq_ignore_ascii_case(name);
        // A structured syntax suffix (RFC 6839) after a type of at least one byte.
        let suffix = essence.len().saturating_sub(5);
        let json = is("application/json")
            || (suffix > 0 && essence.as_bytes()[suffix..].eq_ignore_ascii_case(b"+json"));
        // A body in a content coding (gzip, br, ...) holds no JSON to read: it is not read, and
        // what it cost is what an answer that reports no usage cost.
        let encoded = (headers.get(http::header::CONTENT_ENCODING))
            .is_some_and(|coding| !coding.as_bytes().eq_ignore_ascii_case(b"identity"));
        let sse = is("text/event-stream") || (self.sse && !json);
        // An error answer (a refusal, or a failure before the work was done) used nothing,
        // unless its body says otherwise.
        let error = status.is_client_error() || status.is_server_error();
        AnswerScan {
            scan: (!encoded).then(|| self.scan_as(sse)),
            unsaid: error.then_some(0),
        }
    }

    fn scan_as(&self, sse: bool) -> UsageScan {
        UsageScan {
            path: Arc::clone(&self.path),
            json: Json::default(),
            sse: sse.then(Sse::default),
        }
    }
}

/// The crate's reading of one answer's body, inbound ([`Policy::settle_from_body`](
/// crate::rate_limit::Policy::settle_from_body)) and outbound (a client quota settled by a
/// [`BodyUsage`]): the one rule of what an answer cost.
#[derive(Debug)]
pub(crate) struct AnswerScan {
    /// The body's reader; none for a body in a content coding.
    scan: Option<UsageScan>,
    /// The cost of an answer whose body reports none: zero for an error answer, else none.
    unsaid: Option<u32>,
}

impl AnswerScan {
    /// Reads the next bytes of the body.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        if let Some(scan) = &mut self.scan {
            scan.feed(bytes);
        }
    }

    /// What the answer cost as far as it was read: the usage found (at most `u32::MAX`), else
    /// zero for an error answer, else `None` (the estimate stands).
    pub(crate) fn cost(&self) -> Option<u32> {
        let found = (self.scan.as_ref())
            .and_then(UsageScan::found)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        found.or(self.unsaid)
    }
}

fn check(
    path: impl IntoIterator<Item = impl AsRef<str>>,
) -> Result<Arc<[Box<str>]>, UsagePathError> {
    let keys: Vec<Box<str>> = path
        .into_iter()
        .take(MAX_KEYS + 1)
        .map(|k| k.as_ref().into())
        .collect();
    let (key, why) = match keys
        .iter()
        .position(|k| k.is_empty() || k.len() > MAX_KEY_LEN)
    {
        _ if keys.is_empty() => (None, "has no key"),
        _ if keys.len() > MAX_KEYS => (None, "has more than 8 keys"),
        Some(i) if keys[i].is_empty() => (Some(i), "is empty"),
        Some(i) => (Some(i), "is longer than 64 bytes"),
        None => return Ok(keys.into()),
    };
    Err(UsagePathError { key, why })
}

/// Why a usage path was refused: it is empty, has more than 8 keys, or has a key that is empty
/// or longer than 64 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsagePathError {
    /// The index of the key at fault, if one is.
    key: Option<usize>,
    why: &'static str,
}

impl fmt::Display for UsagePathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.key {
            Some(i) => write!(f, "invalid usage path: key {} {}", i + 1, self.why),
            None => write!(f, "invalid usage path: it {}", self.why),
        }
    }
}

impl std::error::Error for UsagePathError {}

/// The reading of one response body ([`BodyUsage::scan`]): feed it the body's chunks as they
/// come, then ask what it found. It holds a few dozen bytes whatever the body: a layer of your
/// own (an outbound body, say) can read a cost as the body streams by, as the rate-limit layer
/// does.
#[derive(Debug)]
pub struct UsageScan {
    path: Arc<[Box<str>]>,
    /// The JSON body, or the event stream's current document.
    json: Json,
    /// For an event stream: its lines, and the value of the last document that had one.
    sse: Option<Sse>,
}

impl UsageScan {
    /// Reads the next chunk of the body; any split of a body gives the same answer.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            match &mut self.sse {
                Some(sse) => sse.push(&mut self.json, &self.path, b),
                None if self.json.found.is_some() || self.json.expect == Expect::Done => return,
                None => self.json.push(&self.path, b),
            }
        }
    }

    /// The value found so far: a JSON body's first, or the latest event's that had one.
    pub fn found(&self) -> Option<u64> {
        self.json.found.or(self.sse.as_ref().and_then(|s| s.last))
    }
}

/// What a line of an event stream may start with: a byte order mark (only the stream's first
/// line), then the field name `data` and its colon.
const PREFIX: &[u8; 8] = b"\xEF\xBB\xBFdata:";
/// `Sse::line` in a `data:` line, after the colon. (The one space the format strips there is
/// whitespace to JSON anyway.)
const DATA: u8 = 8;
/// `Sse::line` in any other line: a comment, another field, a blank line's end.
const SKIP: u8 = 9;

/// An event stream's lines, decided byte by byte without holding a line.
#[derive(Debug, Default)]
struct Sse {
    /// Below `DATA`, how many bytes of `PREFIX` the line matched: the stream starts at 0, any
    /// other line at 3.
    line: u8,
    /// The last byte was a `\r`: a `\n` right after it ends no second line.
    cr: bool,
    last: Option<u64>,
}

impl Sse {
    fn push(&mut self, json: &mut Json, path: &[Box<str>], b: u8) {
        if std::mem::take(&mut self.cr) && b == b'\n' {
            return;
        }
        if b == b'\n' || b == b'\r' {
            self.cr = b == b'\r';
            match self.line {
                // A blank line ends the event, and with it its document.
                0 | 3 => self.restart(json),
                // The event's data lines are joined by `\n`, which JSON reads as a space.
                DATA => json.push(path, b'\n'),
                _ => {}
            }
            self.line = 3;
            return;
        }
        if self.line == 0 && b != PREFIX[0] {
            self.line = 3;
        }
        self.line = match self.line {
            7 if b == b':' => {
                // A data line continues the event's document while it is open (a document
                // across several data lines), and starts a new one otherwise.
                if json.depth == 0 {
                    self.restart(json);
                }
                DATA
            }
            n @ 0..=6 if PREFIX[usize::from(n)] == b => n + 1,
            DATA => {
                json.push(path, b);
                DATA
            }
            _ => SKIP,
        };
    }

    fn restart(&mut self, json: &mut Json) {
        self.last = json.found.or(self.last);
        *json = Json::default();
    }
}

/// What the JSON tokenizer expects next, outside a token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Expect {
    #[default]
    Value,
    /// Just after `[`.
    ValueOrClose,
    /// Just after `{`.
    KeyOrClose,
    Key,
    Colon,
    CommaOrClose,
    /// The top-level value is complete, or the document stopped being JSON or nests too deep:
    /// what follows is ignored.
    Done,
}

/// The token being read.
#[derive(Clone, Copy, Debug, Default)]
enum Lex {
    #[default]
    None,
    /// A string: how many bytes of the path's next key it matched, while it may be that key;
    /// and its escape: 5 just after a backslash, 1 to 4 the hex digits of a `\u` still to come.
    Str(Option<u8>, u8),
    /// A number: where in its grammar (see [`number`]), and its value while it may still be the
    /// value looked for.
    Num(u8, Option<u64>),
    /// What is left of `true`, `false` or `null`.
    Word(&'static [u8]),
}

/// A number's grammar (RFC 8259): where it is after `b`, coming from `at`, or `None` if `b`
/// is not part of it. 0 is the start, 1 after `-`, 2 a leading `0`, 3 in the integer part, 4
/// just after `.`, 5 in the fraction, 6 just after `e`, 7 after its sign, 8 in the exponent.
fn number(at: u8, b: u8) -> Option<u8> {
    Some(match (at, b) {
        (0, b'-') => 1,
        (0 | 1, b'0') => 2,
        (0 | 1, b'1'..=b'9') | (3, b'0'..=b'9') => 3,
        (2 | 3, b'.') => 4,
        (4 | 5, b'0'..=b'9') => 5,
        (2 | 3 | 5, b'e' | b'E') => 6,
        (6, b'+' | b'-') => 7,
        (6..=8, b'0'..=b'9') => 8,
        _ => return None,
    })
}

// A small tokenizer of its own, not a JSON crate's: the push parsers (actson) hand each string
// over whole, so they buffer it, where this one skips strings byte by byte in constant memory.
/// A JSON document read one byte at a time, watching for the value at a path.
#[derive(Clone, Copy, Debug, Default)]
struct Json {
    expect: Expect,
    lex: Lex,
    /// The open containers; bit `d` of `arrays` says whether the one at depth `d + 1` is an array.
    depth: u8,
    arrays: u64,
    /// How many of the path's keys the open objects matched: the object at depth `matched + 1`
    /// is the one whose key `path[matched]` is looked for. Always below the path's length.
    matched: u8,
    /// The value about to be read is that of the key `path[matched]`.
    on_key: bool,
    found: Option<u64>,
}

impl Json {
    fn push(&mut self, path: &[Box<str>], b: u8) {
        self.lex = match self.lex {
            Lex::None | Lex::Word([]) => return self.structural(path, b),
            Lex::Str(key, esc) => return self.string(path, key, esc, b),
            Lex::Word([next, rest @ ..]) if *next == b => Lex::Word(rest),
            Lex::Word(_) => return self.fail(),
            Lex::Num(at, value) => match number(at, b) {
                Some(at) => {
                    let digit = u64::from(b.wrapping_sub(b'0'));
                    let value = value.filter(|_| matches!(at, 2 | 3));
                    Lex::Num(
                        at,
                        value.and_then(|v| v.checked_mul(10)?.checked_add(digit)),
                    )
                }
                None if !matches!(at, 2 | 3 | 5 | 8) => return self.fail(),
                None => {
                    // The number ends at a delimiter: whitespace, a comma, or the brace that
                    // closes its object, as in `{"n": 1}` (`012` is no 0 followed by junk).
                    let delimiter = matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b',' | b'}');
                    self.found = self.found.or(value.filter(|_| delimiter));
                    return self.structural(path, b);
                }
            },
        };
    }

    /// `b` outside a token.
    fn structural(&mut self, path: &[Box<str>], b: u8) {
        self.lex = Lex::None;
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return;
        }
        let on_key = std::mem::take(&mut self.on_key);
        let last = usize::from(self.matched) + 1 == path.len();
        let value = matches!(self.expect, Expect::Value | Expect::ValueOrClose);
        match (self.expect, b) {
            (Expect::Done, _) => {}
            (_, b'{') if value => self.begin(Expect::KeyOrClose, on_key && !last),
            (_, b'[') if value => self.begin(Expect::ValueOrClose, false),
            (_, b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') if value => {
                self.lex = match b {
                    b'"' => Lex::Str(None, 0),
                    b't' => Lex::Word(b"rue"),
                    b'f' => Lex::Word(b"alse"),
                    b'n' => Lex::Word(b"ull"),
                    _ => Lex::Num(0, (on_key && last).then_some(0)),
                };
                self.after_value();
                if let Lex::Num(..) = self.lex {
                    self.push(path, b);
                }
            }
            (Expect::ValueOrClose, b']') | (Expect::KeyOrClose, b'}') => self.end(),
            (Expect::Key | Expect::KeyOrClose, b'"') => {
                let looked_for = self.found.is_none() && self.depth == self.matched + 1;
                self.lex = Lex::Str(looked_for.then_some(0), 0);
                self.expect = Expect::Colon;
            }
            (Expect::Colon, b':') => {
                self.on_key = on_key;
                self.expect = Expect::Value;
            }
            (Expect::CommaOrClose, b',') if self.in_array() => self.expect = Expect::Value,
            (Expect::CommaOrClose, b',') => self.expect = Expect::Key,
            (Expect::CommaOrClose, b']') if self.in_array() => self.end(),
            (Expect::CommaOrClose, b'}') if !self.in_array() => self.end(),
            _ => self.fail(),
        }
    }

    fn string(&mut self, path: &[Box<str>], key: Option<u8>, esc: u8, b: u8) {
        let wanted = path[usize::from(self.matched)].as_bytes();
        let (key, esc) = match (esc, b) {
            (0, b'"') => {
                self.lex = Lex::None;
                self.on_key = key.is_some_and(|n| usize::from(n) == wanted.len());
                return;
            }
            // A key with an escape never matches.
            (0, b'\\') => (None, 5),
            (0, 0..=0x1f) => return self.fail(),
            (0, _) => (
                key.filter(|&n| wanted.get(usize::from(n)) == Some(&b))
                    .map(|n| n + 1),
                0,
            ),
            (5, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => (None, 0),
            (5, b'u') => (None, 4),
            (1..=4, _) if b.is_ascii_hexdigit() => (None, esc - 1),
            _ => return self.fail(),
        };
        self.lex = Lex::Str(key, esc);
    }

    /// Opens a container; `on_path` when it is the object at the path's next key.
    fn begin(&mut self, next: Expect, on_path: bool) {
        if self.depth == MAX_DEPTH {
            return self.fail();
        }
        let array = u64::from(next == Expect::ValueOrClose);
        self.arrays = (self.arrays & !(1 << self.depth)) | (array << self.depth);
        self.depth += 1;
        self.matched += u8::from(on_path);
        self.expect = next;
    }

    fn end(&mut self) {
        if self.matched > 0 && self.depth == self.matched + 1 {
            self.matched -= 1;
        }
        self.depth -= 1;
        self.after_value();
    }

    fn in_array(&self) -> bool {
        self.depth > 0 && self.arrays >> (self.depth - 1) & 1 == 1
    }

    fn after_value(&mut self) {
        self.expect = if self.depth == 0 {
            Expect::Done
        } else {
            Expect::CommaOrClose
        };
    }

    fn fail(&mut self) {
        self.expect = Expect::Done;
        self.lex = Lex::None;
        self.depth = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};

    /// The shape an answer with `content_type` is read in, by a `BodyUsage` made by `sse` or
    /// `json`: whether an event stream's usage is found.
    fn reads_events(content_type: Option<&[u8]>, sse: bool) -> bool {
        let path = ["usage", "total_tokens"];
        let usage = if sse {
            BodyUsage::sse(path)
        } else {
            BodyUsage::json(path)
        }
        .unwrap();
        let mut headers = HeaderMap::new();
        if let Some(value) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_bytes(value).unwrap());
        }
        let mut scan = usage.scan_answer(http::StatusCode::OK, &headers);
        scan.feed(b"data: {\"usage\":{\"total_tokens\":7}}\n\ndata: [DONE]\n\n");
        scan.cost() == Some(7)
    }

    #[test]
    fn the_content_type_names_the_shape_and_the_constructor_the_rest() {
        for sse in [false, true] {
            for events in [
                &b"text/event-stream"[..],
                b"TEXT/Event-Stream ; charset=utf-8",
            ] {
                assert!(reads_events(Some(events), sse), "{sse} {events:?}");
            }
            for json in [
                &b"application/json"[..],
                b"application/problem+json",
                b"x/y+JSON;q",
            ] {
                assert!(!reads_events(Some(json), sse), "{sse} {json:?}");
            }
            // Neither, unreadable or absent: the constructor's shape.
            for other in [
                &b""[..],
                b"+json",
                b"json",
                b"text/event-streams",
                b"\xff\xfe+json",
            ] {
                assert_eq!(reads_events(Some(other), sse), sse, "{sse} {other:?}");
            }
            assert_eq!(reads_events(None, sse), sse);
        }
    }

    proptest::proptest! {
        /// Any bytes a header may carry as a `Content-Type` pick one of the two shapes, without
        /// a panic: events exactly when the type is `text/event-stream`.
        #[test]
        fn any_content_type_picks_a_shape_without_a_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            sse: bool,
        ) {
            let Ok(value) = HeaderValue::from_bytes(&bytes) else {
                return Ok(());
            };
            let events = value.to_str().ok().and_then(|v| v.split(';').next()).map(str::trim);
            let is_events = events.is_some_and(|e| e.eq_ignore_ascii_case("text/event-stream"));
            let read = reads_events(Some(&bytes), sse);
            if is_events {
                proptest::prop_assert!(read);
            }
            if read && !sse {
                proptest::prop_assert!(is_events);
            }
        }
    }
}
