//! The part of Structured Field Values (RFC 9651) that the `RateLimit` and `RateLimit-Policy`
//! fields use: a List whose members are Items named by a String (or a Token, as in earlier drafts)
//! with Integer parameters.
//!
//! The whole grammar of a List is checked, so that a field `sfv` rejects is rejected here too
//! (`tests/pushback_headers.rs` compares the two on arbitrary input); values other than Integers
//! are checked and dropped. A field that fails to parse is ignored as a whole, as RFC 9651 asks.

/// A List member that is an Item: its name, if its value is a String or a Token, and its Integer
/// parameters (the last one wins when a key repeats).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) name: Option<String>,
    pub(crate) params: Vec<(String, Option<i64>)>,
}

impl Member {
    /// The Integer parameter `key`: `None` when it is absent or not an Integer.
    pub(crate) fn int(&self, key: &str) -> Option<i64> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| *v)
    }
}

/// A bare item, as far as this reader needs it.
enum Bare {
    Name(String),
    Integer(i64),
    Other,
}

/// Parses `input` as a List. Inner Lists are checked and left out of the result.
pub(crate) fn parse_list(input: &[u8]) -> Option<Vec<Member>> {
    let mut p = Parser { input, pos: 0 };
    p.skip_sp();
    let mut members = Vec::new();
    while !p.at_end() {
        if p.peek() == Some(b'(') {
            p.inner_list()?;
        } else {
            let name = match p.bare_item()? {
                Bare::Name(name) => Some(name),
                _ => None,
            };
            let params = p.params()?;
            members.push(Member { name, params });
        }
        p.skip_ows();
        if p.at_end() {
            return Some(members);
        }
        if p.next()? != b',' {
            return None;
        }
        p.skip_ows();
        if p.at_end() {
            // A trailing comma.
            return None;
        }
    }
    Some(members)
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn at_end(&self) -> bool {
        self.pos >= self.input.len()
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    fn inner_list(&mut self) -> Option<()> {
        if self.next()? != b'(' {
            return None;
        }
        loop {
            self.skip_sp();
            if self.peek()? == b')' {
                self.pos += 1;
                self.params()?;
                return Some(());
            }
            self.bare_item()?;
            self.params()?;
            match self.peek()? {
                b' ' | b')' => {}
                _ => return None,
            }
        }
    }

    fn params(&mut self) -> Option<Vec<(String, Option<i64>)>> {
        let mut params = Vec::new();
        while self.peek() == Some(b';') {
            self.pos += 1;
            self.skip_sp();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.pos += 1;
                match self.bare_item()? {
                    Bare::Integer(n) => Some(n),
                    _ => None,
                }
            } else {
                None
            };
            params.push((key, value));
        }
        Some(params)
    }

    fn key(&mut self) -> Option<String> {
        let start = self.pos;
        match self.next()? {
            b'a'..=b'z' | b'*' => {}
            _ => return None,
        }
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
        ) {
            self.pos += 1;
        }
        Some(String::from_utf8_lossy(&self.input[start..self.pos]).into_owned())
    }

    fn bare_item(&mut self) -> Option<Bare> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string().map(Bare::Name),
            b'A'..=b'Z' | b'a'..=b'z' | b'*' => Some(Bare::Name(self.token())),
            b':' => self.byte_sequence().map(|()| Bare::Other),
            b'?' => {
                self.pos += 1;
                match self.next()? {
                    b'0' | b'1' => Some(Bare::Other),
                    _ => None,
                }
            }
            b'@' => {
                self.pos += 1;
                match self.number()? {
                    Bare::Integer(_) => Some(Bare::Other),
                    _ => None,
                }
            }
            b'%' => self.display_string().map(|()| Bare::Other),
            _ => None,
        }
    }

    /// An Integer (at most 15 digits) or a Decimal (at most 12 digits, a point, 1 to 3 digits).
    fn number(&mut self) -> Option<Bare> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return None;
        }
        let start = self.pos;
        let mut point = None;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' => {}
                b'.' if point.is_none() => {
                    if self.pos - start > 12 {
                        return None;
                    }
                    point = Some(self.pos);
                }
                _ => break,
            }
            self.pos += 1;
            let len = self.pos - start;
            if (point.is_none() && len > 15) || len > 16 {
                return None;
            }
        }
        match point {
            None => {
                let digits = std::str::from_utf8(&self.input[start..self.pos]).ok()?;
                let n: i64 = digits.parse().ok()?;
                Some(Bare::Integer(if negative { -n } else { n }))
            }
            Some(point) => {
                let fraction = self.pos - point - 1;
                if fraction == 0 || fraction > 3 {
                    return None;
                }
                Some(Bare::Other)
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        if self.next()? != b'"' {
            return None;
        }
        let mut out = String::new();
        loop {
            match self.next()? {
                b'\\' => match self.next()? {
                    c @ (b'"' | b'\\') => out.push(char::from(c)),
                    _ => return None,
                },
                b'"' => return Some(out),
                c @ 0x20..=0x7e => out.push(char::from(c)),
                _ => return None,
            }
        }
    }

    fn token(&mut self) -> String {
        let start = self.pos;
        self.pos += 1;
        while let Some(c) = self.peek() {
            let tchar = c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c);
            if !tchar {
                break;
            }
            self.pos += 1;
        }
        String::from_utf8_lossy(&self.input[start..self.pos]).into_owned()
    }

    fn byte_sequence(&mut self) -> Option<()> {
        self.pos += 1;
        let start = self.pos;
        loop {
            match self.next()? {
                b':' => break,
                c if c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=') => {}
                _ => return None,
            }
        }
        // The base64 itself must decode; checked loosely: padding only at the end.
        let body = &self.input[start..self.pos - 1];
        let data = body.iter().position(|&c| c == b'=').unwrap_or(body.len());
        body[data..].iter().all(|&c| c == b'=').then_some(())
    }

    fn display_string(&mut self) -> Option<()> {
        self.pos += 1;
        if self.next()? != b'"' {
            return None;
        }
        let mut bytes = Vec::new();
        loop {
            match self.next()? {
                b'%' => {
                    let hi = hex_lower(self.next()?)?;
                    let lo = hex_lower(self.next()?)?;
                    bytes.push(hi << 4 | lo);
                }
                b'"' => return std::str::from_utf8(&bytes).ok().map(|_| ()),
                c @ 0x20..=0x7e => bytes.push(c),
                _ => return None,
            }
        }
    }
}

fn hex_lower(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_and_integer_parameters() {
        let list = parse_list(br#""day";r=10;t=3600, hour;r=0;t=60;x=?1, (1 2)"#).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].name.as_deref(), Some("day"));
        assert_eq!(list[0].int("r"), Some(10));
        assert_eq!(list[1].name.as_deref(), Some("hour"));
        assert_eq!(list[1].int("t"), Some(60));
        assert_eq!(list[1].int("x"), None);
    }

    #[test]
    fn rejects_what_rfc_9651_rejects() {
        for bad in [
            &b"\"a\";r=1,"[..],
            b"\"a\";r=1234567890123456",
            b"\"a\";R=1",
            b"\"a\";r=-",
            b"\"a",
            b"\"a\"\x01",
            b"1.2345",
            b"(1",
        ] {
            assert_eq!(parse_list(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// Each Item's name and its `r`, `t`, `q` and `w` parameters.
    type Read = Vec<(Option<String>, Vec<Option<i64>>)>;

    /// What `sfv` reads, or `None` when it rejects the field.
    fn by_sfv(input: &str) -> Option<Read> {
        let list: sfv::List = sfv::Parser::new(input).parse().ok()?;
        Some(
            list.into_iter()
                .filter_map(|entry| match entry {
                    sfv::ListEntry::Item(item) => {
                        let name = item
                            .bare_item
                            .as_string()
                            .map(|s| s.as_str().to_owned())
                            .or_else(|| item.bare_item.as_token().map(|t| t.as_str().to_owned()));
                        let ints = ["r", "t", "q", "w"]
                            .iter()
                            .map(|k| {
                                item.params
                                    .iter()
                                    .find(|(key, _)| key.as_str() == *k)
                                    .and_then(|(_, v)| v.as_integer())
                                    .map(i64::from)
                            })
                            .collect();
                        Some((name, ints))
                    }
                    sfv::ListEntry::InnerList(_) => None,
                })
                .collect(),
        )
    }

    fn by_us(input: &str) -> Option<Read> {
        Some(
            parse_list(input.as_bytes())?
                .into_iter()
                .map(|m| {
                    let ints = ["r", "t", "q", "w"].iter().map(|k| m.int(k)).collect();
                    (m.name, ints)
                })
                .collect(),
        )
    }

    fn fragment() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("\"default\"".to_owned()),
            Just("\"a\\\"b\"".to_owned()),
            Just("tok/x:1".to_owned()),
            Just(";r=".to_owned()),
            Just(";t=".to_owned()),
            Just(";q=".to_owned()),
            Just(";w=".to_owned()),
            Just(";x".to_owned()),
            Just(", ".to_owned()),
            Just(",".to_owned()),
            Just(" ".to_owned()),
            Just("\t".to_owned()),
            Just("(".to_owned()),
            Just(")".to_owned()),
            Just("?1".to_owned()),
            Just(":aGVsbG8=:".to_owned()),
            Just("@1700000000".to_owned()),
            Just("%\"caf%c3%a9\"".to_owned()),
            Just("-".to_owned()),
            Just(".".to_owned()),
            "[0-9]{1,17}",
            "[0-9]{1,13}\\.[0-9]{0,4}",
            "[ -~]{0,3}",
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]

        /// The reader accepts exactly the Lists `sfv` accepts, and reads the same names and
        /// integer parameters from them.
        #[test]
        fn agrees_with_sfv(parts in proptest::collection::vec(fragment(), 0..12)) {
            let input: String = parts.concat();
            proptest::prop_assert_eq!(by_us(&input), by_sfv(&input), "{:?}", input);
        }
    }
}
