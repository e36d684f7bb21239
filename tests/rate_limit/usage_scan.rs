//! The reader of a cost in a response body ([`BodyUsage`]): JSON bodies and event streams,
//! quoted from the owners' docs, fed whole and byte by byte, against hostile bytes, deep
//! nesting, huge strings, and against serde_json.

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use tower_bulwark::usage::{BodyUsage, UsageScan};

const TOTAL: [&str; 2] = ["usage", "total_tokens"];

/// Feeds `body` whole and one byte at a time, and checks that both find the same.
fn scan(usage: &BodyUsage, body: &[u8]) -> Option<u64> {
    let (mut whole, mut bytes) = (usage.scan(), usage.scan());
    whole.feed(body);
    body.chunks(1).for_each(|b| bytes.feed(b));
    let text = String::from_utf8_lossy(body);
    assert_eq!(whole.found(), bytes.found(), "{text:?}");
    whole.found()
}

fn json(body: &str) -> Option<u64> {
    scan(&BodyUsage::json(TOTAL).unwrap(), body.as_bytes())
}

fn sse(body: &str) -> Option<u64> {
    scan(&BodyUsage::sse(TOTAL).unwrap(), body.as_bytes())
}

const CHAT: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;

/// OpenAI's streamed chat completion with `stream_options: {"include_usage": true}`.
const STREAM: &str = concat!(
    r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#,
    "\n\ndata: [DONE]\n\n",
);

#[test]
fn openai() {
    assert_eq!(json(CHAT), Some(21));
    assert_eq!(sse(STREAM), Some(21));
    assert_eq!(sse(&STREAM.replace('\n', "\r\n")), Some(21));
    assert_eq!(sse(&STREAM.replace('\n', "\r")), Some(21));
    let prompt = BodyUsage::json(["usage", "prompt_tokens"]).unwrap();
    assert_eq!(scan(&prompt, CHAT.as_bytes()), Some(9));
    assert_eq!((sse(CHAT), json(STREAM)), (None, None));
}

/// A case a line: what is found (`-`: nothing); `j`, a JSON body, or `s`, an event stream,
/// with `:` and the path when it is not `usage.total_tokens`; the body, where `⏎` stands for
/// `\n`, `␍` for `\r` and `⌂` for a byte order mark.
const CASES: &str = r#"
- j {"usage":[{"total_tokens":5}]}
- j [{"usage":{"total_tokens":5}}]
- j {"total_tokens":9,"x":{"usage":{"total_tokens":3}}}
- j {"x":{"usage":{"total_tokens":3}},"total_tokens":4}
- j {"usage":{"x":{"total_tokens":3}}}
- j {"usage":"{\"total_tokens\":1}","prompt":"\"usage\":{\"total_tokens\":1}"}
- j {"us\u0061ge":{"total_tokens":5}}
- j {"usage":{"total_tokens\u0000":5}}
- j {"usage":{"total_token":5,"total_tokens_":6,"Total_tokens":7}}
- j {"usage":{"total_tokens":null},"x":[1,{"total_tokens":2}]}
- j "usage"
4 j {"x":{"usage":{"total_tokens":3}},"usage":{"total_tokens":4}}
8 j {"a":[{"b":{}}],"usage":{"x":{"total_tokens":1},"y":[],"total_tokens":8}}
7 j {"usage":{"total_tokens":7},"usage":{"total_tokens":8}}
8 j {"usage":null,"usage":{"total_tokens":8}}
6 j {"k\"\\\/\b\f\n\r\t\uABcd":"v\"}\\","usage":{"total_tokens":6}}
6 j {"é🦀":"ü","usage":{"total_tokens":6}}
5 j  	␍⏎{ "usage" :⏎{"total_tokens"	:␍5 } }
42 j:a.b.c.d.e.f.g.h {"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":42}}}}}}}}
1 j:n {"n":1}
5 j {"usage":{"total_tokens":5}} trailing {"usage":{"total_tokens":6}}
- j {"a":1} {"usage":{"total_tokens":6}}
- j {"a":1,,"usage":{"total_tokens":6}}
- j {"a":tru,"usage":{"total_tokens":6}}
- j {"a":"\x","usage":{"total_tokens":6}}
- j {"a":"\u12G4","usage":{"total_tokens":6}}
- j {"a":"⏎","usage":{"total_tokens":6}}
- j {"a":[1}],"usage":{"total_tokens":6}}
- j {"a":[1},"usage":{"total_tokens":6}}
- j {"a":{"b":1],"usage":{"total_tokens":6}}
- j {"a":[},"usage":{"total_tokens":6}}
- j {"a":{],"usage":{"total_tokens":6}}
- j {"a" 1,"usage":{"total_tokens":6}}
- j {"usage":{"total_tokens":12x
12 j {"usage":{"total_tokens":12 x
- j {"usage":{"total_tokens":12
12 j {"usage":{"total_tokens":12}
- j }{"usage":{"total_tokens":12}}
7 s data: {"usage":{"total_tokens":5}}⏎⏎data: {"usage":{"total_tokens":7}}⏎⏎
5 s data: {"usage":{"total_tokens":5}}⏎⏎data: {"usage":null}⏎⏎data: [DONE]⏎⏎
7 s data: {"usage":{"total_tokens":5}}⏎data: {"usage":{"total_tokens":7}}⏎
7 s data: {"usage":{"total_tokens":5}}␍⏎␍⏎data: {"usage":{"total_tokens":7}}␍␍
5 s data: {"usage":{"total_tokens":5}}
- s : comment⏎event: usage⏎id: 1⏎retry: 10⏎⏎
- s : data: {"usage":{"total_tokens":1}}⏎⏎
- s event: {"usage":{"total_tokens":1}}⏎id: {"usage":{"total_tokens":1}}⏎
- s  data: {"usage":{"total_tokens":1}}
- s Data: {"usage":{"total_tokens":1}}
- s data : {"usage":{"total_tokens":1}}
- s datas: {"usage":{"total_tokens":1}}
- s data⏎{"usage":{"total_tokens":1}}⏎
1 s data:{"usage":{"total_tokens":1}}
1 s data:   {"usage":{"total_tokens":1}}
1 s ⌂data: {"usage":{"total_tokens":1}}
- s ⌂⌂data: {"usage":{"total_tokens":1}}
1 s ⏎⏎␍⏎␍data: {"usage":{"total_tokens":1}}
4 s data: {"usage":⏎data: {"total_tokens":⏎data: 4}}⏎⏎
- s data: {"usage":⏎⏎data: {"total_tokens":4}}⏎⏎
4 s data: {"usage":{"total_tokens":4␍⏎: comment␍⏎id: 2␍⏎data: }}␍⏎␍⏎
- s data: {"usage":{"total_tokens":"4⏎data: "}}⏎⏎
- s data: {"a":"x⏎data:","usage":{"total_tokens":1}}⏎⏎
4 s data: {"usage":{"total_tokens":4⏎data:}}⏎⏎
3 s data: {"usage":{"total_tokens":3}}⏎data: {"usage":{"total_tokens":-1}}⏎data: 9⏎
2 s data: {"a":"\"usage\":{\"total_tokens\":1}"}⏎⏎data: {"usage":{"total_tokens":2}}⏎
15 s:usage.output_tokens event: message_start⏎data: {"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}⏎⏎event: message_delta⏎data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}⏎⏎event: message_stop⏎data: {"type":"message_stop"}⏎⏎
"#;

#[test]
fn cases() {
    for case in CASES.lines().filter(|line| !line.is_empty()) {
        let [want, mode, body] =
            <[&str; 3]>::try_from(case.splitn(3, ' ').collect::<Vec<_>>()).unwrap();
        let (mode, path) = mode.split_once(':').unwrap_or((mode, "usage.total_tokens"));
        let new = if mode == "j" {
            BodyUsage::json
        } else {
            BodyUsage::sse
        };
        let body = body
            .replace('⏎', "\n")
            .replace('␍', "\r")
            .replace('⌂', "\u{feff}");
        let found = scan(&new(path.split('.')).unwrap(), body.as_bytes());
        assert_eq!(found, want.parse().ok(), "{case}");
    }
}

#[test]
fn numbers() {
    let numbers = "0=0 12=12 18446744073709551615=18446744073709551615 -1 -0 1.5 1e3 1E+3 2.0 0e1 1.5e-3 \
                   \"12\" 18446744073709551616 99999999999999999999999 true null [12] {\"n\":12} 012 1. - 1e 1e+";
    for case in numbers.split(' ') {
        let (number, want) = case.split_once('=').unwrap_or((case, "-"));
        for body in [
            r#"{"usage":{"total_tokens":N}}"#,
            r#"{"usage":{"total_tokens" : N ,"x":1}}"#,
        ] {
            assert_eq!(
                json(&body.replace('N', number)),
                want.parse().ok(),
                "{case}"
            );
        }
    }
}

#[test]
fn deep_nesting() {
    let (open, close) = ("[".repeat(10_000), "]".repeat(10_000));
    for open in [
        &open,
        &"{\"a\":".repeat(10_000),
        &"{\"usage\":".repeat(10_000),
    ] {
        assert_eq!(json(&format!("{open}1{close}")), None);
        assert_eq!(sse(&format!("data: {open}\n\ndata: {CHAT}\n\n")), Some(21));
    }
    // The top-level object and 63 arrays are 64 levels: the most there may be.
    let nested = |n| {
        r#"{"x":O"usage":{"total_tokens":5}}"#
            .replace('O', &format!("{}{},", &open[..n], &close[..n]))
    };
    assert_eq!((json(&nested(63)), json(&nested(64))), (Some(5), None));
    assert_eq!(
        json(&format!(r#"{{"usage":{{"total_tokens":3}},"x":{open}"#)),
        Some(3)
    );
}

#[test]
fn a_long_string_costs_nothing() {
    assert!(size_of::<UsageScan>() <= 96, "{}", size_of::<UsageScan>());
    let mut scan = BodyUsage::json(TOTAL).unwrap().scan();
    scan.feed(br#"{"messages":[{"content":""#);
    let piece = r#"\"usage\":{\"total_tokens\":1} \\ ü "#;
    let prompt = piece.repeat((10 << 20) / piece.len()).into_bytes();
    prompt.chunks(8192).for_each(|chunk| scan.feed(chunk));
    scan.feed(br#""}],"usage":{"total_tokens":77}}"#);
    assert_eq!(scan.found(), Some(77));
}

#[test]
fn crlf_split_across_chunks() {
    let usage = BodyUsage::sse(TOTAL).unwrap();
    let feed = |chunks: &str| {
        let mut scan = usage.scan();
        chunks
            .split('|')
            .for_each(|chunk| scan.feed(chunk.as_bytes()));
        scan.found()
    };
    let event = "data: {\"usage\":{\"total_tokens\":|1}}\r|\n|\r|\ndata: {\"usage\":{\"total_tokens\":2}}\r";
    assert_eq!(feed(event), Some(2));
    // `\r` then `\n` ends one line: the `\n` ends no blank line, so no event.
    assert_eq!(
        feed("data: {\"usage\":\r|\ndata: {\"total_tokens\":3}}"),
        Some(3)
    );
    assert_eq!(
        feed("data: {\"usage\":\r|\r|\ndata: {\"total_tokens\":3}}"),
        None
    );
}

#[test]
fn path_errors() {
    let long = "k".repeat(65);
    for (path, message) in [
        (vec![], "it has no key"),
        (vec!["a"; 9], "it has more than 8 keys"),
        (vec!["usage", ""], "key 2 is empty"),
        (vec![long.as_str()], "key 1 is longer than 64 bytes"),
    ] {
        let message = format!("invalid usage path: {message}");
        assert_eq!(BodyUsage::json(&path).unwrap_err().to_string(), message);
        assert_eq!(BodyUsage::sse(&path).unwrap_err().to_string(), message);
    }
    assert!(BodyUsage::json(std::iter::repeat("a")).is_err());
    assert!(BodyUsage::json(["a"; 8]).is_ok() && BodyUsage::json(["é".repeat(32)]).is_ok());
    fn send_static<T: Send + 'static>(_: T) {}
    send_static(BodyUsage::json(TOTAL).unwrap().scan());
}

fn text() -> BoxedStrategy<String> {
    let odd = r#"[\x00-\x1f"\\/a-z{}:,é🦀\u{2028}]{0,16}"#;
    let echo = Just(r#""usage":{"total_tokens":1}"#.to_string());
    prop_oneof![any::<String>(), odd, echo].boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![Just("usage".into()), Just("total_tokens".into()), text()].boxed()
}

fn object(fields: Vec<(String, Value)>, key: &str, value: Option<Value>) -> Value {
    let mut map: Map<String, Value> = fields.into_iter().collect();
    map.extend(value.map(|v| (key.to_string(), v)));
    Value::Object(map)
}

fn value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        text().prop_map(Value::String),
    ];
    let fields = |inner| vec((key(), inner), 0..6).prop_map(|fields| object(fields, "", None));
    let array = |inner| vec(inner, 0..6).prop_map(Value::Array);
    leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![array(inner.clone()), fields(inner)]
    })
    .boxed()
}

/// A document that often has a value at the path, or nearly: an object with `usage`, often
/// an object with `total_tokens`, mostly an integer.
fn doc() -> impl Strategy<Value = Value> {
    let total = prop_oneof![3 => any::<u64>().prop_map(Value::from), 1 => value()];
    let usage = (
        vec((key(), value()), 0..4),
        prop::option::weighted(0.8, total),
    );
    let usage = usage.prop_map(|(fields, total)| object(fields, "total_tokens", total));
    let top = (
        vec((key(), value()), 0..4),
        prop::option::weighted(0.8, prop_oneof![3 => usage, 1 => value()]),
    );
    prop_oneof![3 => top.prop_map(|(fields, usage)| object(fields, "usage", usage)), 1 => value()]
}

/// What `BodyUsage::json(TOTAL)` must find in `value`, by serde_json.
fn oracle(value: &Value) -> Option<u64> {
    let usage = value.as_object()?.get("usage")?;
    usage.as_object()?.get("total_tokens")?.as_u64()
}

fn to_text(value: &Value, pretty: bool) -> String {
    let write = [serde_json::to_string, serde_json::to_string_pretty][usize::from(pretty)];
    write(value).unwrap()
}

/// An event stream of documents (a pretty one on several data lines), with other lines and
/// line ends of all three kinds, and what it must find.
fn stream() -> impl Strategy<Value = (String, Option<u64>)> {
    let end = prop::sample::select(vec!["\n", "\r\n", "\r"]);
    let other = prop::sample::select(
        ": ping|event: x|id: 3|retry: 9|data: [DONE]|"
            .split('|')
            .collect::<Vec<_>>(),
    );
    vec((doc(), any::<bool>(), end, other), 0..5).prop_map(|events| {
        let (mut body, mut last) = (String::new(), None);
        for (value, pretty, end, other) in events {
            let lines = to_text(&value, pretty).replace('\n', &format!("{end}data: "));
            body += &format!("data: {lines}{end}{end}{other}{end}");
            last = oracle(&value).or(last);
        }
        (body, last)
    })
}

/// Bodies to split: JSON, event streams, near-JSON from pieces, and any bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let pieces = "{|}|[|]|:|,| |\"usage\"|\"total_tokens\"|\"x\"|\"\\\"\"|\"\\u00e9\"|12|-3|1.5e3|0|true|null\
                  |data: |data:|: c|\n|\r|\r\n|\u{feff}";
    prop_oneof![
        (doc(), any::<bool>()).prop_map(|(v, pretty)| to_text(&v, pretty).into_bytes()),
        stream().prop_map(|(body, _)| body.into_bytes()),
        vec(
            prop::sample::select(pieces.split('|').collect::<Vec<_>>()),
            0..64
        )
        .prop_map(|p| p.concat().into()),
        vec(any::<u8>(), 0..1024),
    ]
}

proptest! {
    /// Any split of any body, arbitrary bytes included, finds what the whole body does, and
    /// nothing panics.
    #[test]
    fn any_split_of_any_bytes(body in body(), cuts in vec(any::<prop::sample::Index>(), 0..8)) {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
        cuts.sort_unstable();
        for usage in [BodyUsage::json(TOTAL).unwrap(), BodyUsage::sse(TOTAL).unwrap()] {
            let (mut whole, mut split, mut at) = (usage.scan(), usage.scan(), 0);
            whole.feed(&body);
            for cut in cuts.iter().copied().chain([body.len()]) {
                split.feed(&body[at..cut]);
                at = cut;
            }
            prop_assert_eq!(whole.found(), split.found());
        }
    }

    /// A document serde_json writes, with `usage.total_tokens` or not, random fields and
    /// strings with quotes, backslashes, control characters and non-ASCII.
    #[test]
    fn agrees_with_serde_json(value in doc(), pretty in any::<bool>()) {
        prop_assert_eq!(json(&to_text(&value, pretty)), oracle(&value));
        // The document as a string inside another holds no usage.
        let quoted = serde_json::to_string(&Value::String(to_text(&value, pretty))).unwrap();
        prop_assert_eq!(json(&format!(r#"{{"prompt":{quoted}}}"#)), None);
        prop_assert_eq!(sse(&format!("data: {quoted}\n\n")), None);
    }

    #[test]
    fn the_last_event_with_a_value_wins((body, last) in stream()) {
        prop_assert_eq!(sse(&body), last);
    }
}
