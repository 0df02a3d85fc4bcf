//! The one retry backoff of nodekeeper: exponential, capped, with one jitter rule — each delay is
//! uniform in `[d/2, d]`, where `d = min(base × 2^(attempt−1), max)` (the "equal jitter" of AWS's
//! backoff note: never less than half the nominal delay, so a crowd of agents spreads out without
//! hammering a recovering server). Used by the metadata sources, the reporter, drains' eviction
//! retries, the HTTP providers and notifications.

use std::time::Duration;

use rand::Rng;

/// The delay before retry `attempt` (1-based; 0 is taken as 1).
pub fn delay(base: Duration, max: Duration, attempt: u32) -> Duration {
    delay_with(&mut rand::rng(), base, max, attempt)
}

/// [`delay`] drawing its jitter from `rng` (a seeded one in tests).
pub fn delay_with<R: Rng + ?Sized>(
    rng: &mut R,
    base: Duration,
    max: Duration,
    attempt: u32,
) -> Duration {
    jitter(rng, nominal(base, max, attempt))
}

/// The delay before jitter: `min(base × 2^(attempt−1), max)` (`attempt` 0 is taken as 1; the
/// exponent stops growing at 20; a `max` below `base` is taken as `base`).
pub fn nominal(base: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.max(1).saturating_sub(1).min(20));
    exp.min(max.max(base))
}

/// Uniform in `[d/2, d]`.
fn jitter<R: Rng + ?Sized>(rng: &mut R, d: Duration) -> Duration {
    let lo = d / 2;
    let span = u64::try_from((d - lo).as_micros()).unwrap_or(u64::MAX);
    lo + Duration::from_micros(rng.random_range(0..=span))
}

/// A backoff that remembers its attempt: [`delay`] of 1, 2, 3, … until [`Backoff::reset`].
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `base`, capped at `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            attempt: 0,
        }
    }
    /// The starting delay.
    pub fn base(&self) -> Duration {
        self.base
    }
    /// The next delay (the following one doubles, up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        delay(self.base, self.max, self.attempt)
    }
    /// Back to `base` after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn doubles_within_half_to_full_and_caps() {
        for _ in 0..200 {
            let b1 = delay(MS(100), MS(10_000), 1);
            assert!(b1 >= MS(50) && b1 <= MS(100), "{b1:?}");
            let b4 = delay(MS(100), MS(10_000), 4);
            assert!(b4 >= MS(400) && b4 <= MS(800), "{b4:?}");
            let capped = delay(MS(100), MS(10_000), 40);
            assert!(capped >= MS(5_000) && capped <= MS(10_000), "{capped:?}");
            assert!(
                delay(MS(100), MS(10_000), 0) <= MS(100),
                "0 counts as the first"
            );
        }
    }

    #[test]
    fn the_jitter_spreads() {
        let v: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| delay(MS(1_000), MS(1_000), 1)).collect();
        assert!(v.len() > 10, "{} distinct delays of 50", v.len());
    }

    #[test]
    fn nominal_is_base_times_two_to_the_n_minus_one_capped() {
        let (base, max) = (MS(100), MS(3_000));
        let want = [100, 100, 200, 400, 800, 1_600, 3_000, 3_000];
        for (attempt, w) in want.iter().enumerate() {
            assert_eq!(
                nominal(base, max, attempt as u32),
                MS(*w),
                "attempt {attempt}"
            );
        }
        // the exponent stops at 20 (no overflow for huge attempt numbers)
        assert_eq!(nominal(MS(1), Duration::MAX, 21), MS(1 << 20));
        assert_eq!(nominal(MS(1), Duration::MAX, u32::MAX), MS(1 << 20));
        // a cap below the base is the base
        assert_eq!(nominal(MS(500), MS(100), 3), MS(500));
    }

    /// Seeded: every delay lies in `[d/2, d]` of its nominal `d`, both ends are reached (at
    /// microsecond resolution the span of 50 ms is hit near both ends over 2,000 draws), and
    /// one seed gives one sequence.
    #[test]
    fn seeded_jitter_is_within_half_to_full_and_reproducible() {
        use rand::SeedableRng;
        let (base, max) = (MS(100), MS(1_000));
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for attempt in 1..=6u32 {
            let d = nominal(base, max, attempt);
            let draws: Vec<Duration> = (0..2_000)
                .map(|_| delay_with(&mut rng, base, max, attempt))
                .collect();
            let (lo, hi) = (*draws.iter().min().unwrap(), *draws.iter().max().unwrap());
            assert!(lo >= d / 2 && hi <= d, "attempt {attempt}: {lo:?}..{hi:?}");
            assert!(lo < d / 2 + d / 100, "attempt {attempt}: min {lo:?}");
            assert!(hi > d - d / 100, "attempt {attempt}: max {hi:?}");
        }
        let seq = |seed| {
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            (1..=8)
                .map(|a| delay_with(&mut r, base, max, a))
                .collect::<Vec<_>>()
        };
        assert_eq!(seq(42), seq(42));
        assert_ne!(seq(42), seq(43));
        // a zero delay stays zero
        assert_eq!(
            delay_with(&mut rng, Duration::ZERO, Duration::ZERO, 3),
            Duration::ZERO
        );
    }

    #[test]
    fn a_backoff_counts_attempts_and_resets() {
        let mut b = Backoff::new(MS(100), MS(400));
        assert!(b.next_delay() <= MS(100));
        let d2 = b.next_delay();
        assert!(d2 >= MS(100) && d2 <= MS(200), "{d2:?}");
        for _ in 0..5 {
            assert!(b.next_delay() <= MS(400));
        }
        b.reset();
        assert!(b.next_delay() <= MS(100));
        assert_eq!(b.base(), MS(100));
    }
}
