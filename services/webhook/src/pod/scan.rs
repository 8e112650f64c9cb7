//! A fast path for reading the lists kept raw: arrays of objects whose
//! wanted members are plain strings.
//!
//! Reading the target's `env`, `volumeMounts` and the pod's `volumes` again
//! with serde_json cost about twice as much per byte as skipping them in
//! the first pass (visitor calls, `Option` and key handling per member):
//! for a one-container pod, a fifth of the review. Almost every list has
//! one shape: an array of objects with plain keys, whose wanted members are
//! strings without escapes (or `null`). This reader handles that shape
//! only and gives `None` for anything else; the caller then decodes with
//! serde_json as before, so neither results nor errors change.
//!
//! The text is a raw value the first pass checked; it is read with the
//! strict [`Reader`] all the same (a list kept by serde_json's first pass
//! was checked less strictly, and strictness costs little here).

use crate::json::read::Reader;

/// A member's value as read: `None` when absent, `Some(None)` for `null`.
pub type Member<'a> = Option<Option<&'a str>>;

/// Calls `each` with the members named `keys` of every object of the array
/// `text`, in order. As in the serde decoding, the last of repeated keys
/// wins. `None` (after some calls, maybe) when `text` has another shape.
pub fn objects<'a, const K: usize>(
    text: &'a str,
    keys: [&str; K],
    mut each: impl FnMut([Member<'a>; K]),
) -> Option<()> {
    objects_and_presence(text, keys, [], |members, []| each(members))
}

/// [`objects`], also telling for each of `present` whether the object has
/// that member with a value other than `null` (of any type; not read).
pub fn objects_and_presence<'a, const K: usize, const P: usize>(
    text: &'a str,
    keys: [&str; K],
    present: [&str; P],
    mut each: impl FnMut([Member<'a>; K], [bool; P]),
) -> Option<()> {
    let mut r = Reader::new(text);
    r.array(|r| {
        let mut members = [None; K];
        let mut found = [false; P];
        r.object(|r, key| {
            if let Some(k) = keys.iter().position(|k| *k == key) {
                members[k] = Some(r.nullable(Reader::plain_str)?);
            } else if let Some(p) = present.iter().position(|p| *p == key) {
                found[p] = !r.null();
                if found[p] {
                    r.skip()?;
                }
            } else {
                r.skip()?;
            }
            Some(())
        })?;
        each(members, found);
        Some(())
    })?;
    r.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Option<Vec<[Member<'_>; 2]>> {
        let mut out = Vec::new();
        objects(text, ["name", "path"], |m| out.push(m))?;
        Some(out)
    }

    #[test]
    fn reads_the_common_shape() {
        assert_eq!(names("[]"), Some(vec![]));
        assert_eq!(names(" [ ] "), Some(vec![]));
        assert_eq!(
            names(
                r#"[{"name":"a","x":{"y":["}",{"z":"\"]"}]},"path":null},{},
                   {"v": -1.5e3, "name": "b", "t": true, "name": "c"}]"#
            ),
            Some(vec![
                [Some(Some("a")), Some(None)],
                [None, None],
                [Some(Some("c")), None]
            ])
        );
        assert_eq!(
            names(r#"[{"q":"a\\","name":"\u00e9"}]"#),
            None,
            "escaped value"
        );
        assert_eq!(
            names(r#"[{"q":"a\\","n\u0061me":"x"}]"#),
            None,
            "escaped key"
        );
    }

    #[test]
    fn tells_which_members_are_present() {
        let mut out = Vec::new();
        let text = r#"[{"name":"A","valueFrom":{"x":[1]}},{"valueFrom":null,"name":"B"},
                       {"name":"C","valueFrom":{},"valueFrom":null},{"name":"D","valueFrom":5}]"#;
        objects_and_presence(text, ["name"], ["valueFrom"], |[name], [from]| {
            out.push((name.flatten(), from));
        })
        .expect("common shape");
        assert_eq!(
            out,
            [
                (Some("A"), true),
                (Some("B"), false),
                (Some("C"), false),
                (Some("D"), true)
            ]
        );
    }

    #[test]
    fn leaves_other_shapes_to_serde() {
        for text in [
            "{}",
            "[null]",
            "[[]]",
            r#"["name"]"#,
            r#"[{"name":1}]"#,
            r#"[{"name":{}}]"#,
            r#"[{"name":"a"}"#,
            r#"[{"name":"a"}] x"#,
        ] {
            assert_eq!(names(text), None, "{text}");
        }
    }
}
