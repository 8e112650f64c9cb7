//! Paths compared as the runtime sees them: cleaned, segment by segment.
//!
//! The API server refuses only a `mountPath` repeated letter for letter,
//! and the runtime cleans each destination, so `/usr/local//vgpu/.` is
//! `<mount>` to it, and must be to us.

/// The first of `ours` (cleaned) that `path`, once cleaned, is at or under:
/// segment by segment, so `/usr/local/vgpu2` is not under `/usr/local/vgpu`.
pub fn covering<'a>(path: &str, ours: &'a [String]) -> Option<&'a str> {
    let path = clean(path);
    ours.iter().map(String::as_str).find(|root| {
        path.strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// `path` as Go's `path.Clean` makes it, rooted: one `/` between segments,
/// no `.`, each `..` taking back the segment before it, no trailing `/`.
pub fn clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    format!("/{}", segments.join("/"))
}
