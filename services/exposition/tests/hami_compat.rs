//! The page is what HAMi's monitor (and the Go KAI monitor) serve: the same
//! units, the same label sets, `zone="vGPU"` on every HAMi series, and the
//! queries of HAMi's published vGPU dashboard find what they select.

use std::collections::BTreeMap;

use kai_exposition::{HostDevices, NodeView, Options, render, render_page};
use kai_proto::v1::{ContainerUsage, DeviceUsage, HostDevice};

fn host() -> HostDevice {
    HostDevice {
        index: 0,
        uuid: "GPU-aaaa".into(),
        name: "A100".into(),
        memory_total_bytes: 80 << 30,
        memory_used_bytes: 5_000,
        gpu_utilization_percent: Some(40),
        memory_utilization_percent: Some(3),
    }
}

fn container() -> ContainerUsage {
    ContainerUsage {
        namespace: "ml".into(),
        pod: "train-0".into(),
        container: "main".into(),
        node: "gpu-1".into(),
        last_kernel_time: 900,
        devices: vec![DeviceUsage {
            index: 0,
            uuid: "GPU-aaaa".into(),
            limit_bytes: 4_000,
            used_bytes: 3_000,
            context_bytes: 1_000,
            module_bytes: 200,
            buffer_bytes: 1_500,
            sm_util_percent: 37,
            ..DeviceUsage::default()
        }],
        ..ContainerUsage::default()
    }
}

fn page(node_label: bool, legacy: bool) -> String {
    let (devices, containers) = ([host()], [container()]);
    let mut out = String::new();
    render(
        &mut out,
        [HostDevices {
            node: "gpu-1",
            devices: &devices,
        }],
        &containers,
        Options {
            node_label,
            legacy,
            now_secs: 1_000,
        },
    );
    out
}

#[test]
fn utilization_is_percent_and_every_series_is_zoned() {
    let node = page(false, false);
    for line in [
        "hami_host_gpu_memory_used_bytes{device_index=\"0\",device_uuid=\"GPU-aaaa\",device_type=\"NVIDIA-A100\",zone=\"vGPU\"} 5000\n",
        "hami_host_gpu_utilization_ratio{device_index=\"0\",device_uuid=\"GPU-aaaa\",device_type=\"NVIDIA-A100\",zone=\"vGPU\"} 40\n",
        "hami_container_device_utilization_ratio{namespace=\"ml\",pod=\"train-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-aaaa\",zone=\"vGPU\"} 37\n",
        "hami_vgpu_memory_used_bytes{namespace=\"ml\",pod=\"train-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-aaaa\",zone=\"vGPU\"} 3000\n",
        "hami_container_last_kernel_elapsed_seconds{namespace=\"ml\",pod=\"train-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-aaaa\",zone=\"vGPU\"} 100\n",
    ] {
        assert!(node.contains(line), "missing {line}in\n{node}");
    }
    let aggregated = page(true, false);
    assert!(aggregated.contains(
        "hami_container_device_utilization_ratio{namespace=\"ml\",pod=\"train-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-aaaa\",node=\"gpu-1\",zone=\"vGPU\"} 37\n"
    ));
    for (text, node_label) in [(page(false, true), false), (page(true, true), true)] {
        let samples = samples(&text);
        assert!(samples.len() >= 17, "{}", samples.len());
        for s in &samples {
            assert_eq!(
                s.labels.get("zone").map(String::as_str),
                Some("vGPU"),
                "{s:?}"
            );
            assert_eq!(s.labels.contains_key("node"), node_label, "{s:?}");
        }
    }
}

#[test]
fn breakdown_offset_is_what_the_parts_leave_of_the_total() {
    let text = page(false, true);
    // 3000 used - 1000 context - 200 module - 1500 buffer.
    assert!(text.contains(
        "hami_container_device_memory_bytes{namespace=\"ml\",pod=\"train-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-aaaa\",context_size=\"1000\",module_size=\"200\",buffer_size=\"1500\",offset=\"300\",zone=\"vGPU\"} 3000\n"
    ), "{text}");
    assert!(text.contains(
        "Device_memory_desc_of_container{podnamespace=\"ml\",podname=\"train-0\",ctrname=\"main\",vdeviceid=\"0\",deviceuuid=\"GPU-aaaa\",context=\"1000\",module=\"200\",data=\"1500\",offset=\"300\",zone=\"vGPU\"} 3000\n"
    ), "{text}");

    // Parts larger than the total (a region caught mid-update) are no size:
    // 0, never Go's unsigned wrap-around.
    let mut c = container();
    c.devices[0].buffer_bytes = 2_500;
    let mut out = String::new();
    render(&mut out, [], [&c], Options::default());
    assert!(
        out.contains("buffer_size=\"2500\",offset=\"0\",zone=\"vGPU\"} 3000\n"),
        "{out}"
    );
}

/// HAMi's used is every slot's charge (its monitor sums all of
/// `procs[:procnum]`): what a killed process left, which libvgpu still
/// counts against the cap, is in it, as in the breakdown's total; the
/// agent's own series keep it apart.
#[test]
fn used_counts_the_charge_of_dead_processes_as_hami_does() {
    let mut c = container();
    c.devices[0].stale_bytes = 1_000;
    let mut out = String::new();
    render(&mut out, [], [&c], Options::default());
    assert!(
        out.contains("hami_vgpu_memory_used_bytes{namespace=\"ml\",pod=\"train-0\",container=\"main\",vdevice_index=\"0\",device_uuid=\"GPU-aaaa\",zone=\"vGPU\"} 4000\n"),
        "{out}"
    );
    assert!(
        out.contains("offset=\"1300\",zone=\"vGPU\"} 4000\n"),
        "{out}"
    );
}

/// One sample of a page.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
}

/// The samples of a Prometheus text page (label values unescaped).
fn samples(page: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let open = line.find('{').expect("every sample has labels");
        let name = line[..open].to_owned();
        let mut labels = BTreeMap::new();
        let mut rest = &line[open + 1..];
        while !rest.starts_with('}') {
            let eq = rest.find("=\"").expect("label=\"value\"");
            let key = rest[..eq].to_owned();
            let mut value = String::new();
            let mut chars = rest[eq + 2..].char_indices();
            let end = loop {
                match chars.next().expect("closed value") {
                    (i, '"') => break eq + 2 + i + 1,
                    (_, '\\') => match chars.next().expect("escaped char").1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    (_, ch) => value.push(ch),
                }
            };
            labels.insert(key, value);
            rest = rest[end..].trim_start_matches(',');
        }
        out.push(Sample { name, labels });
    }
    out
}

/// A vector selector of a query: metric name and label matchers.
#[derive(Debug)]
struct Selector {
    name: String,
    /// (label, operator, value).
    matchers: Vec<(String, String, String)>,
}

/// What a dashboard query needs of the series it selects.
#[derive(Debug, Default)]
struct Query {
    selectors: Vec<Selector>,
    /// Labels of `by (…)`, `on (…)` and `label_values(…, label)`.
    grouping: Vec<String>,
    /// Whether the result is aggregated `by` labels (the legend then names those).
    aggregated_by: bool,
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Num,
    Punct(char),
    Op(String),
}

fn tokens(expr: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':'))
            {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Num);
        } else if ch == '"' {
            let start = i + 1;
            i += 1;
            while chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push(Token::Str(chars[start..i].iter().collect()));
            i += 1;
        } else if matches!(ch, '=' | '!') {
            let op: String = if chars.get(i + 1).is_some_and(|c| matches!(c, '~' | '=')) {
                chars[i..i + 2].iter().collect()
            } else {
                ch.to_string()
            };
            i += op.len();
            out.push(Token::Op(op));
        } else {
            out.push(Token::Punct(ch));
            i += 1;
        }
    }
    out
}

const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

const AGGREGATIONS: &[&str] = &[
    "sum", "count", "avg", "min", "max", "topk", "bottomk", "group",
];

fn parse(expr: &str) -> Query {
    let toks = tokens(expr);
    let mut q = Query::default();
    let mut i = 0;
    let label_list = |i: &mut usize, into: &mut Vec<String>| {
        assert_eq!(toks[*i], Token::Punct('('), "{expr}");
        *i += 1;
        while toks[*i] != Token::Punct(')') {
            if let Token::Ident(l) = &toks[*i] {
                into.push(l.clone());
            }
            *i += 1;
        }
        *i += 1;
    };
    while i < toks.len() {
        match &toks[i] {
            Token::Ident(word) if matches!(word.as_str(), "by" | "on") => {
                q.aggregated_by |= word == "by";
                i += 1;
                label_list(&mut i, &mut q.grouping);
            }
            Token::Ident(word) if KEYWORDS.contains(&word.as_str()) => i += 1,
            // An aggregation written `sum by (…) (…)`: its clause comes next.
            Token::Ident(word)
                if AGGREGATIONS.contains(&word.as_str())
                    && matches!(toks.get(i + 1), Some(Token::Ident(k)) if k == "by" || k == "without") =>
            {
                i += 1;
            }
            Token::Ident(word) if toks.get(i + 1) == Some(&Token::Punct('(')) => {
                // A function or aggregation; label_values' second argument is a label.
                if word == "label_values"
                    && let (
                        Some(Token::Ident(metric)),
                        Some(Token::Punct(',')),
                        Some(Token::Ident(label)),
                    ) = (toks.get(i + 2), toks.get(i + 3), toks.get(i + 4))
                {
                    q.selectors.push(Selector {
                        name: metric.clone(),
                        matchers: Vec::new(),
                    });
                    q.grouping.push(label.clone());
                    i += 6;
                    continue;
                }
                i += 2;
            }
            Token::Ident(name) => {
                let mut sel = Selector {
                    name: name.clone(),
                    matchers: Vec::new(),
                };
                i += 1;
                if toks.get(i) == Some(&Token::Punct('{')) {
                    i += 1;
                    while toks[i] != Token::Punct('}') {
                        match (&toks[i], &toks[i + 1], &toks[i + 2]) {
                            (Token::Ident(l), Token::Op(op), Token::Str(v)) => {
                                sel.matchers.push((l.clone(), op.clone(), v.clone()));
                                i += 3;
                            }
                            (Token::Punct(','), _, _) => i += 1,
                            other => panic!("unexpected matcher {other:?} in {expr}"),
                        }
                    }
                    i += 1;
                }
                q.selectors.push(sel);
            }
            _ => i += 1,
        }
    }
    q
}

/// Series of HAMi's scheduler (allocation per node and GPU): KAI-Scheduler
/// schedules here, so nothing of ours exports them; panels built on them stay
/// empty unless HAMi's scheduler runs too (docs/migration.md).
const SCHEDULER_SERIES: &[&str] = &[
    "hami_gpu_memory_limit_bytes",
    "hami_gpu_memory_allocated_bytes",
    "hami_gpu_shared_count",
    "hami_node_gpu_memory_allocated_ratio",
    "hami_gpu_core_allocated_ratio",
];

fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}").map(|(l, _)| l.trim().to_owned()))
        .collect()
}

#[test]
fn hami_dashboard_queries_find_our_series() {
    let fixture = include_str!("fixtures/hami-vgpu-dashboard-exprs.tsv");
    let queries: Vec<(&str, &str)> = fixture
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split_once('\t').expect("query<TAB>legend"))
        .collect();
    assert_eq!(queries.len(), 19, "every query of the dashboard");
    let mut monitor_selectors = 0;
    for (view, text) in [
        ("node agent", page(false, false)),
        ("aggregator", page(true, false)),
    ] {
        let samples = samples(&text);
        for (expr, legend) in &queries {
            let q = parse(expr);
            assert!(!q.selectors.is_empty(), "no selector parsed from {expr}");
            for sel in &q.selectors {
                let ours: Vec<&Sample> = samples.iter().filter(|s| s.name == sel.name).collect();
                if SCHEDULER_SERIES.contains(&sel.name.as_str()) {
                    assert!(
                        ours.is_empty(),
                        "{} is ours now: check its labels",
                        sel.name
                    );
                    continue;
                }
                monitor_selectors += 1;
                assert!(!ours.is_empty(), "{view}: no {} for `{expr}`", sel.name);
                let mut needed: Vec<String> = q.grouping.clone();
                if !q.aggregated_by {
                    needed.extend(legend_labels(legend));
                }
                let satisfied = ours.iter().any(|s| {
                    sel.matchers.iter().all(|(label, op, value)| {
                        let have = s.labels.get(label);
                        match (op.as_str(), value.starts_with('$')) {
                            // A dashboard variable: its values come from this label.
                            ("=~" | "=", true) => have.is_some_and(|v| !v.is_empty()),
                            ("=", false) => have == Some(value),
                            ("!=", false) => have != Some(value),
                            other => panic!("matcher {other:?} of `{expr}` not understood"),
                        }
                    }) && needed.iter().all(|l| s.labels.contains_key(l))
                });
                assert!(
                    satisfied,
                    "{view}: no {} series has {:?} and labels {needed:?} for `{expr}`; ours: {:?}",
                    sel.name, sel.matchers, ours[0].labels
                );
            }
        }
    }
    // Host memory and utilization, and the five per-container queries
    // (two selectors in the used-% query), and the namespace variable, twice.
    assert_eq!(monitor_selectors, 2 * 9);
}

#[test]
fn the_query_parser_reads_selectors_matchers_and_grouping() {
    let q = parse(r#"sum by (node) (a{x=~"$x", y="1"}) and on (d) b"#);
    assert_eq!(q.selectors.len(), 2);
    assert_eq!(q.selectors[0].name, "a");
    assert_eq!(
        q.selectors[0].matchers,
        [
            ("x".to_owned(), "=~".to_owned(), "$x".to_owned()),
            ("y".to_owned(), "=".to_owned(), "1".to_owned())
        ]
    );
    assert_eq!(q.selectors[1].name, "b");
    assert_eq!(q.grouping, ["node", "d"]);
    assert!(q.aggregated_by);
    let q = parse("label_values(m, namespace)");
    assert_eq!(
        (q.selectors[0].name.as_str(), q.grouping.as_slice()),
        ("m", &["namespace".to_owned()][..])
    );
    assert_eq!(
        legend_labels("used {{namespace}}/{{pod}} v{{vdevice_index}}"),
        ["namespace", "pod", "vdevice_index"]
    );
}

/// The streamed page (what the aggregator serves) carries the same labels.
#[test]
fn streamed_page_is_zoned_too() {
    let (devices, containers) = ([host()], [container()]);
    let mut text = String::new();
    render_page(
        &mut text,
        &[NodeView {
            node: "gpu-1",
            devices: &devices,
            containers: &containers,
            escaped: &[],
            checks: None,
        }],
        Options {
            node_label: true,
            legacy: false,
            now_secs: 1_000,
        },
    );
    let all = samples(&text);
    let hami: Vec<&Sample> = all.iter().filter(|s| s.name.starts_with("hami_")).collect();
    assert_eq!(hami.len(), 10);
    assert!(
        hami.iter()
            .all(|s| s.labels.get("zone").map(String::as_str) == Some("vGPU"))
    );
    assert!(
        all.iter()
            .filter(|s| s.name.starts_with("kai_isolator_"))
            .all(|s| !s.labels.contains_key("zone")),
        "our own families are not HAMi's"
    );
}
