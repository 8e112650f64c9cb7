use super::*;

#[test]
fn a_histogram_renders_cumulative_buckets_sum_and_count() {
    static BOUNDS: &[f64] = &[0.001, 0.01, 1.0];
    let r = Recorder::new(&[("x_seconds", BOUNDS)]).expect("non-empty buckets");
    let h = r.histogram("x_seconds", "Time.", Unit::Seconds, &[]);
    // On a bound counts in that bucket (`le`); past the last goes to +Inf.
    for v in [0.0005, 0.001, 0.002, 0.5, 2.0, 2.0] {
        h.record(v);
    }
    assert_eq!(
        r.render(),
        "# HELP x_seconds Time.\n# TYPE x_seconds histogram\n\
         x_seconds_bucket{le=\"0.001\"} 2\n\
         x_seconds_bucket{le=\"0.01\"} 3\n\
         x_seconds_bucket{le=\"1\"} 4\n\
         x_seconds_bucket{le=\"+Inf\"} 6\n\
         x_seconds_sum 4.5035\n\
         x_seconds_count 6\n\n"
    );
}

#[test]
fn registered_series_render_at_zero_before_any_event() {
    static BOUNDS: &[f64] = &[0.5];
    let r = Recorder::new(&[("y", BOUNDS)]).expect("non-empty buckets");
    let _h = r.histogram("y", "Help.", Unit::Seconds, &[("a", "b")]);
    assert_eq!(
        r.render(),
        "# HELP y Help.\n# TYPE y histogram\n\
         y_bucket{a=\"b\",le=\"0.5\"} 0\ny_bucket{a=\"b\",le=\"+Inf\"} 0\n\
         y_sum{a=\"b\"} 0\ny_count{a=\"b\"} 0\n\n"
    );
    let r = Recorder::default();
    let _c = r.counter("z_total", "Zs.", &[("reason", "x")]);
    assert_eq!(
        r.render(),
        "# HELP z_total Zs.\n# TYPE z_total counter\nz_total{reason=\"x\"} 0\n\n"
    );
}

#[test]
fn two_recorders_keep_their_own_series() {
    let (a, b) = (Recorder::default(), Recorder::default());
    a.counter("n_total", "N.", &[]).increment(2);
    b.counter("n_total", "N.", &[]).increment(5);
    // Registering again finds the same series.
    a.counter("n_total", "N.", &[]).increment(1);
    assert!(a.render().contains("\nn_total 3\n"), "{}", a.render());
    assert!(b.render().contains("\nn_total 5\n"), "{}", b.render());
}

#[test]
fn gauges_print_integers_plainly_and_label_values_escaped() {
    let r = Recorder::default();
    r.gauge("g", "A gauge.", &[("pod", "a\"b\\c\nd")])
        .set(1073741824.0);
    r.gauge("g", "A gauge.", &[("pod", "half")]).set(0.5);
    let page = r.render();
    assert!(
        page.starts_with("# HELP g A gauge.\n# TYPE g gauge\n"),
        "{page}"
    );
    assert!(
        page.contains("g{pod=\"a\\\"b\\\\c\\nd\"} 1073741824\n"),
        "{page}"
    );
    assert!(page.contains("g{pod=\"half\"} 0.5\n"), "{page}");
}

#[test]
fn empty_buckets_are_refused_with_the_name() {
    let error = Recorder::new(&[("w", &[])]).expect_err("empty buckets");
    assert!(error.to_string().starts_with("histogram w: "), "{error}");
}
