use super::*;

#[test]
fn a_histogram_renders_cumulative_buckets_sum_and_count() {
    static BOUNDS: &[f64] = &[0.001, 0.01, 1.0];
    let h = Histogram::new(BOUNDS);
    // On a bound counts in that bucket (`le`); past the last goes to +Inf.
    for v in [0.0005, 0.001, 0.002, 0.5, 2.0, 2.0] {
        h.observe(v);
    }
    let mut out = String::new();
    h.render("x_seconds", "Time.", &mut out);
    assert_eq!(
        out,
        "# HELP x_seconds Time.\n# TYPE x_seconds histogram\n\
         x_seconds_bucket{le=\"0.001\"} 2\n\
         x_seconds_bucket{le=\"0.01\"} 3\n\
         x_seconds_bucket{le=\"1\"} 4\n\
         x_seconds_bucket{le=\"+Inf\"} 6\n\
         x_seconds_sum 4.5035\n\
         x_seconds_count 6\n"
    );
    assert_eq!(h.count(), 6);
}

#[test]
fn an_empty_histogram_still_renders_every_series() {
    static BOUNDS: &[f64] = &[0.5];
    let mut out = String::new();
    Histogram::new(BOUNDS).render("y", "Help.", &mut out);
    assert!(out.contains("y_bucket{le=\"0.5\"} 0\ny_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n"));
}

#[test]
fn concurrent_observations_are_all_counted_and_summed() {
    static BOUNDS: &[f64] = &[1.0];
    let h = Histogram::new(BOUNDS);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10_000 {
                    h.observe(0.5);
                }
            });
        }
    });
    assert_eq!(h.count(), 40_000);
    // 0.5 and every partial sum up to 20000 are exact in f64.
    assert_eq!(h.sum(), 20_000.0);
}

#[test]
fn counters_list_every_value_from_the_start_and_count_only_listed_ones() {
    static VALUES: &[&str] = &["ok", "bad"];
    let c = Counters::new("result", VALUES);
    c.inc_at(1);
    c.inc("bad");
    c.inc("ok");
    c.inc("unlisted");
    c.inc_at(7);
    assert_eq!((c.get("ok"), c.get("bad"), c.get("unlisted")), (1, 2, 0));
    let mut out = String::new();
    c.render("r_total", "Results.", &mut out);
    assert_eq!(
        out,
        "# HELP r_total Results.\n# TYPE r_total counter\nr_total{result=\"ok\"} 1\nr_total{result=\"bad\"} 2\n"
    );
}

#[test]
fn a_counter_renders_its_one_sample() {
    let c = Counter::new();
    c.add(41);
    c.inc();
    let mut out = String::new();
    c.render("n_total", "N.", &mut out);
    assert_eq!(
        out,
        "# HELP n_total N.\n# TYPE n_total counter\nn_total 42\n"
    );
}
