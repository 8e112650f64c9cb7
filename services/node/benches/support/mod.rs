//! Interleaved measurement of our path and its floor, shared by the benches.

use std::time::{Duration, Instant};

/// Runs both `rounds` times, `reps` calls each round, alternating which
/// goes first so neither always runs on a warmer cache; the medians of the
/// per-call times of each.
pub fn interleaved(
    rounds: usize,
    reps: u32,
    ours: &mut impl FnMut(),
    floor: &mut impl FnMut(),
) -> (Duration, Duration) {
    let (mut t_ours, mut t_floor) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for ours_now in [round % 2 == 0, round % 2 != 0] {
            let start = Instant::now();
            for _ in 0..reps {
                if ours_now {
                    ours();
                } else {
                    floor();
                }
            }
            let per_call = start.elapsed() / reps;
            if ours_now {
                t_ours.push(per_call);
            } else {
                t_floor.push(per_call);
            }
        }
    }
    (median(t_ours), median(t_floor))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Prints one job: ours, its floor and the ratio.
pub fn report(job: &str, (ours, floor): (Duration, Duration), floor_is: &str) {
    println!(
        "{job}: ours {ours:.2?}, floor ({floor_is}) {floor:.2?}, ratio {:.2}",
        ours.as_secs_f64() / floor.as_secs_f64()
    );
}
