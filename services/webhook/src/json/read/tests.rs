use proptest::prelude::*;
use serde::de::IgnoredAny;

use super::*;

/// Skips one whole document.
fn accepts(text: &str) -> bool {
    let mut r = Reader::new(text);
    r.skip().is_some() && r.end().is_some()
}

fn serde_accepts(text: &str) -> bool {
    serde_json::from_str::<IgnoredAny>(text).is_ok()
}

#[test]
fn accepts_json() {
    for text in [
        "0",
        "-0",
        "1.5e3",
        "-12.25E-2",
        "1e+9",
        " true ",
        "false",
        "null",
        r#""""#,
        r#""a\"b\\c\/d\b\f\n\r\t\u00e9\uD83D\uDE00""#,
        "[]",
        "[1, [2, {}], \"x\"]",
        "{}",
        r#"{"a": {"b": [null, true]}, "c": "é"}"#,
        "\t\r\n{ \"a\" : 1 }\n",
    ] {
        assert!(accepts(text), "{text}");
        assert!(serde_accepts(text), "{text}");
    }
}

#[test]
fn refuses_what_serde_json_refuses() {
    for text in [
        "",
        " ",
        "01",
        "1.",
        ".5",
        "-",
        "1e",
        "1e+",
        "+1",
        "tru",
        "nul",
        "truex",
        r#""abc"#,
        "\"a\u{1}b\"",
        "\"tab\there\"",
        r#""\x""#,
        r#""\u12g4""#,
        "[1,]",
        "[1 2]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        r#"{a:1}"#,
        r#"{"a":1}}"#,
        "[",
        "{}{}",
        "{} x",
    ] {
        assert!(!accepts(text), "accepted {text:?}");
        assert!(!serde_accepts(text), "serde_json accepts {text:?}");
    }
}

#[test]
fn nesting_is_bounded() {
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(accepts(&nested(MAX_DEPTH as usize)));
    assert!(!accepts(&nested(MAX_DEPTH as usize + 1)));
    // Far deeper: left to serde_json, not a stack overflow here.
    assert!(!accepts(&nested(100_000)));
}

#[test]
fn unescapes_as_serde_json_does() {
    for text in [
        r#""plain""#,
        r#""q\"b\\s\/b\bf\fn\nr\rt\t""#,
        r#""\u0000\u001f\u00e9\u20ac""#,
        r#""pair \uD83D\uDE00 end""#,
        r#""é and \u00e9""#,
    ] {
        let ours = Reader::new(text).str().map(Cow::into_owned);
        let serde: String = serde_json::from_str(text).expect("valid");
        assert_eq!(ours.as_deref(), Some(&*serde), "{text}");
    }
    // Lone surrogates are serde_json's to judge.
    for text in [
        r#""\uD83D""#,
        r#""\uDE00""#,
        r#""\uD83Dx""#,
        r#""\uD83D\u0041""#,
    ] {
        assert_eq!(Reader::new(text).str(), None, "{text}");
    }
}

#[test]
fn strings_without_escapes_are_borrowed() {
    assert!(matches!(
        Reader::new(r#""abc""#).str(),
        Some(Cow::Borrowed("abc"))
    ));
    assert!(matches!(
        Reader::new(r#""a\nc""#).str(),
        Some(Cow::Owned(_))
    ));
    assert_eq!(Reader::new(r#""a\nc""#).plain_str(), None);
}

#[test]
fn raw_is_the_value_text() {
    let mut r = Reader::new(r#"{"a": [1, {"b": "}"}] , "c": 2}"#);
    let mut raws = Vec::new();
    r.object(|r, key| {
        raws.push((key, r.raw()?));
        Some(())
    })
    .expect("object");
    assert_eq!(raws, [("a", r#"[1, {"b": "}"}]"#), ("c", "2")]);
}

#[test]
fn finds_string_ends_anywhere() {
    for len in 0..20 {
        for at in 0..len {
            for end in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                let mut bytes = vec![b'a'; len];
                bytes[at] = end;
                if at + 1 < len {
                    bytes[at + 1] = b'"';
                }
                assert_eq!(special(&bytes), Some(at), "{len} {at} {end}");
            }
        }
        // Bytes next to ours in value (`!`, `#`, `[`, `]`, space) and high bytes.
        let others: Vec<u8> = b"!#[] \xff\x80a"
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect();
        assert_eq!(special(&others), None, "{len}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// Whatever the reader accepts, serde_json accepts: JSON-like text
    /// from the characters that matter to the grammar.
    #[test]
    fn never_more_lenient_than_serde_json(text in r#"[\[\]{}",:0-9.eE+\- tfrulnasx\\/\t\n]{0,24}"#) {
        if accepts(&text) {
            prop_assert!(serde_accepts(&text), "{:?}", text);
        }
    }

    /// And it accepts what serde_json writes.
    #[test]
    fn reads_what_serde_json_writes(value in json_value()) {
        let text = serde_json::to_string(&value).expect("serialises");
        prop_assert!(accepts(&text), "{}", text);
        let pretty = serde_json::to_string_pretty(&value).expect("serialises");
        prop_assert!(accepts(&pretty), "{}", pretty);
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
